"""Weights from the trainer to the engine replicas by broadcast, through vLLM's weight-transfer API (not the
object store): ``engine.weight_sync: nccl`` on GPU hosts, ``gloo`` on CPU hosts (and in CI).

Backends. ``nccl`` is vLLM's own (``NCCLWeightTransferEngine`` in the workers, ``NCCLTrainerWeightTransferEngine``
in the trainer). vLLM 0.32 ships no CPU backend, so ``gloo`` is ours: the same protocol over a torch gloo group,
registered with vLLM's two factories under :data:`GLOO_BACKEND` (the worker side in vLLM's worker processes, which
import this module through :mod:`agentrl.inference.vllm_worker`; the trainer side wherever this module is
imported). The worker side reuses vLLM's layer-wise reload, so on the engine both backends differ only in transport.

Who calls what (the trainer half is wired by the trainer; the engine half is
:class:`agentrl.inference.replicas.ReplicatedEngine`)::

    # driver, once
    engine = make_engine(cfg)                                  # cfg.weight_sync = "nccl" or "gloo"
    client = engine.weight_sync_client()                       # picklable; give it to every trainer rank
    args = engine.trainer_init_args(master_address, port)      # a dict; world_size = 1 + replicas * tp size
    # every trainer rank r (rank 0 is the sender; the others only join the trainer-side gathers)
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory, ModuleSource
    from agentrl.inference.weight_transfer import trainer_init_info   # registers "agentrl_gloo" in this process
    sender = WeightTransferTrainerFactory.trainer_init(trainer_init_info(**dict(args, rank=r)), client=client,
                                                       source=source)   # rendezvous with every replica's workers
    # each weight sync
    sender.send_weights()              # every rank; rank 0 drives: replicas pause, receive, finish (still paused)
    await engine.commit_weight_update(version)                 # driver: label ``version`` and resume, all replicas

``source`` is a vLLM ``WeightSource`` whose names are HF checkpoint names (what ``state_dict_for_inference``
returns; an engine serving LoRA takes the adapter's tensors under PEFT's names instead, received into a sink rather
than the model: :meth:`agentrl.inference.lora.AdapterSet.receive`); ``ModuleSource(model)`` for an unwrapped HF
model, and it gathers FSDP ``DTensor`` shards itself.
Replicas stay paused from ``send_weights``' start to ``commit_weight_update``, so no token is ever labelled with a
version its weights do not have (serving LoRA, they do not pause: they serve the previous adapter under its version
until the commit switches to the received one, whose pause mode then applies; a failed round leaves them as they
were). Until ``commit_weight_update`` returns, ``engine.version`` is the old version.
If ``send_weights`` raises half-way, the replicas stay paused with partly loaded weights (never served under any
label): stop the run; ``--resume`` starts fresh engines and loads the checkpoint's weights. Names and shapes are
checked against the served checkpoint before anything pauses (:meth:`ReplicaWeightSyncClient.check_update
<agentrl.inference.replicas.ReplicaWeightSyncClient.check_update>`, called by the gloo sender; vLLM's NCCL sender
does not call it, so call it yourself with :func:`update_info` of your source's metadata to get the same check).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

GLOO_BACKEND = "agentrl_gloo"


def vllm_backend_name(weight_sync: str) -> str:
    """vLLM's weight-transfer backend name for ``engine.weight_sync`` ("nccl" or "gloo")."""
    return {"nccl": "nccl", "gloo": GLOO_BACKEND}[weight_sync]


