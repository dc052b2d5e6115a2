"""The tensor-level terms the policy losses (:mod:`agentrl.trainer.losses`) are built from: masked means, the
batch aggregation, importance ratios at token / sequence / geometric level, truncated IS weights, the ratio band,
KL estimators and the engine/trainer mismatch metrics. Shapes and notation as in :mod:`agentrl.trainer.losses`.

Sequences are trajectories: with ``seq_index: [B]`` the rows sharing a value are the segments of one trajectory,
and :func:`per_sequence` / :func:`count_sequences` make every sequence-level term span all of them.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
ISLevel = Literal["token", "sequence", "geometric"]

# Raw IS weights are logged capped here so a wildly off-policy token cannot put inf/NaN in the metrics.
LOG_METRIC_CAP = math.log(1e6)
# k3's log-ratio and value bounds (verl's "low_var_kl" clamps the same way): exp of an unbounded log-ratio overflows
# (k3 at log p = -95, log q = -1 is inf in float32) and one such token would make the whole step non-finite.
_K3_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0


def broadcast_rows(x: Tensor, like: Tensor) -> Tensor:
    """Broadcasts a ``[B]`` per-sequence value to ``[B, T]``; a ``[B, T]`` input is returned as is."""
    if x.dim() == 1:
        return x.unsqueeze(-1).expand_as(like)
    if x.shape != like.shape:
        raise ValueError(f"expected shape [B] or {list(like.shape)}, got {list(x.shape)}")
    return x


def hi_precision(x: Tensor) -> Tensor:
    """Detached copy in at least float32 (bf16 log-ratios are too coarse for IS weights), float64 kept."""
    return x.detach().to(torch.promote_types(x.dtype, torch.float32))


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0.0 if there are none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max of ``x`` over positions where ``mask`` is 1 (0.0 if there are none)."""
    if not bool((mask > 0).any()):
        return x.new_zeros(())
    return x.masked_fill(mask <= 0, float("-inf")).max()


def per_sequence(x: Tensor, seq_index: Tensor | None) -> Tensor:
    """``x: [B]`` (one value per row) to ``[B]``: each row gets the sum of ``x`` over the rows of its sequence (the
    rows sharing its ``seq_index``); ``x`` itself when ``seq_index`` is None. Differentiable in ``x``."""
    if seq_index is None:
        return x
    return x.new_zeros(int(seq_index.max()) + 1).index_add(0, seq_index, x)[seq_index]


def count_sequences(mask: Tensor, seq_index: Tensor | None = None) -> int:
    """The number of sequences (trajectories) with at least one loss token."""
    has = mask.sum(-1) > 0
    if seq_index is None:
        return int(has.sum().item())
    return int(torch.unique(seq_index[has]).numel())


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    aggregation: Aggregation,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_index: Tensor | None = None,
) -> Tensor:
    """Reduces ``per_token: [B, T]`` to a scalar (see module docstring). Masked-out positions are ignored even if
    they hold NaN-free garbage; ``per_token`` must be finite there (it is multiplied by 0)."""
    per_token = per_token * mask
    if aggregation == "token_mean":
        denom = float(mask.sum().item()) if num_tokens is None else float(num_tokens)
        return per_token.sum() / max(denom, 1.0)
    lens = per_sequence(mask.sum(-1), seq_index)  # [B]: each row's sequence's loss tokens
    if num_seqs is None:
        num_seqs = float(count_sequences(mask, seq_index))
    if aggregation == "seq_mean_token_sum":
        seq = per_token.sum(-1)
    elif aggregation == "seq_mean_token_mean":
        seq = per_token.sum(-1) / lens.clamp(min=1.0)
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    return seq.sum() / max(float(num_seqs), 1.0)


