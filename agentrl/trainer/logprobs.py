"""Token log-probs (and entropy) from the model's last hidden states without a ``[tokens, vocabulary]`` tensor.

Flow: the decoder body gives hidden states ``h: [N, H]`` for the ``N`` positions that have a target; the LM head
``W: [V, H]`` projects them to logits ``z = h W^T / temperature``; the result is ``log softmax(z)[target]`` per
position (and, when asked, the entropy of ``softmax(z)``). With a 151,936-entry vocabulary the full ``z`` costs
0.6 MB per token in float32 (5 GB for a 2,048-token sequence, and log-softmax, its gradient and the entropy each
add as much), so every path here works on chunks of at most :func:`chunk_tokens` positions:

- ``torch``: :class:`ChunkedLinearLogProbs`, a custom autograd function. The forward keeps only ``logsumexp`` per
  position; the backward recomputes each chunk's logits and turns the upstream gradients of log-prob (and entropy)
  into gradients of ``h`` and ``W``. Peak extra memory is a few ``chunk x V`` float32 buffers, whatever ``N``.
- ``liger``: Liger-Kernel's fused linear cross-entropy (Triton) with ``reduction="none"``, whose backward also
  recomputes chunk by chunk; log-prob = -cross-entropy. GPU only (its kernels run on the CPU only under
  ``TRITON_INTERPRET=1``, which the tests use). No entropy gradient: entropy, when needed as a metric, comes from
  :func:`chunked_entropy`.
- ``full``: the model's own logits (``model(...).logits``), then float32 log-softmax: today's reference path, and
  the fallback for heads that are not a plain ``h W^T`` (softcapping, logit scales).

Invariants: every path returns float32 values; the projection runs in the compute dtype (bf16 under autocast,
as the model's own ``lm_head`` would), every reduction over the vocabulary and the weight-gradient accumulation in
float32; ``temperature`` divides the logits in every path (the ``liger`` path divides ``h`` instead, which is the
same linear map).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Literal

import torch
from torch import Tensor

LogProbImpl = Literal["torch", "liger", "full"]

# Float32 logits per chunk (2^25 = 128 MiB): ~220 tokens at a 151,936 vocabulary. Large enough for matrix
# multiplies to run at full speed on a GPU, small enough that a few such buffers are noise next to the model.
CHUNK_ELEMENTS = 1 << 25


def chunk_tokens(vocab_size: int) -> int:
    """Positions per chunk so that one float32 ``[chunk, vocab_size]`` buffer holds at most ``CHUNK_ELEMENTS``."""
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


def _no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    # Dtypes below are chosen explicitly; an enclosing autocast must not re-cast them (it also does not apply in
    # backward, so forward and backward would otherwise disagree).
    return torch.autocast(device_type=device_type, enabled=False)


def _chunk_logits(h: Tensor, w: Tensor, temperature: float) -> Tensor:
    z = (h @ w.t()).float()
    if temperature != 1.0:
        z.div_(temperature)
    return z


class ChunkedLinearLogProbs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (logp [N], entropy [N] or empty)``, both float32.

    ``compute_dtype`` is the dtype of the projection (bf16 under autocast); ``chunk`` the positions per chunk.
    The entropy output is differentiable only when ``entropy_grad`` (an entropy bonus in the loss)."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk: int,
                compute_dtype: torch.dtype, want_entropy: bool, entropy_grad: bool) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        dev = hidden.device
        logp = torch.empty(n, dtype=torch.float32, device=dev)
        lse = torch.empty(n, dtype=torch.float32, device=dev)
        ent = torch.empty(n if want_entropy else 0, dtype=torch.float32, device=dev)
        with torch.no_grad(), _no_autocast(dev.type):
            w = weight.to(compute_dtype)
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                z = _chunk_logits(hidden[s:e].to(compute_dtype), w, temperature)
                lse_c = torch.logsumexp(z, dim=-1)
                lse[s:e] = lse_c
                logp[s:e] = z.gather(1, targets[s:e, None]).squeeze(1) - lse_c
                if want_entropy:
                    z.sub_(lse_c[:, None])  # log p
                    ent[s:e] = -z.exp().mul_(z).sum(-1)
                del z
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.cfg = (temperature, chunk, compute_dtype, want_entropy and entropy_grad)
        ctx.set_materialize_grads(False)
        if not (want_entropy and entropy_grad):
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None):  # type: ignore[override]
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        temperature, chunk, compute_dtype, ent_diff = ctx.cfg
        if not ent_diff:
            g_ent = None
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (g_logp is None and g_ent is None) or not (need_h or need_w):
            return None, None, None, None, None, None, None, None
        n = hidden.shape[0]
        dev = hidden.device
        grad_h = torch.empty_like(hidden) if need_h else None
        # float32 accumulator whatever the parameter/compute dtype
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=dev) if need_w else None
        with torch.no_grad(), _no_autocast(dev.type):
            w = weight.to(compute_dtype)
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                h = hidden[s:e].to(compute_dtype)
                z = _chunk_logits(h, w, temperature)
                z.sub_(lse[s:e, None])  # log p
                p = z.exp()
                # d logp_t / dz_k = 1[k = t] - p_k;  d H / dz_k = -p_k (log p_k + H)
                # grad_z = -p * (g_lp + g_ent (log p + H)) + g_lp 1[k = t]
                if g_ent is not None:
                    coef = z.add_(ent[s:e, None]).mul_(g_ent[s:e, None])
                    if g_logp is not None:
                        coef.add_(g_logp[s:e, None])
                    gz = p.mul_(coef).neg_()
                    del coef
                else:
                    gz = p.mul_(g_logp[s:e, None]).neg_()
                del z, p
                if g_logp is not None:
                    rows = torch.arange(e - s, device=dev)
                    gz[rows, targets[s:e]] += g_logp[s:e]
                if temperature != 1.0:
                    gz.div_(temperature)
                gzc = gz.to(compute_dtype)
                if grad_h is not None:
                    grad_h[s:e] = (gzc @ w).to(hidden.dtype)
                if grad_w is not None:
                    _accumulate_fp32(grad_w, gzc.t(), h)
                del gz, gzc
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None, None)


def _accumulate_fp32(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """``acc += a @ b`` with a float32 ``acc`` and operands in a possibly lower precision."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
        return
    if acc.device.type == "cuda":
        try:  # torch >= 2.8: bf16 operands, float32 output without a parameter-sized temporary
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            return
        except TypeError:
            pass
    acc.add_((a @ b).float())