def _gloo_group(address: str, port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """A gloo process group of its own (no ``init_process_group``, so it never touches the trainer's default
    group); rank 0 hosts the rendezvous store. Blocks until all ``world_size`` members joined."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, world_size, is_master=(rank == 0), timeout=timeout)
    return dist.ProcessGroupGloo(dist.PrefixStore("agentrl-weight-transfer", store), rank, world_size, timeout)


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0  # the group's own rank numbering (a stateless group has no global ranks)
    group.broadcast([tensor], opts).wait()


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Worker-side: the trainer's rendezvous address, this engine's first rank (``rank_offset``) and the group size."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One round: the tensors the trainer will broadcast, in order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                             f"{len(self.dtype_names)}, {len(self.shapes)}")


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Worker side (in vLLM's worker process): receives each broadcast tensor and loads it through vLLM's
    layer-wise reload, as vLLM's NCCL engine does."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: Any = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        self.group = _gloo_group(init_info.master_address, init_info.master_port, rank, init_info.world_size,
                                 init_info.timeout_s)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which has no accelerator to sync on a CPU host.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call init_weight_transfer_engine first")
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            buf = torch.empty(shape, dtype=getattr(torch, dtype_name), device="cpu")
            _broadcast(self.group, buf)
            self.model.load_weights([(name, buf.to(self.device))])

    def shutdown(self) -> None:
        self.group = None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer-side: where rank 0 hosts the rendezvous, the group size (1 + the engines' workers)."""

    backend: ClassVar[str] = GLOO_BACKEND

    master_address: str
    master_port: int
    world_size: int
    timeout_s: float = 600.0


def update_info(meta: list[ParamMeta]) -> dict[str, Any]:
    """The per-round update info (names, dtype names, shapes) for ``meta``, as a plain dict."""
    return {"names": [m.name for m in meta], "dtype_names": [str(m.dtype).split(".")[-1] for m in meta],
            "shapes": [list(m.shape) for m in meta]}


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side: rank 0 opens the group, drives the engines through ``client`` and broadcasts each tensor;
    other ranks only iterate the source (its FSDP gathers are collectives every rank must join)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: Any, source: WeightSource | None = None, is_sender: bool = True) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group: Any = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: Any, source: WeightSource | None = None
                     ) -> "GlooTrainerWeightTransferEngine":
        if source is None:
            raise ValueError("gloo weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        worker_info = {"master_address": init_info.master_address, "master_port": init_info.master_port,
                       "rank_offset": 1, "world_size": init_info.world_size, "timeout_s": init_info.timeout_s}
        # The engines block in their rendezvous until this rank joins: start theirs on a side thread.
        with ThreadPoolExecutor(max_workers=1) as pool:
            fut = pool.submit(client.init_weight_transfer_engine, worker_info)
            engine.group = _gloo_group(init_info.master_address, init_info.master_port, 0, init_info.world_size,
                                       init_info.timeout_s)
            fut.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        info = update_info(meta)
        check = getattr(self.client, "check_update", None)
        if check is not None:
            check(info)  # names and shapes against the served model, before any engine waits on a broadcast
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            fut = pool.submit(self.client.update_weights, info)
            for name, tensor in _checked(self.source, meta):
                _broadcast(self.group, tensor.detach().to("cpu").contiguous())
            fut.result()
        finally:
            pool.shutdown(wait=False)  # never join a receiver stuck in a broadcast that will not come
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group = None


def _checked(source: WeightSource, meta: list[ParamMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """The source's tensors, each checked against what the engines were told to expect."""
    n = 0
    for name, tensor in source:
        if n >= len(meta) or name != meta[n].name or tensor.dtype != meta[n].dtype or tuple(tensor.shape) != tuple(meta[n].shape):
            want = f"{meta[n].name} {meta[n].dtype} {tuple(meta[n].shape)}" if n < len(meta) else "nothing more"
            raise ValueError(f"WeightSource yielded {name} {tensor.dtype} {tuple(tensor.shape)} at index {n}; "
                             f"metadata() declared {want}")
        n += 1
        yield name, tensor
    if n != len(meta):
        raise ValueError(f"WeightSource yielded {n} tensors; metadata() declared {len(meta)}")


def trainer_init_info(weight_sync: str, master_address: str, master_port: int, world_size: int, *,
                      rank: int = 0, **extra: Any) -> TrainerInitInfo:
    """The trainer-side init info for ``weight_sync`` ("nccl" or "gloo")."""
    if weight_sync == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(master_address=master_address, master_port=master_port, world_size=world_size,
                                   rank=rank, **extra)
    if weight_sync == "gloo":
        return GlooTrainerInitInfo(master_address=master_address, master_port=master_port, world_size=world_size,
                                   rank=rank, **extra)
    raise ValueError(f"weight_sync must be 'nccl' or 'gloo' for a broadcast, got {weight_sync!r}")


def _register() -> None:
    if GLOO_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO_BACKEND, GlooWeightTransferEngine)
    if GLOO_BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO_BACKEND, GlooTrainerWeightTransferEngine)


_register()

__all__ = ["GLOO_BACKEND", "GlooInitInfo", "GlooTrainerInitInfo", "GlooTrainerWeightTransferEngine",
           "GlooUpdateInfo", "GlooWeightTransferEngine", "trainer_init_info", "update_info", "vllm_backend_name"]