def log_ratio_at_level(log_num: Tensor, log_den: Tensor, mask: Tensor, level: ISLevel,
                       seq_index: Tensor | None = None) -> Tensor:
    """Returns ``[B, T]`` log importance ratios ``log(num/den)`` at ``level`` (sequence levels broadcast to every
    token of the sequence, over all rows of the sequence). Gradients flow through ``log_num`` / ``log_den`` unless
    the caller detaches them."""
    d = (log_num - log_den) * mask
    if level == "token":
        return d
    total = per_sequence(d.sum(-1), seq_index).unsqueeze(-1)  # [B, 1]
    if level == "sequence":
        return total.expand_as(d)
    if level == "geometric":
        lens = per_sequence(mask.sum(-1), seq_index).unsqueeze(-1)
        return (total / lens.clamp(min=1.0)).expand_as(d)
    raise ValueError(f"unknown is_level {level!r}")


def truncated_is_weight(
    num_logp: Tensor, den_logp: Tensor, mask: Tensor, *, cap: float, level: ISLevel,
    seq_index: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Returns the detached weight ``min(num/den, cap): [B, T]`` at ``level`` and its metrics: ``is/weight_mean``
    and ``is/weight_max`` of the raw (untruncated) weight, and ``is/truncated_frac`` (share of loss tokens whose
    weight hit the cap)."""
    with torch.no_grad():
        logr = log_ratio_at_level(hi_precision(num_logp), hi_precision(den_logp), mask, level, seq_index)
        log_cap = math.log(cap)
        w = torch.exp(logr.clamp(max=log_cap))
        raw = torch.exp(logr.clamp(max=LOG_METRIC_CAP))
        metrics = {
            "is/weight_mean": masked_mean(raw, mask).item(),
            "is/weight_max": masked_max(raw, mask).item(),
            "is/truncated_frac": masked_mean((logr > log_cap).float(), mask).item(),
        }
    return w, metrics


def ratio_band_mask(
    prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, band: tuple[float, float] | list[float], level: ISLevel,
    seq_index: Tensor | None = None,
) -> Tensor:
    """Returns ``keep: [B, T]`` (1.0/0.0, detached): 0 where the behavior ratio ``pi_prox/mu`` at ``level`` lies
    outside ``[band[0], band[1]]``."""
    low, high = float(band[0]), float(band[1])
    with torch.no_grad():
        logr = log_ratio_at_level(hi_precision(prox_logp), hi_precision(behav_logp), mask, level, seq_index)
        lo = math.log(low) if low > 0 else float("-inf")
        keep = (logr >= lo) & (logr <= math.log(high))
    return keep.to(mask.dtype)


def kl_per_token(logp: Tensor, ref_logp: Tensor, estimator: Literal["k1", "k2", "k3"]) -> Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from samples of ``pi_theta`` (Schulman's k1/k2/k3):
    k1 ``log p - log q``; k2 ``(log p - log q)^2 / 2``; k3 ``q/p - 1 - log(q/p)`` (unbiased, non-negative).
    k3's log-ratio ``log(q/p)`` is clamped to [-20, 20] and its value to at most 10, so a token the reference finds
    wildly unlikely stays finite (and its gradient bounded) instead of making the whole step non-finite."""
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        log_qp = (-d).clamp(-_K3_LOG_RATIO_CLAMP, _K3_LOG_RATIO_CLAMP)
        return (torch.exp(log_qp) - 1.0 - log_qp).clamp(max=_K3_VALUE_CLAMP)
    raise ValueError(f"unknown kl estimator {estimator!r}")


def apply_keep(per_token: Tensor, keep: Tensor | None) -> Tensor:
    return per_token if keep is None else per_token * keep


def mismatch_metrics(prox_logp: Tensor, behav_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """Estimates ``KL(mu || pi_prox)`` from tokens sampled from ``mu``: k1 ``mean(log mu - log pi_prox)`` and
    k3 ``mean(pi_prox/mu - 1 - log(pi_prox/mu))`` (non-negative, lower variance)."""
    with torch.no_grad():
        d = (hi_precision(prox_logp) - hi_precision(behav_logp)) * mask  # log(pi_prox / mu)
        k3 = torch.exp(d.clamp(max=LOG_METRIC_CAP)) - 1.0 - d
        return {"mismatch/kl_k1": masked_mean(-d, mask).item(), "mismatch/kl_k3": masked_mean(k3, mask).item()}
