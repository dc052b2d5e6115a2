"""The trainer as a Ray actor.

:class:`TrainerWorker` is a thin, picklable-argument facade over :class:`~agentrl.trainer.trainer.Trainer` (Ray
cannot call properties remotely, hence ``get_version``); :data:`TrainerActor` is ``ray.remote(TrainerWorker)`` and
:func:`create_trainer_actor` starts one with the resources it needs::

    actor = create_trainer_actor(cfg, "/models/tiny", num_gpus=0)
    metrics = ray.get(actor.train_step.remote(trajectories))          # plain lists of Trajectory are fine
    weights = ray.get(actor.state_dict_for_inference.remote())         # {hf_name: cpu tensor}
    await engine.update_weights(weights, ray.get(actor.get_version.remote()))

    # or streamed, group by group as they finish (same update as one train_step on all of them):
    ray.get(actor.start_step.remote())
    for groups in arriving:
        ray.get(actor.accumulate.remote(groups))
    metrics = ray.get(actor.finish_step.remote())
    records = ray.get(actor.take_logprob_records.remote())            # with trainer.record_logprobs > 0

Data parallelism (``trainer.world_size: N``): :mod:`agentrl.trainer.dp_group` starts N of these actors in a placement
group, joins them with :meth:`TrainerWorker.init_distributed` and offers the same remote-call surface as one actor
(``create_trainer`` returns either). Rank logic lives in :mod:`agentrl.trainer.dp_rank`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ray

from agentrl.trainer.config import TrainerConfig
from agentrl.trajectory import Group, Trajectory


class TrainerWorker:
    """Owns one :class:`Trainer`; every method returns plain data (dicts of floats, CPU tensors)."""

    def __init__(self, config: TrainerConfig | dict[str, Any], model_path: str) -> None:
        from agentrl.trainer.trainer import Trainer  # heavy import (torch, transformers) inside the actor

        self.trainer = Trainer(config, model_path)  # type: ignore[arg-type]

    def ping(self) -> bool:
        return True

    def get_version(self) -> int:
        return self.trainer.version

    def get_optimizer_steps(self) -> int:
        return self.trainer.optimizer_steps

    def train_step(
        self, batch: Sequence[Trajectory] | Sequence[Group], advantages: Sequence[float | list[float]] | None = None,
        positions: Sequence[int] | None = None,
    ) -> dict[str, float]:
        return self.trainer.train_step(batch, advantages, positions=positions)

    def sft_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        return self.trainer.sft_step(trajectories)

    def compute_logprobs(self, batch: Sequence[Trajectory] | Sequence[Sequence[int]]):  # -> Tensor [B, T]
        return self.trainer.compute_logprobs(batch)

    # Streamed steps (see Trainer.start_step): the controller feeds groups as they finish.
    def start_step(self) -> None:
        self.trainer.start_step()

    def accumulate(
        self, batch: Sequence[Trajectory] | Sequence[Group], advantages: Sequence[float | list[float]] | None = None
    ) -> dict[str, float]:
        return self.trainer.accumulate(batch, advantages)

    def finish_step(self) -> dict[str, float]:
        return self.trainer.finish_step()

    def abort_step(self) -> None:
        self.trainer.abort_step()

    def take_logprob_records(self) -> list[dict[str, Any]]:
        return self.trainer.take_logprob_records()

    def state_dict_for_inference(self, dtype: Any = None) -> dict[str, Any]:
        return self.trainer.state_dict_for_inference(dtype)

    def state_dict_ref(self) -> list[Any]:
        """The inference state dict put into Ray's object store from here, as ``[ObjectRef]``: the driver hands the
        reference to the engine replicas, which read the tensors from the store; they never land in the driver."""
        return [ray.put(self.trainer.state_dict_for_inference())]

    # The broadcast weight path (agentrl.trainer.weight_broadcast): join once, then send after each update.
    def prepare_weight_broadcast(self) -> None:
        """Imports vLLM's weight-transfer half (~12 s of a core on the CPU); called while the engines start, so
        that joining after them does not wait for it."""
        import agentrl.inference.weight_transfer  # noqa: F401

    def join_weight_broadcast(self, init_args: dict[str, Any], client: Any, rank: int = 0) -> None:
        from agentrl.trainer.weight_broadcast import WeightSender

        self._sender = WeightSender(self.trainer, init_args, client, rank)

    def broadcast_weights(self) -> dict[str, float]:
        sender = getattr(self, "_sender", None)
        if sender is None:
            raise RuntimeError("broadcast_weights before join_weight_broadcast")
        return sender.send()

    def save_checkpoint(self, path: str) -> str:
        return str(self.trainer.save_checkpoint(path))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self.trainer.load_checkpoint(path)

    def pid(self) -> int:
        return os.getpid()

    # Data parallelism (agentrl.trainer.dp_group): rank 0 names the rendezvous, then every rank joins.
    def rendezvous(self) -> tuple[str, int]:
        from agentrl.trainer.dp_rank import free_port

        return free_port()

    def init_distributed(self, address: str, port: int, rank: int, world_size: int, timeout_s: float) -> dict:
        """Joins the ranks' process group (NCCL on CUDA, gloo on CPU) and makes the trainer one of its ranks.
        Returns ``{"rank", "sharding", "pid", "host"}``."""
        from agentrl.trainer.dp_rank import init_process_group, rank_env

        backend = "nccl" if self.trainer.device.type == "cuda" else "gloo"
        init_process_group(address, port, rank, world_size, backend, timeout_s)
        self.trainer.enable_data_parallel()
        return {"rank": rank, "sharding": self.trainer.sharding, **rank_env()}


TrainerActor = ray.remote(TrainerWorker)


def create_trainer_actor(
    config: TrainerConfig,
    model_path: str | os.PathLike,
    *,
    num_cpus: float = 1,
    num_gpus: float = 0,
    name: str | None = None,
) -> Any:
    """Starts a :data:`TrainerActor` (``ray.init`` must have run) and returns its handle once the model is
    loaded, so a bad path or config raises here (as ``ray.exceptions.RayTaskError``) rather than on first use.
    ``num_gpus`` should be 1 on GPU hosts (the actor then sees exactly one device)."""
    if config.world_size > 1:
        raise ValueError("create_trainer_actor starts one trainer: use agentrl.trainer.dp_group.create_trainer for "
                         f"trainer.world_size={config.world_size}")
    opts: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if name is not None:
        opts["name"] = name
    actor = TrainerActor.options(**opts).remote(config, str(model_path))
    ray.get(actor.ping.remote())
    return actor
