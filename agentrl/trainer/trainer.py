"""The trainer: a transformers causal LM with float32 master weights, AdamW, and micro-batched policy-gradient steps
on trajectories. Plain Python (no Ray): :mod:`agentrl.trainer.actor` wraps it as a Ray actor.

Two lifetimes, two classes. :class:`Trainer` lives for the run: the model (and frozen reference model), the
optimizer, ``version`` and ``optimizer_steps``, the data-parallel rank, the log-prob passes, checkpoints and the
weights for the engine. Each update is one :class:`~agentrl.trainer.policy_step.PolicyStep` (validation, proximal /
reference passes, micro-batched backward, normalisation, optimizer step(s), metrics): :meth:`Trainer.train_step`
feeds it the whole batch at once, a streamed step (:meth:`Trainer.start_step` / :meth:`Trainer.accumulate` /
:meth:`Trainer.finish_step`) one group at a time, through the same code. Log-probs come from the last hidden states
in vocabulary chunks (:mod:`.logprobs`), never as a full ``[tokens, vocabulary]`` tensor.

Data parallelism: :meth:`Trainer.enable_data_parallel` makes the trainer one rank of a ``torch.distributed`` group;
the step's counts then pass through :meth:`Trainer._global_counts` and its gradients through
:meth:`Trainer._reduce_gradients`, and every rank runs every optimizer step and every collective, even with an
empty shard.

Versions. ``version`` counts weight updates: it starts at 0 (or the checkpoint's) and increases by exactly one per
``train_step``, ``sft_step`` or ``finish_step`` call, whatever ``num_mini_batches``/``ppo_epochs`` are, so the
weights after the call are "version v" for the engine. ``optimizer_steps`` counts optimizer steps.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentrl.config import from_dict
from agentrl.trainer import checkpoint as ckpt
from agentrl.trainer.batching import Seq
from agentrl.trainer.checkpoint import find_latest_checkpoint  # noqa: F401  (public API, re-exported)
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.model import ModelRunner, choose_logprob_impl, configure_layers, has_active_dropout
from agentrl.trainer.model import load_causal_lm, select_device
from agentrl.trainer.policy_step import PolicyStep
from agentrl.trainer.prefix_tree import attention_impl_for
from agentrl.trainer.step import LocalReducer, RecordSampler, Reducer
from agentrl.trajectory import Group, Trajectory

log = logging.getLogger(__name__)


class Trainer:
    """Holds the policy model (float32 parameters), its optimizer and (when ``loss.kl_coef > 0``) a frozen reference
    model.

    Construct with a validated :class:`TrainerConfig` and the path of a HF causal LM directory. Raises
    ``ValueError`` for an invalid config (naming the key). It trains alone until :meth:`enable_data_parallel`
    makes it one rank of a ``torch.distributed`` group (:mod:`agentrl.trainer.dp_rank`); ``reducer`` (default
    :class:`~agentrl.trainer.step.LocalReducer`) is the data-parallel hook: see :meth:`_global_counts`.

    One idea: the run-long state of training (model, optimizer, version, rank) and the public API over it; what
    lives for one update is :class:`~agentrl.trainer.policy_step.PolicyStep`'s, forward passes are
    :class:`~agentrl.trainer.model.ModelRunner`'s and checkpoints :mod:`agentrl.trainer.checkpoint`'s.
    """

    def __init__(self, config: TrainerConfig, model_path: str | os.PathLike) -> None:
        if isinstance(config, dict):
            config = from_dict(TrainerConfig, config, "trainer config")
        config.validate()
        self.config = config
        self.model_path = Path(model_path)
        self.device = select_device(config)
        self._compute_dtype = torch.bfloat16 if config.compute_dtype == "bfloat16" else torch.float32

        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)

        # Master weights are float32 whatever config.dtype says: bf16 parameters under AdamW at small learning
        # rates lose most updates to rounding (issue 12: 1.9 % of weights changed after 10 steps at lr 1e-6).
        # the tree layout's attention on CUDA is flex_attention with a block mask (prefix_tree.attention_impl_for)
        attn = attention_impl_for(self.device, config.prefix_tree)
        self.model = load_causal_lm(self.model_path, dtype=torch.float32, device=self.device,
                                    disable_dropout=config.disable_dropout, attn_implementation=attn)
        if config.lora is not None:
            from agentrl.trainer import lora

            self.model = lora.wrap(self.model, config.lora, self.model_path)  # base frozen: adapters only train
        self._has_dropout = has_active_dropout(self.model)
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        impl = choose_logprob_impl(config, self.model, self.vocab_size, self.device)
        self.runner = ModelRunner(config, self.model, self.device, impl, self._compute_dtype)
        configure_layers(self.model, config)
        self.ref_model = None
        if config.loss.kl_coef > 0:
            # Frozen: no optimizer steps it, so it is stored in the compute dtype.
            self.ref_model = load_causal_lm(self.model_path, dtype=self._compute_dtype, device=self.device,
                                            disable_dropout=True, attn_implementation=attn).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)

        self.optimizer = self._make_optimizer()
        self.reducer: Reducer = LocalReducer()
        # Data parallelism (enable_data_parallel): this rank, the number of ranks, and how the model is held
        # ("none" alone, "replicate": whole model per rank + summed gradients, "fsdp": FSDP2 shards).
        self._rank, self._world, self._sharding = 0, 1, "none"
        self._version = 0
        self._optimizer_steps = 0
        self._last_lr: float | None = None
        self._stream: PolicyStep | None = None  # the open streamed step
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
        return self.runner.impl

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

        from agentrl.trainer import dp_rank as dd

        if not dist.is_initialized():
            raise RuntimeError("enable_data_parallel: torch.distributed is not initialised")
        if self._version or self._optimizer_steps or self._stream is not None:
            raise RuntimeError("enable_data_parallel must be called before the first step")
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        mode = self.config.sharding
        if mode == "auto":
            mode = "fsdp" if self.device.type == "cuda" else "replicate"
        if mode == "fsdp" and self.config.lora is not None:
            raise ValueError("trainer.lora needs trainer.sharding: replicate (sharding: auto picks fsdp on CUDA)")
        self._sharding = mode
        self.reducer = dd.DistReducer(self.device)
        dd.broadcast_parameters(self.model)
        if mode == "fsdp":
            self.runner.shard()
            dd.shard_model(self.model, self.device, self._compute_dtype)
            self.optimizer = self._make_optimizer()  # over the sharded (DTensor) parameters

    def _lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        opt = self.config.optimizer
        if opt.warmup_steps > 0:
            return opt.lr * min(1.0, (self._optimizer_steps + 1) / opt.warmup_steps)
        return opt.lr

    # ------------------------------------------------------------------------------------------- log-probs
    def _fill_logprobs(self, seqs: list[Seq], model: torch.nn.Module, attr: str,
                       sampler: RecordSampler | None = None) -> None:
        """A no-gradient log-prob pass of ``model`` (policy or reference) setting ``seq.<attr>``; its log-probs
        are offered to ``sampler`` (the step's records)."""
        on_logp = None if sampler is None else (lambda mb, logp: sampler.offer(mb.seqs, self._version, logp))
        self.runner.fill_logprobs(seqs, model, attr, on_logp)

    def _new_sampler(self) -> RecordSampler:
        # A private RNG: sampling must not move the global RNG states that checkpoints restore.
        return RecordSampler(self.config.record_logprobs, random.Random(f"records:{self.config.seed}:{self._version}"))

    def compute_logprobs(self, batch: Sequence[Trajectory] | Sequence[Sequence[int]]) -> Tensor:
        """Returns ``logp: [B, T]`` (float32, CPU, no grad) with the current weights, where ``T = longest - 1`` and
        ``logp[i, t] = log pi(tokens_i[t+1] | tokens_i[:t+1])`` (temperature applied); 0.0 beyond each sequence.
        Accepts trajectories or plain token-id lists. Compare with a trajectory's engine log-probs as
        ``logp[i, t]`` vs ``traj.logprobs[t + 1]``. A segmented trajectory's tokens are scored within their own
        segment; ``logp`` is 0.0 at the first token of each later segment (it has no context there)."""
        return self.runner.score(batch)

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

    def _global_counts(self, local: dict[str, float]) -> dict[str, float]:
        """THE place where this worker's counts (``loss_tokens``, ``loss_seqs``, ``nonfinite``) become whole-batch
        counts: every loss normaliser comes from its result. Alone they are unchanged; a data-parallel rank's
        ``reducer`` all-reduces them (and its gradients, unnormalised sums, are summed by
        :meth:`_reduce_gradients`)."""
        return self.reducer.sum(local)

    def _reduce_gradients(self) -> None:
        """Makes ``p.grad`` the sum over all workers: an all-reduce in ``replicate`` mode; a no-op alone and under
        FSDP (which reduce-scattered them, summed, during backward)."""
        if self._sharding == "replicate":
            from agentrl.trainer.dp_rank import sum_gradients

            sum_gradients(self._params())

    def _optimizer_step(self) -> None:
        """One optimizer step on the (normalised, clipped) gradients, at the learning rate of the schedule."""
        lr = self._lr()
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self._optimizer_steps += 1
        self._last_lr = lr

    def _advance_version(self) -> int:
        self._version += 1
        return self._version

    def _check_no_stream(self, what: str) -> None:
        if self._stream is not None:
            raise RuntimeError(f"{what} while a streamed step is open: call finish_step() or abort_step() first")

    # -------------------------------------------------------------------------------------------- steps
    def train_step(
        self,
        batch: Sequence[Trajectory] | Sequence[Group],
        advantages: Sequence[float | list[float]] | None = None,
        *,
        positions: Sequence[int] | None = None,
    ) -> dict[str, float]:
        """One policy update on ``batch`` (trajectories, or groups flattened in order): a
        :class:`~agentrl.trainer.policy_step.PolicyStep` fed the whole batch at once.

        ``advantages``: one per trajectory (aligned with the flattened batch): a float for all its generated tokens,
        or a list with one value per turn (:func:`~agentrl.trainer.advantages.token_advantages`); when ``None`` they
        are computed with
        ``config.advantage`` per group (``Group`` objects, or trajectories grouped by ``group_id``). Then
        ``ppo_epochs`` x ``num_mini_batches`` optimizer steps, each normalised over its whole mini-batch and clipped
        to ``max_grad_norm``; one whose loss or gradient norm is not finite, or which has no loss token, is skipped
        (``train/skipped_steps``). The proximal log-probs are those of the weights at step start. ``version``
        increases by one. ``positions`` (data-parallel ranks): each trajectory's index in the whole batch, so that
        every rank's mini-batches are its shares of the single trainer's.

        Returns flat float metrics: ``loss``, ``loss/policy``, ``loss/kl``, ``kl/ref``, ``grad_norm``, ``lr`` (of
        the step's last optimizer step), ``entropy``, ``ratio/clip_frac``, ``ratio/mean``, ``is/weight_mean``,
        ``is/weight_max``, ``is/truncated_frac``, ``is/masked_frac``, ``mismatch/kl_k1``, ``mismatch/kl_k3``
        (``KL(mu || pi_prox)``), ``staleness/mean``, ``staleness/max``, ``staleness/hist/<k>`` (share of loss
        tokens ``k`` versions old), ``reward/{mean,std,min,max}``, ``adv/{mean,std,min,max,zero_frac}``,
        ``batch/{num_seqs,num_tokens,loss_tokens,mean_seq_len,dropped_invalid,truncated_seqs}``,
        ``batch/{tree_tokens,flat_tokens,tree_ratio}`` (``prefix_tree``: tokens the training forwards computed, the
        tokens the flat layout computes in them, their ratio), ``perf/{step_s,prox_s,tokens_per_s}``,
        ``train/skipped_steps``, ``version``, ``optimizer_steps`` (keys
        absent when they do not apply).
        """
        self._check_no_stream("train_step")
        return self._whole_step(PolicyStep(self, "train_step"), batch, advantages, positions)

    def sft_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One supervised step: mean negative log-likelihood over all loss-mask tokens of the batch (micro-batched,
        gradient-clipped), for warm starts on scripted demonstrations. ``version`` increases by one. Returns
        ``sft/nll`` (before the update), ``grad_norm``, ``lr``, ``batch/*``, ``perf/step_s``, ``perf/tokens_per_s``,
        ``version``, ``optimizer_steps``, ``train/skipped_steps``."""
        self._check_no_stream("sft_step")
        return self._whole_step(PolicyStep(self, "sft_step", sft=True), list(trajectories), None)

    def _whole_step(self, step: PolicyStep, batch: Sequence[Trajectory] | Sequence[Group],
                    advantages: Sequence[float | list[float]] | None,
                    positions: Sequence[int] | None = None) -> dict[str, float]:
        try:
            step.add(batch, advantages, positions)
        except BaseException:
            step.abort()
            raise
        return step.finish()

    def start_step(self) -> None:
        """Opens a streamed step: :meth:`accumulate` groups as they arrive, then :meth:`finish_step`.

        The result equals one :meth:`train_step` on all accumulated groups (same parameters up to float rounding):
        both feed one :class:`~agentrl.trainer.policy_step.PolicyStep`, whose micro-batch losses are sums of
        per-token or per-sequence terms whose whole-batch normaliser is only applied to the accumulated gradient
        at the end. Forward and backward can run as groups arrive only with ``num_mini_batches: 1`` and
        ``ppo_epochs: 1`` (the weights do not move until the end, so the proximal policy is the current one);
        several mini-batches or epochs need the whole batch before the first optimizer step and are refused
        (``ValueError``). Advantages are computed per :meth:`accumulate` call, so each call must carry whole
        groups (a group seen again in the same step is refused). Raises ``RuntimeError`` if a streamed step is
        already open."""
        self._check_no_stream("start_step")
        cfg = self.config
        if cfg.num_mini_batches != 1 or cfg.ppo_epochs != 1:
            raise ValueError(
                f"streamed accumulation needs num_mini_batches: 1 and ppo_epochs: 1 (got {cfg.num_mini_batches} and "
                f"{cfg.ppo_epochs}): several optimizer steps per batch need the whole batch first; use train_step")
        self._stream = PolicyStep(self, "streamed step")

    def accumulate(self, batch: Sequence[Trajectory] | Sequence[Group],
                   advantages: Sequence[float | list[float]] | None = None) -> dict[str, float]:
        """Adds whole groups to the open streamed step: forward and backward per micro-batch, gradients kept
        unnormalised. ``batch`` and ``advantages`` as in :meth:`train_step`; invalid trajectories, even a whole
        group of them, are dropped and counted as :meth:`train_step` drops them. Returns ``accumulate/seqs``,
        ``accumulate/loss_tokens`` and ``accumulate/s`` of this call. Raises ``RuntimeError`` outside a streamed
        step and ``ValueError`` for an empty batch or a group already accumulated in this step (nothing of that
        call is accumulated then)."""
        if self._stream is None:
            raise RuntimeError("accumulate() outside a streamed step: call start_step() first")
        return self._stream.add(batch, advantages)

    def finish_step(self) -> dict[str, float]:
        """Closes the streamed step: normalises the accumulated gradient by the whole step's counts, clips it,
        steps the optimizer (skipped, as in :meth:`train_step`, without loss tokens or with a non-finite loss or
        gradient) and increases ``version`` by one. Returns the metrics :meth:`train_step` would. Raises
        ``RuntimeError`` outside a streamed step and, like :meth:`train_step`, ``ValueError`` when no accumulated
        trajectory was trainable (the step is closed, the weights stay)."""
        step, self._stream = self._stream, None
        if step is None:
            raise RuntimeError("finish_step() outside a streamed step: call start_step() first")
        return step.finish()

    def abort_step(self) -> None:
        """Drops the open streamed step (accumulated gradients and metrics); weights and ``version`` stay. A no-op
        when no step is open."""
        step, self._stream = self._stream, None
        if step is not None:
            step.abort()
        self.optimizer.zero_grad(set_to_none=True)

    # ---------------------------------------------------------------------------------- weights, checkpoints
    def state_dict_for_inference(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """The model's weights for the engine: ``{hf_name: detached CPU tensor}`` (see
        :func:`agentrl.trainer.checkpoint.inference_state_dict`; by default bfloat16 when the trainer computes in
        bfloat16). Under FSDP a collective that only rank 0 gets the tensors from. With ``trainer.lora`` only the
        adapter (:func:`agentrl.trainer.lora.adapter_state_dict`: PEFT's file names)."""
        return ckpt.inference_state_dict(self, dtype)

    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        """Writes model, optimizer, RNG states, ``optimizer_steps``, ``version`` and the config to ``path``,
        atomically (see :func:`agentrl.trainer.checkpoint.save_trainer`); returns ``path``. Raises
        ``RuntimeError`` while a streamed step is open. As a data-parallel rank every rank must call it."""
        self._check_no_stream("save_checkpoint")
        return ckpt.save_trainer(self, path)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores what :meth:`save_checkpoint` wrote (see :func:`agentrl.trainer.checkpoint.load_trainer`) and
        returns the saved state. Raises ``FileNotFoundError`` / ``ValueError`` for a missing or incompatible
        checkpoint, including one saved with another number of data-parallel ranks (or another sharding)."""
        self._check_no_stream("load_checkpoint")
        state = ckpt.load_trainer(self, path)
        self._optimizer_steps = int(state["optimizer_steps"])
        self._version = int(state["version"])
        self._last_lr = None
        return state
