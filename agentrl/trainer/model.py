"""The policy model side of the trainer: loading, the layer-level speed options, and the token log-probs of a
micro-batch.

:func:`load_causal_lm` loads a HF causal LM (float32 master weights for the policy; the frozen reference model in
the compute dtype). :func:`configure_layers` applies gradient checkpointing to every ``checkpoint_every``-th
decoder layer and ``torch.compile`` per decoder layer. :func:`choose_logprob_impl` picks the log-prob path
(:mod:`agentrl.trainer.logprobs`) after checking that the model's logits really are ``h @ W.T`` of its last hidden
states. :func:`micro_batch_logprobs` runs the decoder on a :class:`~agentrl.trainer.batching.MicroBatch` and returns
padded ``[b, T]`` log-probs (and entropy), at the given temperature, in float32. :class:`ModelRunner` runs those
passes over whole lists of sequences (micro-batch split, FSDP lockstep, no-gradient log-prob fills).

Invariant: whatever the path and layout, the log-probs equal those of the model's own full logits (float32
log-softmax of ``logits / temperature``) up to float rounding; tests hold every path to 1e-5 against that.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from agentrl.trainer.batching import MicroBatch, Seq, collate, pad_rows, scoring_sequences, split_micro, units
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.logprobs import chunked_entropy, full_logprobs, liger_available, liger_logprobs
from agentrl.trainer.logprobs import liger_runnable, torch_logprobs
from agentrl.trainer.prefix_tree import tree_attention_mask, tree_micro_batches
from agentrl.trajectory import Trajectory

log = logging.getLogger(__name__)


def load_causal_lm(path: str | os.PathLike, *, dtype: torch.dtype, device: torch.device,
                   disable_dropout: bool, attn_implementation: str | None = None) -> torch.nn.Module:
    """Loads ``path`` with parameters in ``dtype`` on ``device``, KV cache off (training never uses it, and a
    cache would hide packed sequences from transformers' mask builder); ``attn_implementation`` ``None`` is the
    library's default."""
    from transformers import AutoModelForCausalLM

    kw = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kw)
    model.to(device)
    model.config.use_cache = False
    if disable_dropout:
        _disable_dropout(model)
    return model


def _disable_dropout(model: torch.nn.Module) -> None:
    # Dropout would make the proximal (no-grad) and training forward passes disagree for identical weights.
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "attention_dropout") and isinstance(m.attention_dropout, float):
            m.attention_dropout = 0.0


def has_active_dropout(model: torch.nn.Module) -> bool:
    """True when a training-mode forward is random (a dropout module or attention dropout above 0)."""
    return any(
        (isinstance(m, torch.nn.Dropout) and m.p > 0)
        or (isinstance(getattr(m, "attention_dropout", None), float) and m.attention_dropout > 0)
        for m in model.modules()
    )


def decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The model body that returns ``last_hidden_state`` (``model.model`` for HF causal LMs)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.base_model


