"""Per-step bookkeeping that stays correct when a step is split: across micro-batches, across streamed
``accumulate`` calls, and across data-parallel ranks (:mod:`agentrl.trainer.dp_rank`).

Everything a step reports or divides by is kept as a sum (or a maximum) until the step ends:

- :class:`StepSums`: metric numerators with their weights (``sum(value * weight)`` and ``sum(weight)``), additive
  totals (losses before normalisation, counts) and maxima. Combining two parts is adding their sums, so the result
  does not depend on how the batch was split.
- :class:`Reducer`: turns one worker's sums into whole-batch sums. :class:`LocalReducer` (one trainer) returns
  them unchanged; a data-parallel trainer supplies one that all-reduces (SUM / MAX) across ranks. The trainer
  calls it in exactly two places: for the loss normaliser before the optimizer step
  (``Trainer._global_counts``) and for the reported metrics at the end of a step.
- :class:`RecordSampler`: a reservoir sample of trajectories whose log-probs the step keeps for the viewer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Protocol

import torch
from torch import Tensor

from agentrl.trainer.batching import Seq


class Reducer(Protocol):
    """Combines per-worker values into whole-batch values: ``sum`` adds each key over the workers, ``max`` takes
    its maximum; every worker calls each method the same number of times, in the same order. Workers may hold
    different keys (a metric that one shard never produced): a key missing on a worker counts as 0 for ``sum`` and
    is ignored by ``max``, and the result holds the union of keys (a distributed reducer all-gathers the key sets
    first, then all-reduces one tensor in a fixed key order)."""

    def sum(self, values: dict[str, float]) -> dict[str, float]: ...

    def max(self, values: dict[str, float]) -> dict[str, float]: ...


class LocalReducer:
    """The single-worker :class:`Reducer`: values are already whole-batch values."""

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def max(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)


class StepSums:
    """Additive accumulators of one step. ``mean(key)`` keys report ``sum / weight``; ``total(key)`` keys report
    their sum (or, via :meth:`result`'s ``divide``, their sum over a normaliser); ``max``/``min`` keys their
    extreme."""

    def __init__(self) -> None:
        self.num: dict[str, float] = {}
        self.den: dict[str, float] = {}
        self.totals: dict[str, float] = {}
        self.maxima: dict[str, float] = {}
        # Optimizer steps taken / skipped in this step: decided from reduced counts, so identical on every worker
        # and never reduced again.
        self.optimizer_steps = 0
        self.skipped_steps = 0

    def add_mean(self, key: str, value: float, weight: float) -> None:
        if weight <= 0:
            return
        self.num[key] = self.num.get(key, 0.0) + value * weight
        self.den[key] = self.den.get(key, 0.0) + weight

    def add_total(self, key: str, value: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + value

    def add_max(self, key: str, value: float) -> None:
        self.maxima[key] = max(self.maxima.get(key, -math.inf), value)

    def add_min(self, key: str, value: float) -> None:
        # stored as a maximum of the negated value, so one MAX reduction covers both
        self.add_max("\0min:" + key, -value)

    def result(self, reducer: Reducer, *, divide: dict[str, float] | None = None) -> dict[str, float]:
        """Whole-batch metrics: means, totals (``divide[key]`` divides a total, e.g. a loss sum by the number of
        optimizer steps), maxima and minima, reduced through ``reducer`` (one SUM and one MAX call). Keys present
        on any worker are reported."""
        sums = reducer.sum({**{"n:" + k: v for k, v in self.num.items()}, **{"d:" + k: v for k, v in self.den.items()},
                            **{"t:" + k: v for k, v in self.totals.items()}})
        maxima = reducer.max(self.maxima)
        out: dict[str, float] = {}
        for key, v in sums.items():
            kind, k = key[:2], key[2:]
            if kind == "n:":
                out[k] = v / max(sums.get("d:" + k, 0.0), 1e-12)
            elif kind == "t:":
                d = (divide or {}).get(k)
                out[k] = v / max(d, 1e-12) if d is not None else v
        for k, v in maxima.items():
            if k.startswith("\0min:"):
                out[k[5:]] = -v
            else:
                out[k] = v
        return out


def add_batch_stats(sums: StepSums, seqs: Iterable[Seq], version: int) -> None:
    """Reward, advantage, size and staleness statistics of prepared sequences (before any update), as sums:
    ``reward/{mean,std,min,max}``, ``adv/{mean,std,min,max,zero_frac}``, ``batch/{num_seqs,num_tokens,loss_tokens,
    mean_seq_len}``, ``staleness/{mean,max,hist/<k>}`` (share of loss tokens ``k`` versions old)."""
    for s in seqs:
        # a per-token advantage counts as its mean over the sequence's loss tokens (one value per sequence)
        per_token = isinstance(s.adv, Tensor)
        adv = float((s.adv * s.mask).sum() / s.mask.sum().clamp(min=1)) if per_token else float(s.adv)
        for name, x in (("reward", s.reward), ("adv", adv)):
            sums.add_mean(f"{name}/mean", x, 1.0)
            sums.add_mean(f"\0sq:{name}", x * x, 1.0)
            sums.add_min(f"{name}/min", x)
            sums.add_max(f"{name}/max", x)
        zero = bool((s.adv.abs() * s.mask).max() < 1e-8) if per_token else abs(adv) < 1e-8
        sums.add_mean("adv/zero_frac", float(zero), 1.0)
        sums.add_total("batch/num_seqs", 1.0)
        sums.add_total("batch/num_tokens", float(s.length))
        sums.add_mean("batch/mean_seq_len", float(s.length), 1.0)
        vers = s.versions[s.mask > 0]
        sums.add_total("batch/loss_tokens", float(vers.numel()))
        if vers.numel():
            stale = version - vers
            sums.add_mean("staleness/mean", float(stale.float().mean()), float(stale.numel()))
            sums.add_max("staleness/max", float(stale.max()))
            values, counts = torch.unique(stale, return_counts=True)
            for v, c in zip(values.tolist(), counts.tolist()):
                sums.add_total(f"\0hist:{int(v)}", float(c))


def finish_batch_stats(out: dict[str, float]) -> dict[str, float]:
    """Turns the helper sums of :func:`add_batch_stats` into ``*/std`` and ``staleness/hist/<k>`` in ``out``."""
    for name in ("reward", "adv"):
        sq = out.pop(f"\0sq:{name}", None)
        if sq is not None and f"{name}/mean" in out:
            out[f"{name}/std"] = math.sqrt(max(sq - out[f"{name}/mean"] ** 2, 0.0))
    hist = {k: out.pop(k) for k in [k for k in out if k.startswith("\0hist:")]}
    total = sum(hist.values())
    for k, c in hist.items():
        out[f"staleness/hist/{k[6:]}"] = c / total if total else 0.0
    return out


class RecordSampler:
    """Keeps a uniform sample of at most ``k`` trajectories offered one by one (reservoir sampling), with their
    log-probs. The decision comes before the copy, so a trajectory not kept costs nothing."""

    def __init__(self, k: int, rng: random.Random) -> None:
        self.k = k
        self.rng = rng
        self.seen = 0
        self.records: list[dict] = []

    def slot(self) -> int | None:
        """Call once per offered trajectory: returns the index its record goes to, or ``None`` (not kept)."""
        if self.k <= 0:
            return None
        self.seen += 1
        if len(self.records) < self.k:
            self.records.append({})
            return len(self.records) - 1
        j = self.rng.randrange(self.seen)
        return j if j < self.k else None

    def put(self, slot: int, traj_id: str, version: int, logprobs: Tensor) -> None:
        self.records[slot] = {"trajectory_id": traj_id, "version": int(version),
                              "logprobs": [float(x) for x in logprobs.detach().float().cpu().tolist()]}

    def offer(self, seqs: list[Seq], version: int, logp: Tensor) -> None:
        """Offers each of ``seqs`` with its row of ``logp: [b, T]`` (log-probs of the weights of ``version``)."""
        for j, s in enumerate(seqs):
            slot = self.slot()
            if slot is not None:
                self.put(slot, s.traj_id, version, logp[j, : s.length - 1])

    def take(self) -> list[dict]:
        return [r for r in self.records if r]