def torch_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0,
                   compute_dtype: torch.dtype | None = None, want_entropy: bool = False, entropy_grad: bool = False,
                   chunk: int | None = None) -> tuple[Tensor, Tensor | None]:
    """The ``torch`` path: returns ``(logp [N], entropy [N] or None)`` (float32) of ``targets`` under
    ``softmax(hidden @ weight.T / temperature)``, chunked (see module docstring)."""
    chunk = chunk or chunk_tokens(weight.shape[0])
    dt = compute_dtype or hidden.dtype
    logp, ent = ChunkedLinearLogProbs.apply(hidden, weight, targets, float(temperature), int(chunk), dt,
                                            bool(want_entropy), bool(entropy_grad))
    return logp, (ent if want_entropy else None)


@torch.no_grad()
def chunked_entropy(hidden: Tensor, weight: Tensor, *, temperature: float = 1.0,
                    compute_dtype: torch.dtype | None = None, chunk: int | None = None) -> Tensor:
    """Entropy ``[N]`` (float32, no graph) of ``softmax(hidden @ weight.T / temperature)``, chunked."""
    chunk = chunk or chunk_tokens(weight.shape[0])
    dt = compute_dtype or hidden.dtype
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    with _no_autocast(hidden.device.type):
        w = weight.to(dt)
        for s in range(0, hidden.shape[0], chunk):
            z = _chunk_logits(hidden[s:s + chunk].to(dt), w, temperature)
            z = torch.log_softmax(z, dim=-1)
            out[s:s + chunk] = -z.exp().mul_(z).sum(-1)
    return out


def liger_available() -> bool:
    """True when Liger-Kernel's fused linear cross-entropy imports (it needs Triton)."""
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction  # noqa: F401
    except Exception:  # ImportError, or Triton failing to initialise
        return False
    return True


def liger_runnable(device: torch.device) -> bool:
    """Liger's Triton kernels run on CUDA, or anywhere under Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return liger_available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def liger_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0) -> Tensor:
    """The ``liger`` path: ``logp [N]`` (float32) through Liger's fused linear cross-entropy (``reduction="none"``,
    float32 weight-gradient accumulation). The temperature divides ``hidden`` (the same logits)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    h = hidden / temperature if temperature != 1.0 else hidden
    # positional: input, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing,
    # reduction, softcap, return_z_loss, accum_dtype
    ce = LigerFusedLinearCrossEntropyFunction.apply(
        h.contiguous(), weight, targets.contiguous(), None, None, -100, 0.0, 0.0, "none", None, False, torch.float32)
    return -ce[0].float()


def full_logprobs(logits: Tensor, targets: Tensor, *, temperature: float = 1.0,
                  want_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """The ``full`` path on already materialised ``logits [N, V]``: float32 log-softmax, gather, entropy."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    logsm = torch.log_softmax(z, dim=-1)
    logp = logsm.gather(-1, targets[:, None]).squeeze(-1)
    ent = None
    if want_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logsm.exp() * logsm).sum(-1)
    return logp, ent