def head_is_plain_linear(model: torch.nn.Module, vocab_size: int) -> bool:
    """True when the model's logits are exactly ``last_hidden_state @ output_embeddings.weight.T`` (checked on a
    few tokens), so the chunked paths may compute them from the hidden states."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    device = head.weight.device
    ids = (torch.arange(8, device=device) * 7919 % vocab_size)[None]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits.float()
            hidden = decoder(model)(input_ids=ids, use_cache=False).last_hidden_state
            mine = (hidden @ head.weight.t()).float()
    except Exception as e:  # an architecture whose decoder cannot be called alone
        log.warning("log-probs: cannot compute logits from hidden states (%s); using the full-logits path", e)
        return False
    finally:
        model.train(was_training)
    return bool(torch.allclose(mine, logits, rtol=1e-4, atol=1e-4 * float(logits.abs().max()) + 1e-6))


def choose_logprob_impl(cfg: TrainerConfig, model: torch.nn.Module, vocab_size: int, device: torch.device) -> str:
    """``torch``, ``liger`` or ``full`` for ``cfg.logprob_impl`` (see :class:`TrainerConfig`). Raises
    ``ValueError`` naming ``logprob_impl`` when the requested path cannot run here."""
    want = cfg.logprob_impl
    if want == "full":
        return "full"
    if not head_is_plain_linear(model, vocab_size):
        if want in ("torch", "liger"):
            raise ValueError(f"logprob_impl: {want} needs an LM head that is a plain linear map of the last hidden "
                             "states; this model's is not (softcapping, a logit scale or a bias): use "
                             "logprob_impl: full or auto")
        log.warning("log-probs: this model's LM head is not a plain linear map; using the full-logits path")
        return "full"
    if want == "liger":
        if cfg.loss.entropy_coef > 0:
            raise ValueError("logprob_impl: liger computes no entropy gradient, which loss.entropy_coef > 0 needs: "
                             "use logprob_impl: torch or auto")
        if not liger_runnable(device):
            raise ValueError("logprob_impl: liger needs the liger-kernel package and a CUDA device (or "
                             "TRITON_INTERPRET=1 for Triton's CPU interpreter): install liger-kernel or use "
                             "logprob_impl: torch")
        return "liger"
    if want == "auto" and device.type == "cuda" and cfg.loss.entropy_coef == 0 and liger_available():
        return "liger"
    return "torch"


def configure_layers(model: torch.nn.Module, cfg: TrainerConfig) -> None:
    """Gradient checkpointing of every ``cfg.checkpoint_every``-th decoder layer (when
    ``cfg.gradient_checkpointing``) and ``torch.compile`` of each decoder layer (``cfg.compile_layers``)."""
    layers = getattr(decoder(model), "layers", None)
    if (cfg.compile_layers or (cfg.gradient_checkpointing and cfg.checkpoint_every > 1)) and layers is None:
        raise ValueError("compile_layers / checkpoint_every > 1 need a decoder with a `layers` list; this model "
                         "has none")
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.checkpoint_every > 1:
            for i, layer in enumerate(layers):
                layer.gradient_checkpointing = i % cfg.checkpoint_every == 0
    if cfg.compile_layers:
        # Per layer, not the whole model: one compiled graph serves every layer, and lengths vary per
        # micro-batch (dynamic shapes after the first recompile).
        for layer in layers:
            layer.compile()


def autocast(device: torch.device, compute_dtype: torch.dtype) -> contextlib.AbstractContextManager:
    if compute_dtype == torch.bfloat16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def micro_batch_logprobs(model: torch.nn.Module, mb: MicroBatch, *, impl: str, compute_dtype: torch.dtype,
                         temperature: float, entropy: bool = False,
                         entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Returns ``logp: [b, T]`` of the micro-batch's targets (float32, at ``temperature``) and, if ``entropy``,
    ``entropy: [b, T]`` of the next-token distribution (with gradient only if ``entropy_grad``; on the ``liger``
    path only at loss positions, which is where the metric reads it). ``compute_dtype`` is the autocast dtype of
    the forward; parameters already in a lower precision (a bf16 reference model) project in their own."""
    dev = mb.input_ids.device
    extra = {}
    if mb.tree_end is not None:
        extra["attention_mask"] = tree_attention_mask(model, mb.tree_end, compute_dtype)
    with autocast(dev, compute_dtype):
        if impl == "full":
            logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, **extra).logits
            flat = logits.reshape(-1, logits.shape[-1]).index_select(0, mb.src)
            del logits
            lp, ent = full_logprobs(flat, mb.targets, temperature=temperature, want_entropy=entropy,
                                    entropy_grad=entropy_grad)
        else:
            hidden = decoder(model)(input_ids=mb.input_ids, position_ids=mb.position_ids,
                                    use_cache=False, **extra).last_hidden_state
            h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, mb.src)
            del hidden
            w = model.get_output_embeddings().weight
            dt = w.dtype if w.dtype != torch.float32 else compute_dtype
            if impl == "torch":
                lp, ent = torch_logprobs(h, w, mb.targets, temperature=temperature, compute_dtype=dt,
                                         want_entropy=entropy, entropy_grad=entropy_grad)
            else:
                lp = liger_logprobs(h, w, mb.targets, temperature=temperature)
                ent = None
                if entropy:  # a metric only: choose_logprob_impl never picks liger for an entropy bonus
                    sel = mb.mask[mb.rows, mb.cols] > 0
                    ent = torch.zeros_like(lp)
                    ent[sel] = chunked_entropy(h.detach()[sel], w, temperature=temperature, compute_dtype=dt)
    return mb.scatter(lp), (None if ent is None else mb.scatter(ent))


def select_device(config: TrainerConfig) -> torch.device:
    """The trainer's device (``auto``: CUDA when available), with the CUDA settings a variable-length trainer
    needs. Raises ``ValueError`` when ``cuda`` is asked for and absent."""
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        if config.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: cuda was requested but torch.cuda.is_available() is False")
        device = torch.device(config.device)
    if device.type == "cuda":
        if not torch.cuda.is_initialized():
            # fp32 master weights + bf16 activations of varying shapes fragment the caching allocator
            # (seen: OOM at step 2 on an H100 without this)
            os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        # cuDNN attention re-plans for every new sequence length (variable-length batches: 1.7x slower step)
        torch.backends.cuda.enable_cudnn_sdp(False)
    return device


