"""Data-parallel trainer ranks, the rank side: joining the process group, the all-reducing
:class:`~agentrl.trainer.step.Reducer`, the gradient sum, and FSDP2 sharding.

Every rank holds a :class:`~agentrl.trainer.trainer.Trainer`; :meth:`Trainer.enable_data_parallel` plugs this
module into its hooks. The driver side (placement group, batch sharding, fan-out of calls, rank failures) is
:mod:`agentrl.trainer.dp_group`.

Two ways to hold the model (``trainer.sharding``):

- ``replicate`` (the default on CPU): every rank keeps the whole float32 model and optimizer. After the local
  backward passes, :func:`sum_gradients` all-reduces (SUM) the gradients in flat buckets, so every rank then takes
  the same optimizer step. This is DDP's update without ``DistributedDataParallel``'s backward hooks: ranks hold
  shards of different sizes (uneven, or even empty, after balancing by loss tokens) and so run different numbers of
  micro-batches, which DDP's one-reduction-per-backward protocol cannot express; one reduction per optimizer step
  is also what the trainer's "normalise at the end" design needs.
- ``fsdp`` (the default on CUDA): :func:`shard_model` applies FSDP2 (``torch.distributed.fsdp.fully_shard``) per
  decoder layer and at the root, with float32 sharded master parameters and bfloat16 (or float32) compute through
  ``MixedPrecisionPolicy``; gradients are reduce-scattered in float32 and *summed* (divide factor 1), because the
  trainer divides by the whole-batch normaliser itself (plain SUM collectives: gloo has no ``PREMUL_SUM``). FSDP
  all-gathers parameters in every forward, so every rank
  must run the same number of forward passes: the trainer pads the ranks with fewer micro-batches with empty ones
  (:func:`agree_count`); log-probs come from the model's own forward (``logprob_impl: full``), since the chunked
  paths read the output head outside it. Checkpoints and the inference state dict gather the full model on rank 0.
  Only the CPU/gloo form of this path has run (tests/trainer/test_data_parallel.py); it has not run on a GPU.

Invariants: every rank issues the same collectives in the same order (the group calls every rank for every method
that reaches a collective); the model's initial weights are rank 0's (:func:`broadcast_parameters`); reductions run
in float64 for the metric sums so the whole-batch counts are exact.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

# Gradients are reduced in buckets of this many bytes (large enough to amortise a collective, small enough not to
# double the gradients' memory).
_BUCKET_BYTES = 64 * 2**20

_T = TypeVar("_T")


class _CommClock:
    """Seconds this process spent inside the trainer's collectives (waiting for slower ranks included): the
    ``perf/comm_s`` metric of a step."""

    seconds = 0.0

    @classmethod
    def timed(cls, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            cls.seconds += time.perf_counter() - t0


def comm_seconds() -> float:
    """Total seconds spent in this module's collectives so far (see ``_CommClock``)."""
    return _CommClock.seconds


def free_port() -> tuple[str, int]:
    """Returns this node's IP address (as Ray sees it) and a TCP port free right now: rank 0's rendezvous."""
    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:  # outside Ray
        ip = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return ip, int(s.getsockname()[1])


def init_process_group(address: str, port: int, rank: int, world_size: int, backend: str,
                       timeout_s: float = 1800.0) -> None:
    """Joins the default process group (``backend`` ``gloo`` or ``nccl``) with rank 0's TCP store at
    ``address:port``. Blocks until all ``world_size`` ranks joined. ``timeout_s`` bounds every later collective
    too (a rank that stops answering fails its peers' step after that long; a rank that dies is reported at once
    by the group)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a torch.distributed process group")
    if backend == "nccl":
        torch.cuda.set_device(0)  # Ray gives each rank exactly one visible GPU
    dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


class DistReducer:
    """The all-reducing :class:`~agentrl.trainer.step.Reducer`: the key sets are all-gathered first (a rank may
    lack a metric), then one float64 tensor in sorted key order is all-reduced (SUM or MAX)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device  # NCCL reduces device tensors only

    def _reduce(self, values: dict[str, float], op: Any, missing: float) -> dict[str, float]:
        import torch.distributed as dist

        keys_per_rank: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(keys_per_rank, sorted(values))
        keys = sorted(set().union(*keys_per_rank))
        if not keys:
            return {}
        t = torch.tensor([float(values.get(k, missing)) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return dict(zip(keys, t.cpu().tolist()))

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        return _CommClock.timed(self._reduce, values, dist.ReduceOp.SUM, 0.0)

    def max(self, values: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        return _CommClock.timed(self._reduce, values, dist.ReduceOp.MAX, float("-inf"))


def agree_count(n: int, device: torch.device) -> int:
    """Returns the maximum of ``n`` over the ranks (e.g. the number of micro-batches every rank must run)."""
    import torch.distributed as dist

    t = torch.tensor([n], dtype=torch.int64, device=device)
    _CommClock.timed(dist.all_reduce, t, op=dist.ReduceOp.MAX)
    return int(t.item())


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Makes every rank's parameters and buffers rank 0's (they load the same files, but a model with randomly
    initialised parts, e.g. a missing head, would otherwise start different on every rank)."""
    import torch.distributed as dist

    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    _CommClock.timed(_sum_gradients, params)


def _sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Replaces each ``p.grad`` by its sum over the ranks (``replicate`` mode). A parameter with no gradient on a
    rank counts as zero there; one with no gradient on every rank keeps ``grad = None`` (so AdamW skips it exactly
    as one rank would). Flat buckets of ``_BUCKET_BYTES`` keep the number of collectives small."""
    import torch.distributed as dist

    if not params:
        return
    device = params[0].device
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=device)
    dist.all_reduce(present)
    live = [(p, bool(present[i] > 0)) for i, p in enumerate(params)]
    bucket: list[torch.nn.Parameter] = []
    size = 0
    for p, any_grad in live:
        if not any_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        bucket.append(p)
        size += p.numel() * p.element_size()
        if size >= _BUCKET_BYTES:
            _reduce_bucket(bucket)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket)


def _reduce_bucket(params: list[torch.nn.Parameter]) -> None:
    import torch.distributed as dist

    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])  # type: ignore[union-attr]
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        n = g.numel()  # type: ignore[union-attr]
        g.copy_(flat[offset:offset + n].view_as(g))  # type: ignore[union-attr]
        offset += n


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a HF causal LM (``model.model.layers`` for Llama/Qwen/Mistral families, else the
    ``_no_split_modules`` classes), the units FSDP shards and all-gathers one at a time."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return list(layers)
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype) -> None:
    """Applies FSDP2 in place: each decoder layer and then the root become ``FSDPModule``s over a 1-D mesh of all
    ranks. Parameters stay float32 shards (the master weights the optimizer steps); forward and backward run in
    ``compute_dtype``; gradients are reduce-scattered in float32 and summed, not averaged (the trainer normalises
    by the whole batch's counts). Tied embeddings stay tied (they share the root's parameter group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import torch.distributed as dist

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)
            # plain SUM collectives (gloo has no PREMUL_SUM; with factor 1 the post-division is a no-op)
            m.set_force_sum_reduction_for_comms(True)


def full_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The whole model's state dict as plain CPU tensors, gathered from the FSDP shards (a collective: call it on
    every rank). Only rank 0 receives the tensors (``cpu_offload``: the others get ``{}``, and no GPU holds a full
    copy)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                              broadcast_from_rank0=False))
    return sd


def rank_env() -> dict[str, str]:
    """What a rank reports about itself (for errors naming the rank): pid and host."""
    return {"pid": str(os.getpid()), "host": socket.gethostname()}
