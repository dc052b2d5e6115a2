"""The trainer: a transformers causal LM with float32 master weights, AdamW, and micro-batched policy-gradient steps
on trajectories. Plain Python (no Ray): :mod:`agentrl.trainer.actor` wraps it as a Ray actor.

Flow of one :meth:`Trainer.train_step`: trajectories are validated and tensorised (:mod:`.batching`); the
proximal log-probs (the weights at step start) are recomputed without gradient when the loss or the metrics need
them and several optimizer steps follow (with one mini-batch and one epoch the training forward's own detached
log-probs are the proximal ones, so that pass is skipped); then, per mini-batch and epoch, micro-batches (length
sorted, padded or packed) run forward and backward, and one optimizer step follows. Log-probs come from the last
hidden states in vocabulary chunks (:mod:`.logprobs`), never as a full ``[tokens, vocabulary]`` tensor.

Normalisation. Micro-batch losses are *sums* of per-token (or per-sequence) terms; their gradients accumulate
unnormalised and are divided by the whole optimizer batch's normaliser (loss tokens for ``token_mean``, sequences
with a loss token for the sequence means) just before clipping and stepping. The normaliser comes from counts
that pass through :meth:`Trainer._global_counts`, the one place a data-parallel trainer turns per-rank counts into
all-reduced sums; everything else reported is kept as sums in :class:`~agentrl.trainer.step.StepSums` and reduced
the same way. Because nothing is divided before the end, a step can also be fed in parts as groups arrive
(:meth:`Trainer.start_step` / :meth:`Trainer.accumulate` / :meth:`Trainer.finish_step`) with the same result, and
split across data-parallel ranks (:meth:`Trainer.enable_data_parallel`): every rank then runs every optimizer step
and every collective, even with an empty shard.

Versions. ``version`` counts weight updates: it starts at 0 (or the checkpoint's) and increases by exactly one per
``train_step``, ``sft_step`` or ``finish_step`` call, whatever ``num_mini_batches``/``ppo_epochs`` are, so the
weights after the call are "version v" for the engine. ``optimizer_steps`` counts optimizer steps.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentrl.config import from_dict, to_dict
from agentrl.trainer import checkpoint as ckpt
from agentrl.trainer.advantages import compute_advantages
from agentrl.trainer.batching import MicroBatch, Seq, collate, mini_batches, pad_rows, prepare_sequences
from agentrl.trainer.batching import scoring_sequences, split_micro
from agentrl.trainer.checkpoint import find_latest_checkpoint  # noqa: F401  (public API, re-exported)
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.losses import Metrics, policy_loss
from agentrl.trainer.model import choose_logprob_impl, configure_layers, has_active_dropout, load_causal_lm
from agentrl.trainer.model import micro_batch_logprobs
from agentrl.trainer.step import LocalReducer, RecordSampler, Reducer, StepSums, add_batch_stats
from agentrl.trainer.step import finish_batch_stats
from agentrl.trajectory import Group, Trajectory

log = logging.getLogger(__name__)

# Loss terms reported per optimizer step (divided by the step's normaliser, then averaged over optimizer steps).
_LOSS_KEYS_PREFIX = ("loss", "sft/nll")

LossFn = Callable[[MicroBatch, Tensor, "Tensor | None", "Tensor | None"], tuple[Tensor, Metrics]]


@dataclass
class _GradState:
    """One optimizer step's gradient accumulation on this worker: unnormalised loss sums and the counts the
    normaliser is made of."""

    loss_tokens: float = 0.0
    loss_seqs: float = 0.0
    finite: bool = True
    loss_sums: dict[str, float] = field(default_factory=dict)


@dataclass
class _Stream:
    """A streamed step in progress (:meth:`Trainer.start_step`)."""

    t_start: float
    sums: StepSums
    grad: _GradState
    sampler: RecordSampler
    groups: set[str] = field(default_factory=set)
    calls: int = 0


def _flatten(batch: Sequence[Trajectory] | Sequence[Group]) -> list[Trajectory]:
    if batch and isinstance(batch[0], Group):
        return [t for g in batch for t in g.trajectories]  # type: ignore[union-attr]
    return list(batch)  # type: ignore[arg-type]


class Trainer:
    """Holds the policy model (float32 parameters), its optimizer and (when ``loss.kl_coef > 0``) a frozen reference
    model.

    Construct with a validated :class:`TrainerConfig` and the path of a HF causal LM directory. Raises
    ``ValueError`` for an invalid config (naming the key). It trains alone until :meth:`enable_data_parallel`
    makes it one rank of a ``torch.distributed`` group (:mod:`agentrl.trainer.dp_rank`); ``reducer`` (default
    :class:`~agentrl.trainer.step.LocalReducer`) is the data-parallel hook: see :meth:`_global_counts`.
    """

    def __init__(self, config: TrainerConfig, model_path: str | os.PathLike) -> None:
        if isinstance(config, dict):
            config = from_dict(TrainerConfig, config, "trainer config")
        config.validate()
        self.config = config
        self.model_path = Path(model_path)
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            if config.device == "cuda" and not torch.cuda.is_available():
                raise ValueError("device: cuda was requested but torch.cuda.is_available() is False")
            self.device = torch.device(config.device)
        self._compute_dtype = torch.bfloat16 if config.compute_dtype == "bfloat16" else torch.float32
        if self.device.type == "cuda":
            if not torch.cuda.is_initialized():
                # fp32 master weights + bf16 activations of varying shapes fragment the caching allocator
                # (seen: OOM at step 2 on an H100 without this)
                os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
            # cuDNN attention re-plans for every new sequence length (variable-length batches: 1.7x slower step)
            torch.backends.cuda.enable_cudnn_sdp(False)

        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)

        # Master weights are float32 whatever config.dtype says: bf16 parameters under AdamW at small learning
        # rates lose most updates to rounding (issue 12: 1.9 % of weights changed after 10 steps at lr 1e-6).
        self.model = load_causal_lm(self.model_path, dtype=torch.float32, device=self.device,
                                    disable_dropout=config.disable_dropout)
        self._has_dropout = has_active_dropout(self.model)
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self._impl = choose_logprob_impl(config, self.model, self.vocab_size, self.device)
        configure_layers(self.model, config)
        self.ref_model = None
        if config.loss.kl_coef > 0:
            # Frozen: no optimizer steps it, so it is stored in the compute dtype.
            self.ref_model = load_causal_lm(self.model_path, dtype=self._compute_dtype, device=self.device,
                                            disable_dropout=True).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)

        self.optimizer = self._make_optimizer()
        self.reducer: Reducer = LocalReducer()
        # Data parallelism (enable_data_parallel): this rank, the number of ranks, and how the model is held
        # ("none" alone, "replicate": whole model per rank + summed gradients, "fsdp": FSDP2 shards).
        self._rank, self._world, self._sharding = 0, 1, "none"
        self._comm_at_start = 0.0
        self._version = 0
        self._optimizer_steps = 0
        self._last_lr: float | None = None
        self._stream: _Stream | None = None
        self._records: list[dict] = []

    # ------------------------------------------------------------------------------------------ properties
    @property
    def version(self) -> int:
        """Number of weight updates applied (train_step, sft_step and finish_step calls), restored from
        checkpoints."""
        return self._version

    @property
    def optimizer_steps(self) -> int:
        return self._optimizer_steps

    @property
    def logprob_impl(self) -> str:
        """The log-prob path in use: ``torch``, ``liger`` or ``full`` (see :mod:`agentrl.trainer.logprobs`)."""
        return self._impl

    @property
    def step_in_progress(self) -> bool:
        """True between :meth:`start_step` and :meth:`finish_step` / :meth:`abort_step`."""
        return self._stream is not None

    # ----------------------------------------------------------------------------------------------- setup
    def _params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _make_optimizer(self) -> torch.optim.Optimizer:
        opt = self.config.optimizer
        return torch.optim.AdamW(self._params(), lr=opt.lr, betas=(float(opt.betas[0]), float(opt.betas[1])),
                                 eps=opt.eps, weight_decay=opt.weight_decay)

    @property
    def rank(self) -> int:
        """This trainer's data-parallel rank (0 when alone)."""
        return self._rank

    @property
    def sharding(self) -> str:
        """``none`` (one trainer), ``replicate`` or ``fsdp`` (see :mod:`agentrl.trainer.dp_rank`)."""
        return self._sharding

    def enable_data_parallel(self) -> None:
        """Makes this trainer one rank of the already initialised default ``torch.distributed`` process group
        (:func:`agentrl.trainer.dp_rank.init_process_group`), before any step: metrics and loss normalisers
        become all-reduced sums, and the model is held as ``config.sharding`` says (``auto``: ``fsdp`` on CUDA,
        ``replicate`` on CPU). Every rank starts from rank 0's weights. Raises ``RuntimeError`` after a step or
        when no process group exists."""
        import torch.distributed as dist

        from agentrl.trainer import distributed as dd

        if not dist.is_initialized():
            raise RuntimeError("enable_data_parallel: torch.distributed is not initialised")
        if self._version or self._optimizer_steps or self._stream is not None:
            raise RuntimeError("enable_data_parallel must be called before the first step")
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        mode = self.config.sharding
        if mode == "auto":
            mode = "fsdp" if self.device.type == "cuda" else "replicate"
        self._sharding = mode
        self.reducer = dd.DistReducer(self.device)
        dd.broadcast_parameters(self.model)
        if mode == "fsdp":
            if self._impl != "full":
                # The chunked log-prob paths read the output head's weight outside the model's forward, where
                # FSDP2 holds only this rank's shard of it; the model's own forward (full logits) all-gathers it.
                log.info("fsdp: log-probs from the model's full logits (logprob_impl %s needs the unsharded head)",
                         self._impl)
                self._impl = "full"
            dd.shard_model(self.model, self.device, self._compute_dtype)
            self.optimizer = self._make_optimizer()  # over the sharded (DTensor) parameters

    def _lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        opt = self.config.optimizer
        if opt.warmup_steps > 0:
            return opt.lr * min(1.0, (self._optimizer_steps + 1) / opt.warmup_steps)
        return opt.lr

    # ------------------------------------------------------------------------------------------- log-probs
    def _forward(self, model: torch.nn.Module, mb: MicroBatch, *, entropy: bool,
                 entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """Returns ``logp: [b, T]`` of the targets (float32, at ``config.temperature``) and, if asked,
        ``entropy: [b, T]`` (with gradient only if ``entropy_grad``)."""
        return micro_batch_logprobs(model, mb, impl=self._impl, compute_dtype=self._compute_dtype,
                                    temperature=self.config.temperature, entropy=entropy, entropy_grad=entropy_grad)

    def _micro_batches(self, seqs: list[Seq]) -> list[list[Seq]]:
        """Micro-batches of ``seqs``; under FSDP padded with empty ones up to the largest count of any rank (every
        rank must run the same number of forward passes: each all-gathers parameters)."""
        cfg = self.config
        groups = split_micro(seqs, cfg.micro_batch_size, cfg.micro_batch_tokens, packing=cfg.packing)
        if self._sharding == "fsdp":
            from agentrl.trainer.dp_rank import agree_count

            groups += [[] for _ in range(agree_count(len(groups), self.device) - len(groups))]
        return groups

    def _dummy_pass(self, model: torch.nn.Module, backward: bool) -> None:
        """A forward (and backward) of a 2-token sequence with no loss token: an FSDP rank with fewer micro-batches
        than its peers joins their collectives with it; its gradient contribution is exactly zero."""
        mb = collate(scoring_sequences([[0, 0]], self.vocab_size), self.device, packing=self.config.packing)
        logp, _ = self._forward(model, mb, entropy=False)
        if backward:
            (logp.sum() * 0.0).backward()

    @torch.no_grad()
    def _fill_logprobs(self, seqs: list[Seq], model: torch.nn.Module, attr: str,
                       sampler: RecordSampler | None = None) -> None:
        model.eval()
        for group in self._micro_batches(seqs) if model is self.model else split_micro(
                seqs, self.config.micro_batch_size, self.config.micro_batch_tokens, packing=self.config.packing):
            if not group:
                self._dummy_pass(model, backward=False)
                continue
            mb = collate(group, self.device, packing=self.config.packing)
            logp, _ = self._forward(model, mb, entropy=False)
            logp = logp.float().cpu()
            for j, s in enumerate(group):
                setattr(s, attr, logp[j, : s.length - 1].clone())
            if sampler is not None:
                self._offer_records(sampler, mb, logp)

    def _offer_records(self, sampler: RecordSampler, mb: MicroBatch, logp: Tensor) -> None:
        for j, s in enumerate(mb.seqs):
            slot = sampler.slot()
            if slot is not None:
                sampler.put(slot, s.traj_id, self._version, logp[j, : s.length - 1])

    def _new_sampler(self) -> RecordSampler:
        # A private RNG: sampling must not move the global RNG states that checkpoints restore.
        return RecordSampler(self.config.record_logprobs, random.Random(f"records:{self.config.seed}:{self._version}"))

    # ------------------------------------------------------------------------------------------ public API
    @torch.no_grad()
    def compute_logprobs(self, batch: Sequence[Trajectory] | Sequence[Sequence[int]]) -> Tensor:
        """Returns ``logp: [B, T]`` (float32, CPU, no grad) with the current weights, where ``T = longest - 1`` and
        ``logp[i, t] = log pi(tokens_i[t+1] | tokens_i[:t+1])`` (temperature applied); 0.0 beyond each sequence.
        Accepts trajectories or plain token-id lists. Compare with a trajectory's engine log-probs as
        ``logp[i, t]`` vs ``traj.logprobs[t + 1]``. A segmented trajectory's tokens are scored within their own
        segment; ``logp`` is 0.0 at the first token of each later segment (it has no context there)."""
        if any(isinstance(b, Trajectory) and b.segments for b in batch):
            flat = [(i, a, b) for i, t in enumerate(batch) for a, b in t.segment_slices()]  # type: ignore[union-attr]
            parts = self.compute_logprobs([batch[i].token_ids[a:b] for i, a, b in flat])  # type: ignore[union-attr]
            out = torch.zeros(len(batch), max(len(t.token_ids) for t in batch) - 1)  # type: ignore[union-attr]
            for row, (i, a, b) in zip(parts, flat):
                out[i, a:b - 1] = row[: b - a - 1]
            return out
        ids = [list(b.token_ids) if isinstance(b, Trajectory) else list(b) for b in batch]
        seqs = scoring_sequences(ids, self.vocab_size)
        was_training = self.model.training
        self._fill_logprobs(seqs, self.model, "prox")
        self.model.train(was_training)
        T = max(len(x) for x in ids) - 1
        return pad_rows([s.prox for s in seqs], T, 0.0, torch.float32)  # type: ignore[misc]

    def take_logprob_records(self) -> list[dict]:
        """Returns and clears the log-prob records of the last step: for a uniform sample of up to
        ``config.record_logprobs`` of its trained trajectories, ``{"trajectory_id": str, "version": int,
        "logprobs": list[float]}``, where ``version`` is the version of the weights that computed them (the
        step's starting weights) and ``logprobs[t]`` is the trainer's ``log pi(token_ids[t+1] | token_ids[:t+1])``
        at the training temperature, for every position ``t = 0 .. n-2`` (``n`` tokens; after ``max_seq_len``
        truncation). They are the step's own proximal (or first training-forward) log-probs: no extra pass. With
        several mini-batches and no proximal pass, only the first mini-batch is sampled. Empty when
        ``record_logprobs`` is 0."""
        out, self._records = self._records, []
        return out

    def _prox_reusable(self) -> bool:
        """True when the proximal policy is the current one during the whole backward: one optimizer step per
        ``train_step`` and a deterministic forward (no active dropout)."""
        cfg = self.config
        return cfg.num_mini_batches == 1 and cfg.ppo_epochs == 1 and not self._has_dropout

    def _needs_prox(self) -> bool:
        return self.config.loss.needs_proximal or self.config.log_mismatch_metrics

    def _rl_loss(self, prox_from_forward: bool) -> LossFn:
        cfg = self.config

        def fn(mb: MicroBatch, logp: Tensor, ent: Tensor | None, _: Tensor | None) -> tuple[Tensor, Metrics]:
            prox = logp.detach() if prox_from_forward else mb.prox
            # num_tokens = num_seqs = 1: sums; the step's normaliser divides the gradient in _apply_update
            return policy_loss(cfg.loss, logp=logp, mask=mb.mask, adv=mb.adv, prox_logp=prox, behav_logp=mb.behav,
                               reward=mb.reward, ref_logp=mb.ref, entropy=ent, num_tokens=1.0, num_seqs=1.0)

        return fn

    def _backward(self, seqs: list[Seq], loss_fn: LossFn, grad: _GradState, sums: StepSums, *,
                  loss_key: str = "loss", entropy: bool = False, entropy_grad: bool = False,
                  sampler: RecordSampler | None = None) -> None:
        """Forward and backward over micro-batches of ``seqs``, accumulating unnormalised gradients, loss sums
        and counts into ``grad`` and token-weighted metrics into ``sums``. Stops at the first non-finite loss
        (``grad.finite`` becomes False; the optimizer step will be skipped)."""
        fsdp = self._sharding == "fsdp"
        if not grad.finite and not fsdp:
            return
        self.model.train()
        for group in self._micro_batches(seqs):
            if not group or not grad.finite:  # FSDP: keep this rank in its peers' collectives
                self._dummy_pass(self.model, backward=True)
                continue
            mb = collate(group, self.device, packing=self.config.packing)
            logp, ent = self._forward(self.model, mb, entropy=entropy, entropy_grad=entropy_grad)
            if sampler is not None:
                self._offer_records(sampler, mb, logp.detach())
            loss, m = loss_fn(mb, logp, ent, None)
            if not torch.isfinite(loss):
                log.warning("non-finite loss in a micro-batch: the optimizer step will be skipped")
                grad.finite = False
                if fsdp:  # the backward's reduce-scatter is a collective; the step is skipped on every rank anyway
                    loss.backward()
                    continue
                return
            loss.backward()
            w = float(mb.mask.sum())
            grad.loss_tokens += w
            grad.loss_seqs += float((mb.mask.sum(-1) > 0).sum())
            grad.loss_sums[loss_key] = grad.loss_sums.get(loss_key, 0.0) + float(loss.detach())
            weights = getattr(m, "weights", {})
            for k, v in m.items():
                if k.startswith("loss/"):
                    grad.loss_sums[k] = grad.loss_sums.get(k, 0.0) + v
                elif k.endswith("_max"):
                    sums.add_max(k, v)
                else:
                    sums.add_mean(k, v, weights.get(k, w))

    def _global_counts(self, local: dict[str, float]) -> dict[str, float]:
        """THE place where this worker's counts become whole-batch counts: ``{"loss_tokens", "loss_seqs",
        "nonfinite"}`` in, the same keys summed over every worker out (here: one worker, unchanged). The loss
        normaliser of every optimizer step is computed from its result and nowhere else.

        Data parallelism (issue 10) hooks in here: set ``self.reducer`` to an all-reducing
        :class:`~agentrl.trainer.step.Reducer` (``torch.distributed.all_reduce`` SUM / MAX). Gradients reaching
        :meth:`_apply_update` are unnormalised sums over this worker's tokens, so the data-parallel wrapper must
        SUM them across ranks (FSDP2: ``set_gradient_divide_factor(1.0)``; DDP: a SUM comm hook), or override
        :meth:`_reduce_gradients`; reported metrics go through the same reducer."""
        return self.reducer.sum(local)

    def _reduce_gradients(self) -> None:
        """Makes ``p.grad`` the sum over all workers: an all-reduce in ``replicate`` mode; a no-op alone and under
        FSDP (which reduce-scattered them, summed, during backward)."""
        if self._sharding == "replicate":
            from agentrl.trainer.dp_rank import sum_gradients

            sum_gradients(self._params())

    def _apply_update(self, grad: _GradState, sums: StepSums, aggregation: str) -> bool:
        """Normalises the accumulated gradient by the whole batch's normaliser, clips it and steps. Returns
        whether an optimizer step happened (not for no loss token, a non-finite loss or gradient norm)."""
        cfg = self.config
        counts = self._global_counts({"loss_tokens": grad.loss_tokens, "loss_seqs": grad.loss_seqs,
                                      "nonfinite": 0.0 if grad.finite else 1.0})
        params = self._params()
        denom = counts["loss_tokens"] if aggregation == "token_mean" else counts["loss_seqs"]
        ok = counts["nonfinite"] == 0 and counts["loss_tokens"] > 0
        gnorm = math.nan
        if ok:
            self._reduce_gradients()
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(1.0 / denom)
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            gnorm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # DTensor under FSDP
            ok = math.isfinite(gnorm)
            if not ok:
                log.warning("skipping an optimizer step: non-finite gradient norm")
        if ok:
            lr = self._lr()
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            self.optimizer.step()
            self._optimizer_steps += 1
            self._last_lr = lr
            for k, v in grad.loss_sums.items():
                sums.add_total(k, v / denom)
            sums.add_mean("grad_norm", gnorm, 1.0)
            sums.optimizer_steps += 1
        else:
            sums.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return ok

    def _finish(self, sums: StepSums, sampler: RecordSampler, t_start: float) -> dict[str, float]:
        """Ends a step: whole-batch metrics, ``lr`` (the one the step's last optimizer step used), version += 1,
        timing, and the step's log-prob records."""
        steps = sums.optimizer_steps
        divide = {k: float(max(steps, 1)) for k in sums.totals if k.startswith(_LOSS_KEYS_PREFIX)}
        out = finish_batch_stats(sums.result(self.reducer, divide=divide))
        out["train/skipped_steps"] = float(sums.skipped_steps)
        out["lr"] = self._last_lr if steps > 0 and self._last_lr is not None else self._lr()
        self._version += 1
        elapsed = time.perf_counter() - t_start
        out["perf/step_s"] = elapsed
        if self._world > 1:
            from agentrl.trainer.dp_rank import comm_seconds

            # this rank's seconds in collectives during the step (waiting for a slower rank included)
            out["perf/comm_s"] = comm_seconds() - self._comm_at_start
        out["perf/tokens_per_s"] = out.get("batch/num_tokens", 0.0) / max(elapsed, 1e-9)
        out["version"] = float(self._version)
        out["optimizer_steps"] = float(self._optimizer_steps)
        self._records = sampler.take()
        return out

    def _prepare(self, trajs: list[Trajectory], advantages: Sequence[float] | None, what: str, *,
                 check_global: bool = True) -> tuple[list[Seq], dict[str, float]]:
        """Validated, tensorised sequences of this worker's part of the batch (see ``prepare_sequences``). Alone,
        an empty or untrainable batch raises ``ValueError``. As a data-parallel rank, an empty or untrainable
        *shard* is fine (the rank still joins every collective of the step); with ``check_global`` the ranks
        raise together when the whole batch has nothing trainable."""
        if self._world == 1:
            if not trajs:
                raise ValueError(f"{what} got an empty batch")
            return prepare_sequences(trajs, advantages, vocab_size=self.vocab_size,
                                     max_seq_len=self.config.max_seq_len)
        seqs: list[Seq] = []
        info = {"batch/dropped_invalid": 0.0, "batch/truncated_seqs": 0.0}
        if trajs:
            try:
                seqs, info = prepare_sequences(trajs, advantages, vocab_size=self.vocab_size,
                                               max_seq_len=self.config.max_seq_len)
            except ValueError as e:
                if "no trainable trajectory" not in str(e):
                    raise
                log.warning("rank %d: %s", self._rank, e)
                info["batch/dropped_invalid"] = float(len(trajs))
        if check_global and self.reducer.sum({"seqs": float(len(seqs))}).get("seqs", 0.0) == 0:
            raise ValueError(f"{what}: no trainable trajectory in the batch on any of the {self._world} ranks")
        return seqs, info

    def _begin_step(self) -> float:
        """Returns the step's start time (and notes the collective seconds so far, for ``perf/comm_s``)."""
        if self._world > 1:
            from agentrl.trainer.dp_rank import comm_seconds

            self._comm_at_start = comm_seconds()
        return time.perf_counter()

    def _check_no_stream(self, what: str) -> None:
        if self._stream is not None:
            raise RuntimeError(f"{what} while a streamed step is open: call finish_step() or abort_step() first")

    def _start_sums(self, info: dict[str, float], seqs: list[Seq]) -> StepSums:
        sums = StepSums()
        for k, v in info.items():
            sums.add_total(k, v)
        add_batch_stats(sums, seqs, self._version)
        return sums

    def train_step(
        self,
        batch: Sequence[Trajectory] | Sequence[Group],
        advantages: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """One policy update on ``batch`` (trajectories, or groups flattened in order).

        ``advantages``: one per trajectory (aligned with the flattened batch); when ``None`` they are computed with
        ``config.advantage`` per group (``Group`` objects, or trajectories grouped by ``group_id``). The proximal
        log-probs are those of the weights at step start: recomputed without gradient when several optimizer
        steps follow (or dropout is active), else taken from the training forward itself; the reference
        log-probs (``kl_coef > 0``) are computed without gradient. Then ``ppo_epochs`` x ``num_mini_batches``
        optimizer steps follow, each accumulating gradients over micro-batches with the loss normalised over the
        whole mini-batch and the gradient norm clipped to ``max_grad_norm``. A mini-batch whose loss or gradient
        norm is not finite, or which has no loss token, is skipped (``train/skipped_steps``). ``version`` increases
        by one.

        Returns flat float metrics: ``loss``, ``loss/policy``, ``loss/kl``, ``kl/ref``, ``grad_norm``, ``lr`` (of
        the step's last optimizer step), ``entropy``, ``ratio/clip_frac``, ``ratio/mean``, ``is/weight_mean``,
        ``is/weight_max``, ``is/truncated_frac``, ``is/masked_frac``, ``mismatch/kl_k1``, ``mismatch/kl_k3``
        (``KL(mu || pi_prox)``), ``staleness/mean``, ``staleness/max``, ``staleness/hist/<k>`` (share of loss
        tokens ``k`` versions old), ``reward/{mean,std,min,max}``, ``adv/{mean,std,min,max,zero_frac}``,
        ``batch/{num_seqs,num_tokens,loss_tokens,mean_seq_len,dropped_invalid,truncated_seqs}``,
        ``perf/{step_s,prox_s,tokens_per_s}``, ``train/skipped_steps``, ``version``, ``optimizer_steps`` (keys
        absent when they do not apply).
        """
        self._check_no_stream("train_step")
        t_start = self._begin_step()
        trajs = _flatten(batch)
        if advantages is None and trajs:
            advantages = compute_advantages(batch, self.config.advantage)  # type: ignore[arg-type]
        seqs, info = self._prepare(trajs, advantages, "train_step")
        sums = self._start_sums(info, seqs)
        seqs = [s for s in seqs if s.loss_tokens > 0]  # nothing to learn from the others; skip their forward
        cfg = self.config
        sampler = self._new_sampler()
        reuse = self._prox_reusable()
        # ranks decide alike (an FSDP rank without sequences still joins its peers' forward passes)
        prox_pass = (bool(seqs) or self._world > 1) and self._needs_prox() and not reuse
        t_prox = time.perf_counter()
        if prox_pass:
            self._fill_logprobs(seqs, self.model, "prox", sampler)
        if seqs and self.ref_model is not None:
            self._fill_logprobs(seqs, self.ref_model, "ref")
        sums.add_total("perf/prox_s", time.perf_counter() - t_prox)

        loss_fn = self._rl_loss(prox_from_forward=reuse and self._needs_prox())
        mini = mini_batches(seqs, cfg.num_mini_batches)
        if self._world > 1:
            # every rank takes every optimizer step (each is a collective), with its share of each mini-batch: the
            # k-th mini-batch of the step is the union of the ranks' k-th parts, normalised over all of them
            mini += [[] for _ in range(cfg.num_mini_batches - len(mini))]
        entropy = cfg.compute_entropy or cfg.loss.entropy_coef > 0
        first = True
        for _ in range(cfg.ppo_epochs):
            for mb_seqs in mini:
                grad = _GradState()
                self.optimizer.zero_grad(set_to_none=True)
                self._backward(mb_seqs, loss_fn, grad, sums, entropy=entropy, entropy_grad=cfg.loss.entropy_coef > 0,
                               sampler=sampler if first and not prox_pass else None)
                first = False
                self._apply_update(grad, sums, cfg.loss.effective_aggregation)
        if not mini:
            sums.skipped_steps += 1
        return self._finish(sums, sampler, t_start)

    def sft_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One supervised step: mean negative log-likelihood over all loss-mask tokens of the batch (micro-batched,
        gradient-clipped), for warm starts on scripted demonstrations. ``version`` increases by one. Returns
        ``sft/nll`` (before the update), ``grad_norm``, ``lr``, ``batch/*``, ``perf/step_s``, ``perf/tokens_per_s``,
        ``version``, ``optimizer_steps``, ``train/skipped_steps``."""
        self._check_no_stream("sft_step")
        t_start = self._begin_step()
        seqs, info = self._prepare(list(trajectories), None, "sft_step")
        sums = StepSums()
        for k, v in info.items():
            sums.add_total(k, v)
        sums.add_total("batch/num_seqs", float(len(seqs)))
        sums.add_total("batch/num_tokens", float(sum(s.length for s in seqs)))
        seqs = [s for s in seqs if s.loss_tokens > 0]
        sums.add_total("batch/loss_tokens", float(sum(s.loss_tokens for s in seqs)))

        def nll(mb: MicroBatch, logp: Tensor, ent: Tensor | None, _: Tensor | None) -> tuple[Tensor, Metrics]:
            return -(logp * mb.mask).sum(), Metrics()

        sampler = self._new_sampler()
        grad = _GradState()
        self.optimizer.zero_grad(set_to_none=True)
        self._backward(seqs, nll, grad, sums, loss_key="sft/nll", sampler=sampler)
        self._apply_update(grad, sums, "token_mean")
        return self._finish(sums, sampler, t_start)

    # ---------------------------------------------------------------------------------- streamed steps
    def start_step(self) -> None:
        """Opens a streamed step: :meth:`accumulate` groups as they arrive, then :meth:`finish_step`.

        The result equals one :meth:`train_step` on all accumulated groups (same parameters up to float rounding)
        because each micro-batch's loss is a sum of per-token or per-sequence terms whose whole-batch normaliser
        (loss tokens for ``token_mean``, sequences for the sequence means; KL and entropy terms share it) is only
        applied to the accumulated gradient in :meth:`finish_step`. That holds for every loss and aggregation here
        with ``num_mini_batches: 1`` and ``ppo_epochs: 1``: the weights do not move until the end, so the proximal
        policy is the current one. Several mini-batches or epochs need the whole batch before the first optimizer
        step and are refused (``ValueError``). Advantages are computed per :meth:`accumulate` call, so each call
        must carry whole groups (a group seen again in the same step is refused).
        Raises ``RuntimeError`` if a streamed step is already open."""
        self._check_no_stream("start_step")
        cfg = self.config
        if cfg.num_mini_batches != 1 or cfg.ppo_epochs != 1:
            raise ValueError(
                f"streamed accumulation needs num_mini_batches: 1 and ppo_epochs: 1 (got {cfg.num_mini_batches} and "
                f"{cfg.ppo_epochs}): several optimizer steps per batch need the whole batch first; use train_step")
        self.optimizer.zero_grad(set_to_none=True)
        self._stream = _Stream(t_start=self._begin_step(), sums=StepSums(), grad=_GradState(),
                               sampler=self._new_sampler())

    def accumulate(self, batch: Sequence[Trajectory] | Sequence[Group],
                   advantages: Sequence[float] | None = None) -> dict[str, float]:
        """Adds whole groups to the open streamed step: forward and backward per micro-batch, gradients kept
        unnormalised. ``batch`` and ``advantages`` as in :meth:`train_step`. Returns ``accumulate/seqs``,
        ``accumulate/loss_tokens`` and ``accumulate/s`` of this call. Raises ``RuntimeError`` outside a streamed
        step and ``ValueError`` for an empty or untrainable batch or a group already accumulated in this step
        (nothing of that call is accumulated then)."""
        st = self._stream
        if st is None:
            raise RuntimeError("accumulate() outside a streamed step: call start_step() first")
        t0 = time.perf_counter()
        trajs = _flatten(batch)
        gids = ({g.id for g in batch} if trajs and isinstance(batch[0], Group)  # type: ignore[union-attr]
                else {t.group_id for t in trajs})
        if advantages is None and gids & st.groups:
            raise ValueError(f"group {sorted(gids & st.groups)[0]!r} was already accumulated in this step: "
                             "advantages are per group, so each accumulate() call must carry whole groups")
        if advantages is None and trajs:
            advantages = compute_advantages(batch, self.config.advantage)  # type: ignore[arg-type]
        seqs, info = self._prepare(trajs, advantages, "accumulate", check_global=False)
        st.groups |= gids
        st.calls += 1
        for k, v in info.items():
            st.sums.add_total(k, v)
        add_batch_stats(st.sums, seqs, self._version)
        seqs = [s for s in seqs if s.loss_tokens > 0]
        cfg = self.config
        reuse = not self._has_dropout  # the weights do not move until finish_step
        prox_pass = (bool(seqs) or self._world > 1) and self._needs_prox() and not reuse
        if prox_pass:
            self._fill_logprobs(seqs, self.model, "prox", st.sampler)
        if seqs and self.ref_model is not None:
            self._fill_logprobs(seqs, self.ref_model, "ref")
        self._backward(seqs, self._rl_loss(prox_from_forward=reuse and self._needs_prox()), st.grad, st.sums,
                       entropy=cfg.compute_entropy or cfg.loss.entropy_coef > 0,
                       entropy_grad=cfg.loss.entropy_coef > 0, sampler=None if prox_pass else st.sampler)
        return {"accumulate/seqs": float(len(seqs)), "accumulate/loss_tokens": float(sum(s.loss_tokens for s in seqs)),
                "accumulate/s": time.perf_counter() - t0}

    def finish_step(self) -> dict[str, float]:
        """Closes the streamed step: normalises the accumulated gradient by the whole step's counts, clips it,
        steps the optimizer (skipped, as in :meth:`train_step`, without loss tokens or with a non-finite loss or
        gradient) and increases ``version`` by one. Returns the metrics :meth:`train_step` would. Raises
        ``RuntimeError`` outside a streamed step."""
        st = self._stream
        if st is None:
            raise RuntimeError("finish_step() outside a streamed step: call start_step() first")
        self._stream = None
        self._apply_update(st.grad, st.sums, self.config.loss.effective_aggregation)
        return self._finish(st.sums, st.sampler, st.t_start)

    def abort_step(self) -> None:
        """Drops the open streamed step (accumulated gradients and metrics); weights and ``version`` stay. A no-op
        when no step is open."""
        self._stream = None
        self.optimizer.zero_grad(set_to_none=True)

    # ---------------------------------------------------------------------------------- weights, checkpoints
    def state_dict_for_inference(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """Returns ``{name: tensor}`` with the HF parameter/buffer names of the model (``model.layers.0...``,
        ``lm_head.weight`` also present when tied), detached CPU copies, safe to ship while the trainer keeps
        stepping. Floating tensors are cast to ``dtype``; by default to bfloat16 when the trainer computes in
        bfloat16 (what the engine runs; half the bytes of the float32 master weights), else left float32.
        Under FSDP this gathers the shards (a collective: every rank must call it) and only rank 0 gets the
        tensors (the others get ``{}``)."""
        if dtype is None and self._compute_dtype == torch.bfloat16:
            dtype = torch.bfloat16
        out: dict[str, Tensor] = {}
        for name, t in self._full_model_state().items():
            t = t.detach()
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            out[name] = t.to("cpu", copy=True).contiguous()
        return out

    def _full_model_state(self) -> dict[str, Tensor]:
        if self._sharding == "fsdp":
            from agentrl.trainer.dp_rank import full_state_dict

            return full_state_dict(self.model)
        return self.model.state_dict()

    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        """Writes model (HF ``save_pretrained`` under ``path/model``, float32, with the source model's tokenizer
        files), optimizer state, RNG states (python, numpy, torch, CUDA), ``optimizer_steps``, ``version`` and the
        config to ``path``, atomically (see :mod:`agentrl.trainer.checkpoint`): a crash mid-save leaves the previous
        checkpoint (or none), never a partial one. An existing ``path`` is replaced. Returns ``path``. Raises
        ``RuntimeError`` while a streamed step is open (its gradients are not part of a checkpoint). As a
        data-parallel rank: every rank must call it; rank 0 writes the whole model and optimizer (replicated: its
        own; FSDP: gathered from the shards), with ``world_size`` and ``sharding`` in ``trainer_state.json``, and
        RNG states of rank 0 (every rank restores those)."""
        self._check_no_stream("save_checkpoint")
        state = {"optimizer_steps": self._optimizer_steps, "version": self._version, "config": to_dict(self.config),
                 "world_size": self._world, "sharding": self._sharding}
        if self._sharding == "fsdp":
            from agentrl.trainer.dp_rank import save_sharded

            return save_sharded(path, self.model, self.optimizer, self.model_path, state)
        if self._rank != 0:
            return Path(path)  # replicate: every rank holds the same model and optimizer state; rank 0 writes it
        return ckpt.save(path, model=self.model, optimizer=self.optimizer, source_model_path=self.model_path,
                         state=state)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores model weights, optimizer state, RNG states, ``optimizer_steps`` and ``version`` from a
        directory written by :meth:`save_checkpoint` (or its moved-aside copy after a crash between the renames
        of a replacing save). Returns the saved state (``optimizer_steps``, ``version``, ``config`` as a dict,
        ...). Raises ``FileNotFoundError`` / ``ValueError`` for a missing or incompatible checkpoint, including one
        saved with another number of data-parallel ranks (or another sharding)."""
        self._check_no_stream("load_checkpoint")
        where, saved = ckpt.read_state(path)
        saved_world = int(saved.get("world_size", 1))
        if saved_world != self._world:
            raise ValueError(
                f"{where}: the checkpoint was saved by {saved_world} trainer rank(s) but this run has "
                f"trainer.world_size={self._world}; resume with trainer.world_size={saved_world} (a checkpoint holds "
                f"the whole model, but its optimizer and RNG states belong to the rank layout that saved it)")
        if self._sharding == "fsdp":
            from agentrl.trainer.dp_rank import load_sharded

            if saved.get("sharding") != "fsdp":
                raise ValueError(f"{where}: saved with trainer.sharding {saved.get('sharding')!r}, this run uses "
                                 "fsdp: resume with the sharding that saved it")
            load_sharded(where, self.model, self.optimizer)
            state = saved
        else:
            if saved.get("sharding") == "fsdp":  # its optimizer state is keyed by parameter names, not indices
                raise ValueError(f"{where}: saved with trainer.sharding 'fsdp', this run uses {self._sharding!r}: "
                                 "resume with trainer.sharding=fsdp")
            state = ckpt.load(where, model=self.model, optimizer=self.optimizer, device=self.device)
        self._optimizer_steps = int(state["optimizer_steps"])
        self._version = int(state["version"])
        self._last_lr = None
        return state
