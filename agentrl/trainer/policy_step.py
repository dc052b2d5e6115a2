"""One weight update of the :class:`~agentrl.trainer.trainer.Trainer`, from its first batch to its optimizer step(s).

A :class:`PolicyStep` lives for one version ``v -> v + 1``. It is fed batches with :meth:`PolicyStep.add` and closed
with :meth:`PolicyStep.finish`; the trainer's ``train_step`` is ``add(whole batch)`` then ``finish()``, a streamed
step (``start_step`` / ``accumulate`` / ``finish_step``) is ``add(group)`` per group then ``finish()``: one code
path. Flow of ``add``: validate and tensorise the trajectories (:mod:`.batching`), record the batch statistics,
then either

- *eager* (one optimizer step per update: ``num_mini_batches: 1``, ``ppo_epochs: 1``, and every SFT step): the
  proximal/reference passes and the forward/backward over micro-batches run at once, accumulating unnormalised
  gradients; the weights do not move before ``finish``, so the proximal policy is the current one for every batch;
- *deferred* (several optimizer steps): the sequences are held, and ``finish`` runs the passes over all of them and
  then ``ppo_epochs`` x ``num_mini_batches`` optimizer steps (it needs the whole batch before the first).

Normalisation. Micro-batch losses are *sums* of per-token (or per-sequence) terms; their gradients accumulate
unnormalised and are divided by the optimizer batch's normaliser (loss tokens for ``token_mean``, trajectories with
a loss token for the sequence means) just before clipping and stepping. The counts pass through the trainer's
``_global_counts`` (the one place a data-parallel rank turns its counts into all-reduced sums); everything reported
is kept as sums in :class:`~agentrl.trainer.step.StepSums` and reduced the same way. Because nothing is divided
before the end, how a step is fed (whole, by groups, over ranks, in micro-batches) does not change the update.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from agentrl.trainer.advantages import compute_advantages
from agentrl.trainer.batching import MicroBatch, Seq, even_parts, prepare_sequences, units
from agentrl.trainer.losses import Metrics, count_sequences, policy_loss
from agentrl.trainer.step import RecordSampler, StepSums, add_batch_stats, finish_batch_stats
from agentrl.trajectory import Group, Trajectory

if TYPE_CHECKING:
    from agentrl.trainer.trainer import Trainer

log = logging.getLogger(__name__)

# Loss terms reported per optimizer step (divided by the step's normaliser, then averaged over optimizer steps).
_LOSS_KEYS_PREFIX = ("loss", "sft/nll")

LossFn = Callable[[MicroBatch, Tensor, "Tensor | None"], tuple[Tensor, Metrics]]


@dataclass
class _GradState:
    """One optimizer step's gradient accumulation on this worker: unnormalised loss sums and the counts the
    normaliser is made of."""

    loss_tokens: float = 0.0
    loss_seqs: float = 0.0
    finite: bool = True
    loss_sums: dict[str, float] = field(default_factory=dict)


def flatten(batch: Sequence[Trajectory] | Sequence[Group]) -> list[Trajectory]:
    if batch and isinstance(batch[0], Group):
        return [t for g in batch for t in g.trajectories]  # type: ignore[union-attr]
    return list(batch)  # type: ignore[arg-type]


class PolicyStep:
    """One update in progress on one trainer (see the module docstring). ``sft``: a supervised step (mean negative
    log-likelihood of the loss-mask tokens, one optimizer step) instead of the configured policy loss. The
    trainer's gradients belong to the step from construction until :meth:`finish` or :meth:`abort`."""

    def __init__(self, trainer: Trainer, what: str, *, sft: bool = False) -> None:
        self.tr, self.what = trainer, what
        cfg = trainer.config
        self.sft = sft
        self.eager = sft or (cfg.num_mini_batches == 1 and cfg.ppo_epochs == 1)
        self.t_start = time.perf_counter()
        self.comm_at_start = self._comm_seconds()
        self.sums = StepSums()
        self.sampler = trainer._new_sampler()
        self.grad = _GradState()
        self.groups: set[str] = set()
        self.calls = 0
        self.prepared = 0  # valid sequences added (with or without a loss token)
        self.held: list[Seq] = []  # deferred: the sequences with a loss token, until finish
        trainer.optimizer.zero_grad(set_to_none=True)

    def _comm_seconds(self) -> float:
        if self.tr._world == 1:
            return 0.0
        from agentrl.trainer.dp_rank import comm_seconds

        return comm_seconds()

    # ------------------------------------------------------------------------------------------ feeding
    def add(self, batch: Sequence[Trajectory] | Sequence[Group],
            advantages: Sequence[float | list[float]] | None = None,
            positions: Sequence[int] | None = None) -> dict[str, float]:
        """Adds whole groups (or trajectories with advantages) to the step; eager steps run their forward and
        backward now. Invalid trajectories are dropped and counted (``batch/dropped_invalid``), a whole group of
        them too: whether the step has anything to train is decided by :meth:`finish`, over everything added.
        ``positions``: each trajectory's index in the whole batch when this is a data-parallel rank's shard (the
        mini-batches are cut from the whole batch). Returns ``accumulate/{seqs,loss_tokens,s}`` of this call.
        Raises ``ValueError`` for an empty batch (alone), misaligned advantages or a group already added; nothing
        of a refused call is added."""
        t0 = time.perf_counter()
        if self.calls and not self.eager:
            raise RuntimeError("a step with several optimizer steps takes its whole batch in one add()")
        trajs = flatten(batch)
        gids: set[str] = set()
        if not self.sft:
            gids = ({g.id for g in batch} if trajs and isinstance(batch[0], Group)  # type: ignore[union-attr]
                    else {t.group_id for t in trajs})
            if advantages is None and gids & self.groups:
                raise ValueError(f"group {sorted(gids & self.groups)[0]!r} was already accumulated in this step: "
                                 "advantages are per group, so each accumulate() call must carry whole groups")
            if advantages is None and trajs:
                advantages = compute_advantages(batch, self.tr.config.advantage)  # type: ignore[arg-type]
        seqs, info = self._prepare(trajs, advantages, positions)
        self.groups |= gids
        self.calls += 1
        self.prepared += len(seqs)
        for k, v in info.items():
            self.sums.add_total(k, v)
        if self.sft:
            self.sums.add_total("batch/num_seqs", float(len(seqs)))
            self.sums.add_total("batch/num_tokens", float(sum(s.length for s in seqs)))
        else:
            add_batch_stats(self.sums, seqs, self.tr.version)
        seqs = [s for s in seqs if s.loss_tokens > 0]  # nothing to learn from the others; skip their forward
        if self.sft:
            self.sums.add_total("batch/loss_tokens", float(sum(s.loss_tokens for s in seqs)))
        if self.eager:
            prox_pass = self._passes(seqs)
            self._backward(seqs, self.grad, sampler=None if prox_pass else self.sampler)
        else:
            self.held += seqs
        return {"accumulate/seqs": float(len(seqs)), "accumulate/loss_tokens": float(sum(s.loss_tokens for s in seqs)),
                "accumulate/s": time.perf_counter() - t0}

    def _prepare(self, trajs: list[Trajectory], advantages: Sequence[float | list[float]] | None,
                 positions: Sequence[int] | None) -> tuple[list[Seq], dict[str, float]]:
        """Validated, tensorised sequences of this worker's part of the batch (see ``prepare_sequences``); an
        untrainable part gives none (counted as dropped). A data-parallel rank may get an empty shard: it still
        joins every collective of the step."""
        tr = self.tr
        if tr._world == 1 and not trajs:
            raise ValueError(f"{self.what} got an empty batch")
        info = {"batch/dropped_invalid": 0.0, "batch/truncated_seqs": 0.0}
        if not trajs:
            return [], info
        try:
            return prepare_sequences(trajs, advantages, vocab_size=tr.vocab_size, max_seq_len=tr.config.max_seq_len,
                                     positions=positions)
        except ValueError as e:
            if "no trainable trajectory" not in str(e):
                raise
            log.warning("%s: dropping the batch: %s", self.what, e)
            info["batch/dropped_invalid"] = float(len(trajs))
            return [], info

    def _passes(self, seqs: list[Seq]) -> bool:
        """The no-gradient passes before a backward: proximal log-probs (when the loss or the metrics need them and
        the training forward's own cannot stand in) and reference log-probs (``kl_coef > 0``). Returns whether the
        proximal pass ran (it then feeds the log-prob records)."""
        if self.sft:
            return False
        tr = self.tr
        t0 = time.perf_counter()
        # ranks decide alike (an FSDP rank without sequences still joins its peers' forward passes)
        prox_pass = (bool(seqs) or tr._world > 1) and tr._needs_prox() and not tr._prox_reusable()
        if prox_pass:
            tr._fill_logprobs(seqs, tr.model, "prox", self.sampler)
        if seqs and tr.ref_model is not None:
            tr._fill_logprobs(seqs, tr.ref_model, "ref")
        self.sums.add_total("perf/prox_s", time.perf_counter() - t0)
        return prox_pass

    # ----------------------------------------------------------------------------------------- backward
    def _loss_fn(self) -> LossFn:
        cfg = self.tr.config
        if self.sft:
            def nll(mb: MicroBatch, logp: Tensor, ent: Tensor | None) -> tuple[Tensor, Metrics]:
                return -(logp * mb.mask).sum(), Metrics()

            return nll
        prox_from_forward = self.tr._prox_reusable() and self.tr._needs_prox()

        def rl(mb: MicroBatch, logp: Tensor, ent: Tensor | None) -> tuple[Tensor, Metrics]:
            prox = logp.detach() if prox_from_forward else mb.prox
            # num_tokens = num_seqs = 1: sums; the step's normaliser divides the gradient in _apply_update
            return policy_loss(cfg.loss, logp=logp, mask=mb.mask, adv=mb.adv, prox_logp=prox, behav_logp=mb.behav,
                               reward=mb.reward, ref_logp=mb.ref, entropy=ent, num_tokens=1.0, num_seqs=1.0,
                               seq_index=mb.seq_index)

        return rl

    def _backward(self, seqs: list[Seq], grad: _GradState, sampler: RecordSampler | None = None) -> None:
        """Forward and backward over micro-batches of ``seqs``, accumulating unnormalised gradients, loss sums
        and counts into ``grad`` and token-weighted metrics into the step's sums. Stops at the first non-finite
        loss (``grad.finite`` becomes False; the optimizer step will be skipped)."""
        tr, cfg = self.tr, self.tr.config
        fsdp = tr.sharding == "fsdp"
        if not grad.finite and not fsdp:
            return
        loss_fn, loss_key = self._loss_fn(), "sft/nll" if self.sft else "loss"
        entropy = not self.sft and (cfg.compute_entropy or cfg.loss.entropy_coef > 0)
        entropy_grad = not self.sft and cfg.loss.entropy_coef > 0
        tr.model.train()
        for group in tr.runner.micro_batches(seqs):
            if not group or not grad.finite:  # FSDP: keep this rank in its peers' collectives
                tr.runner.dummy_pass(tr.model, backward=True)
                continue
            mb = tr.runner.collate(group)
            if cfg.prefix_tree:
                self.sums.add_total("batch/tree_tokens", float(mb.input_ids.numel()))
                self.sums.add_total("batch/flat_tokens", float(mb.num_tokens))
            logp, ent = tr.runner.forward(tr.model, mb, entropy=entropy, entropy_grad=entropy_grad)
            if sampler is not None:
                sampler.offer(mb.seqs, tr.version, logp.detach())
            loss, m = loss_fn(mb, logp, ent)
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
            grad.loss_seqs += float(count_sequences(mb.mask, mb.seq_index))
            grad.loss_sums[loss_key] = grad.loss_sums.get(loss_key, 0.0) + float(loss.detach())
            weights = getattr(m, "weights", {})
            for k, v in m.items():
                if k.startswith("loss/"):
                    grad.loss_sums[k] = grad.loss_sums.get(k, 0.0) + v
                elif k.endswith("_max"):
                    self.sums.add_max(k, v)
                else:
                    self.sums.add_mean(k, v, weights.get(k, w))

    # ------------------------------------------------------------------------------------------ closing
    def _apply_update(self, grad: _GradState) -> bool:
        """Normalises the accumulated gradient by the whole optimizer batch's normaliser, clips it and steps.
        Returns whether an optimizer step happened (not for no loss token, a non-finite loss or gradient norm)."""
        tr, cfg = self.tr, self.tr.config
        aggregation = "token_mean" if self.sft else cfg.loss.effective_aggregation
        counts = tr._global_counts({"loss_tokens": grad.loss_tokens, "loss_seqs": grad.loss_seqs,
                                    "nonfinite": 0.0 if grad.finite else 1.0})
        params = tr._params()
        denom = counts["loss_tokens"] if aggregation == "token_mean" else counts["loss_seqs"]
        ok = counts["nonfinite"] == 0 and counts["loss_tokens"] > 0
        gnorm = math.nan
        if ok:
            tr._reduce_gradients()
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
            tr._optimizer_step()
            for k, v in grad.loss_sums.items():
                self.sums.add_total(k, v / denom)
            self.sums.add_mean("grad_norm", gnorm, 1.0)
            self.sums.optimizer_steps += 1
        else:
            self.sums.skipped_steps += 1
        tr.optimizer.zero_grad(set_to_none=True)
        return ok

    def _mini_batches(self, seqs: list[Seq]) -> list[list[Seq]]:
        """The single trainer's mini-batches, each as this worker's share: the trajectories with a loss token, in
        batch order, cut into ``num_mini_batches`` consecutive parts of near-equal count. A data-parallel rank
        learns which trajectories are trainable on every rank (their batch positions, a union through the
        reducer), so every rank cuts the same parts and takes every optimizer step (each is a collective), even
        with an empty share."""
        mine = {u[0].unit: u for u in units(seqs)}
        everyone = sorted(int(p) for p in self.tr.reducer.sum({str(p): 1.0 for p in mine}))
        return [[s for p in part if p in mine for s in mine[p]]
                for part in even_parts(everyone, self.tr.config.num_mini_batches)]

    def _optimizer_steps(self) -> None:
        """Deferred: the passes over the whole batch, then ``ppo_epochs`` x ``num_mini_batches`` optimizer steps."""
        tr, cfg = self.tr, self.tr.config
        seqs, self.held = self.held, []
        prox_pass = self._passes(seqs)
        mini = self._mini_batches(seqs)
        first = True
        for _ in range(cfg.ppo_epochs):
            for mb_seqs in mini:
                grad = _GradState()
                tr.optimizer.zero_grad(set_to_none=True)
                self._backward(mb_seqs, grad, sampler=self.sampler if first and not prox_pass else None)
                first = False
                self._apply_update(grad)
        if not mini:
            self.sums.skipped_steps += 1

    def finish(self) -> dict[str, float]:
        """Takes the step's optimizer step(s) and returns its metrics (see ``Trainer.train_step``); the trainer's
        ``version`` increases by one. Raises ``ValueError`` (on every rank alike) when nothing added was
        trainable; the step is then dropped and the trainer left as it was."""
        tr = self.tr
        if tr.reducer.sum({"seqs": float(self.prepared)}).get("seqs", 0.0) == 0:
            self.abort()
            where = f" on any of the {tr._world} ranks" if tr._world > 1 else ""
            raise ValueError(f"{self.what}: no trainable trajectory in the step{where} "
                             "(every trajectory was invalid; see the warnings)")
        if self.eager:
            self._apply_update(self.grad)
        else:
            self._optimizer_steps()
        steps = self.sums.optimizer_steps
        divide = {k: float(max(steps, 1)) for k in self.sums.totals if k.startswith(_LOSS_KEYS_PREFIX)}
        out = finish_batch_stats(self.sums.result(tr.reducer, divide=divide))
        out["train/skipped_steps"] = float(self.sums.skipped_steps)
        out["lr"] = tr._last_lr if steps > 0 and tr._last_lr is not None else tr._lr()
        version = tr._advance_version()
        elapsed = time.perf_counter() - self.t_start
        out["perf/step_s"] = elapsed
        if tr._world > 1:
            # this rank's seconds in collectives during the step (waiting for a slower rank included)
            out["perf/comm_s"] = self._comm_seconds() - self.comm_at_start
        out["perf/tokens_per_s"] = out.get("batch/num_tokens", 0.0) / max(elapsed, 1e-9)
        if out.get("batch/flat_tokens"):
            out["batch/tree_ratio"] = out["batch/tree_tokens"] / out["batch/flat_tokens"]
        out["version"] = float(version)
        out["optimizer_steps"] = float(tr.optimizer_steps)
        tr._records = self.sampler.take()
        return out

    def abort(self) -> None:
        """Drops the step's gradients and sums; weights and version stay."""
        self.held = []
        self.tr.optimizer.zero_grad(set_to_none=True)