class ModelRunner:
    """Micro-batched passes of the policy model (or the frozen reference model) over prepared sequences: the
    micro-batch split, the padded or packed layout, the log-prob path, and FSDP's lockstep (every rank runs as
    many forward passes of the sharded policy as its busiest peer, each all-gathering parameters). Lives as long
    as the trainer; :meth:`shard` switches it to FSDP (log-probs from the model's full logits then, since the
    chunked paths read the output head outside the model's forward, where FSDP2 holds only a shard of it)."""

    def __init__(self, config: TrainerConfig, policy: torch.nn.Module, device: torch.device, impl: str,
                 compute_dtype: torch.dtype) -> None:
        self.config, self.policy, self.device = config, policy, device
        self.impl, self.compute_dtype = impl, compute_dtype
        self.vocab_size = int(policy.get_input_embeddings().weight.shape[0])
        self.fsdp = False
        if config.prefix_tree:  # refuse an attention without dense 4-D masks now, not at the first step
            tree_attention_mask(policy, torch.ones(1, dtype=torch.long), compute_dtype)

    def shard(self) -> None:
        if self.impl != "full":
            log.info("fsdp: log-probs from the model's full logits (logprob_impl %s needs the unsharded head)",
                     self.impl)
            self.impl = "full"
        self.fsdp = True

    def forward(self, model: torch.nn.Module, mb: MicroBatch, *, entropy: bool,
                entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """Returns ``logp: [b, T]`` of the targets (float32, at ``config.temperature``) and, if asked,
        ``entropy: [b, T]`` (with gradient only if ``entropy_grad``)."""
        return micro_batch_logprobs(model, mb, impl=self.impl, compute_dtype=self.compute_dtype,
                                    temperature=self.config.temperature, entropy=entropy, entropy_grad=entropy_grad)

    def collate(self, seqs: list[Seq]) -> MicroBatch:
        """``seqs`` in the configured layout (padded, packed or prefix tree) on the trainer's device."""
        return collate(seqs, self.device, packing=self.config.packing, tree=self.config.prefix_tree)

    def micro_batches(self, seqs: list[Seq], model: torch.nn.Module | None = None) -> list[list[Seq]]:
        """Micro-batches of ``seqs``; for the sharded policy padded with empty ones up to the largest count of any
        rank."""
        cfg = self.config
        if cfg.prefix_tree:
            groups = tree_micro_batches(units(seqs), cfg.micro_batch_size, cfg.micro_batch_tokens)
        else:
            groups = split_micro(seqs, cfg.micro_batch_size, cfg.micro_batch_tokens, packing=cfg.packing)
        if self.fsdp and (model is None or model is self.policy):
            from agentrl.trainer.dp_rank import agree_count

            groups += [[] for _ in range(agree_count(len(groups), self.device) - len(groups))]
        return groups

    def dummy_pass(self, model: torch.nn.Module, backward: bool) -> None:
        """A forward (and backward) of a 2-token sequence with no loss token: an FSDP rank with fewer micro-batches
        than its peers joins their collectives with it; its gradient contribution is exactly zero."""
        mb = self.collate(scoring_sequences([[0, 0]], self.vocab_size))
        logp, _ = self.forward(model, mb, entropy=False)
        if backward:
            (logp.sum() * 0.0).backward()

    @torch.no_grad()
    def fill_logprobs(self, seqs: list[Seq], model: torch.nn.Module, attr: str,
                      on_logp: Callable[[MicroBatch, Tensor], None] | None = None) -> None:
        """Sets ``seq.<attr>`` to the sequence's target log-probs under ``model`` (no gradient, eval mode);
        ``on_logp(mb, logp)`` sees each micro-batch's ``[b, T]`` CPU log-probs."""
        model.eval()
        for group in self.micro_batches(seqs, model):
            if not group:
                self.dummy_pass(model, backward=False)
                continue
            mb = self.collate(group)
            logp, _ = self.forward(model, mb, entropy=False)
            logp = logp.float().cpu()
            for j, s in enumerate(group):
                setattr(s, attr, logp[j, : s.length - 1].clone())
            if on_logp is not None:
                on_logp(mb, logp)

    @torch.no_grad()
    def score(self, batch: Sequence[Trajectory] | Sequence[Sequence[int]]) -> Tensor:
        """``logp: [B, T]`` (float32, CPU) of trajectories or plain token-id lists under the policy, 0.0 beyond
        each sequence; a segmented trajectory's tokens are scored within their own segment (0.0 at the first
        token of each later segment)."""
        if any(isinstance(b, Trajectory) and b.segments for b in batch):
            flat = [(i, a, b) for i, t in enumerate(batch) for a, b in t.segment_slices()]  # type: ignore[union-attr]
            parts = self.score([batch[i].token_ids[a:b] for i, a, b in flat])  # type: ignore[union-attr]
            out = torch.zeros(len(batch), max(len(t.token_ids) for t in batch) - 1)  # type: ignore[union-attr]
            for row, (i, a, b) in zip(parts, flat):
                out[i, a:b - 1] = row[: b - a - 1]
            return out
        ids = [list(b.token_ids) if isinstance(b, Trajectory) else list(b) for b in batch]
        seqs = scoring_sequences(ids, self.vocab_size)
        was_training = self.policy.training
        self.fill_logprobs(seqs, self.policy, "prox")
        self.policy.train(was_training)
        T = max(len(x) for x in ids) - 1
        return pad_rows([s.prox for s in seqs], T, 0.0, torch.float32)  # type: ignore[misc]
