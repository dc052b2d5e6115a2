"""Data-parallel trainer ranks, the driver side: ``trainer.world_size: N`` trainer actors behind the remote-call
surface of one.

:func:`create_trainer` returns one :data:`~agentrl.trainer.actor.TrainerActor` for ``world_size: 1`` and a
:class:`TrainerGroup` otherwise; the controller uses either the same way::

    trainer = create_trainer(cfg.trainer, model_dir, num_cpus=1, num_gpus=0)
    metrics = await trainer.train_step.remote(groups)            # or .result() outside asyncio
    weights = await trainer.state_dict_for_inference.remote()
    stop_trainer(trainer)

Flow of a group call: the batch is split into N shards of whole trajectories (:func:`plan_shards`: by loss-token
count, or in the prefix-tree layout by shared prefix and computed tokens; advantages computed here over the whole
groups first, so a group may span ranks; with ``num_mini_batches > 1`` each of the single trainer's mini-batches is
sharded in turn), every rank gets its shard at once, and the call completes when all ranks returned; the result is
rank 0's (metrics are already all-reduced). Calls that reach a collective go to every rank, in the same order (each
rank is one Ray actor that runs its calls in submission order); calls that do not (``compute_logprobs`` and the
inference state dict with replicated weights, the version) go to rank 0 only.

Failures: if a rank dies (or raises while its peers wait in a collective), the call raises
:class:`TrainerRankError` naming the rank at once, and the group stops all ranks (their process group cannot
recover). The run then continues from its last checkpoint with ``agentrl train --resume RUN_DIR``. An error that every
rank raises alike (a refused call) is re-raised as is and the group stays usable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Sequence
from typing import Any

import ray

from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.prefix_tree import shard_by_tree
from agentrl.trajectory import Group, Trajectory

log = logging.getLogger(__name__)

# How long the other ranks get to finish after one rank failed before the group counts them as stuck in a
# collective (a refusal raised by every rank arrives within this window).
_GRACE_S = 10.0


class TrainerRankError(RuntimeError):
    """A trainer rank died or failed while its peers depended on it; the group is stopped."""


def loss_tokens(t: Trajectory) -> int:
    """The number of tokens of ``t`` the loss counts (the unit the shards are balanced in)."""
    return int(sum(1 for m in t.loss_mask if m))


def shard_by_loss_tokens(trajs: Sequence[Trajectory], n: int) -> list[list[int]]:
    """Splits trajectory indices into ``n`` shards of nearly equal loss-token count (longest first onto the
    lightest shard); each shard keeps the batch's order. Shards may differ in size, and be empty when there are
    fewer trajectories than ranks."""
    load = [0] * n
    shards: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(trajs)), key=lambda i: (-loss_tokens(trajs[i]), i)):
        r = min(range(n), key=lambda r: (load[r], len(shards[r]), r))
        shards[r].append(i)
        load[r] += max(loss_tokens(trajs[i]), 1)
    return [sorted(s) for s in shards]


def plan_shards(trajs: Sequence[Trajectory], config: TrainerConfig, n: int, *, mini_batches: bool) -> list[list[int]]:
    """Each rank's trajectory indices: with ``mini_batches`` the batch is first cut into the single trainer's
    ``num_mini_batches`` consecutive parts and each part is shared out. In the prefix-tree layout
    (:func:`~agentrl.trainer.prefix_tree.shard_by_tree`) trajectories sharing a prefix go to one rank, balanced by
    the tokens the trees compute; otherwise by loss tokens (:func:`shard_by_loss_tokens`)."""
    from agentrl.trainer.batching import even_parts

    def shard(part: list[int]) -> list[list[int]]:
        if config.prefix_tree:
            return shard_by_tree([[trajs[i].token_ids[a:b] for a, b in trajs[i].segment_slices()] for i in part], n)
        return shard_by_loss_tokens([trajs[i] for i in part], n)

    shards: list[list[int]] = [[] for _ in range(n)]
    for part in even_parts(list(range(len(trajs))), config.num_mini_batches if mini_batches else 1):
        for r, idx in enumerate(shard(part)):
            shards[r] += [part[j] for j in idx]
    return shards


def _flatten(batch: Sequence[Trajectory] | Sequence[Group]) -> list[Trajectory]:
    if batch and isinstance(batch[0], Group):
        return [t for g in batch for t in g.trajectories]  # type: ignore[union-attr]
    return list(batch)  # type: ignore[arg-type]


class GroupCall:
    """The pending result of one call on the ranks: ``await`` it (asyncio) or call :meth:`result`."""

    def __init__(self, group: TrainerGroup, method: str, refs: list[Any], ranks: list[int], combine: Any) -> None:
        self.group, self.method, self.refs, self.ranks, self.combine = group, method, refs, ranks, combine

    def __await__(self):
        return asyncio.get_running_loop().run_in_executor(None, self.result).__await__()

    def result(self, timeout: float | None = None) -> Any:
        """Blocks until every rank answered; returns the combined result. Raises :class:`TrainerRankError` when a
        rank died or failed alone (see the module docstring)."""
        index = {ref: i for i, ref in enumerate(self.refs)}
        pending = list(self.refs)
        results: list[Any] = [None] * len(self.refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                raise TimeoutError(f"trainer group: {self.method} did not finish within {timeout} s")
            for ref in ready:
                try:
                    results[index[ref]] = ray.get(ref)
                except Exception as e:  # noqa: BLE001  (a rank's failure, classified below)
                    self._failed(self.ranks[index[ref]], e, pending)
        return self.combine(results)

    def _failed(self, rank: int, exc: Exception, pending: list[Any]) -> None:
        died = isinstance(exc, ray.exceptions.RayActorError)
        if pending and not died:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=_GRACE_S)
        if not died and not pending:
            raise exc  # every rank finished: a refusal (e.g. ValueError) raised alike, the group is still usable
        n = self.group.world_size
        what = "died" if died else f"failed ({type(exc).__name__})"
        self.group.stop(reason=f"rank {rank} {what} during {self.method}")
        raise TrainerRankError(
            f"trainer rank {rank} of {n} {what} during {self.method}: {_short(exc)}. The step is lost and all "
            f"{n} trainer ranks were stopped (their process group cannot continue without it). Resume from the "
            f"last checkpoint with `agentrl train --resume RUN_DIR` (it keeps trainer.world_size={n}).") from exc


def _short(exc: Exception, limit: int = 600) -> str:
    text = str(exc).strip().splitlines()
    msg = " | ".join(x.strip() for x in text[-4:] if x.strip())
    return msg[-limit:]


class _Method:
    """``group.<name>.remote(...)``: the same spelling as an actor method."""

    def __init__(self, group: TrainerGroup, name: str) -> None:
        self.group, self.name = group, name

    def remote(self, *args: Any, **kwargs: Any) -> GroupCall:
        return getattr(self.group, "_" + self.name)(*args, **kwargs)


def _first(results: list[Any]) -> Any:
    return results[0]


class TrainerGroup:
    """``world_size`` trainer ranks (one :class:`~agentrl.trainer.actor.TrainerWorker` each) joined by
    ``torch.distributed``. Exposes the actor's methods as ``group.<method>.remote(...)``, each returning a
    :class:`GroupCall`. Build with :func:`create_trainer_group`."""

    METHODS = ("ping", "get_version", "get_optimizer_steps", "train_step", "sft_step", "compute_logprobs",
               "start_step", "accumulate", "finish_step", "abort_step", "take_logprob_records",
               "state_dict_for_inference", "state_dict_ref", "save_checkpoint", "load_checkpoint", "pid",
               "rendezvous", "prepare_weight_broadcast", "join_weight_broadcast", "broadcast_weights")

    def __init__(self, config: TrainerConfig, actors: list[Any], placement_group: Any, info: list[dict]) -> None:
        self.config = config
        self.actors = actors
        self.placement_group = placement_group
        self.info = info  # per rank: rank, sharding, pid, host
        self.world_size = len(actors)
        self.sharding = info[0]["sharding"]
        self._stopped: str | None = None
        self._stream_groups: set[str] = set()
        for name in self.METHODS:
            setattr(self, name, _Method(self, name))

    # ------------------------------------------------------------------------------------------- dispatch
    def _call(self, method: str, per_rank: list[tuple[tuple, dict]] | None = None, *, ranks: list[int] | None = None,
              combine: Any = _first, args: tuple = (), kwargs: dict | None = None) -> GroupCall:
        if self._stopped is not None:
            raise TrainerRankError(f"the trainer group was stopped ({self._stopped}); resume from the last "
                                   "checkpoint with `agentrl train --resume RUN_DIR`")
        ranks = list(range(self.world_size)) if ranks is None else ranks
        refs = []
        for r in ranks:
            a, kw = per_rank[r] if per_rank is not None else (args, kwargs or {})
            refs.append(getattr(self.actors[r], method).remote(*a, **kw))
        return GroupCall(self, method, refs, ranks, combine)

    def _all(self, method: str, *args: Any, **kwargs: Any) -> GroupCall:
        return self._call(method, args=args, kwargs=kwargs)

    def _rank0_or_all(self, method: str, *args: Any, **kwargs: Any) -> GroupCall:
        # replicated weights answer on rank 0 alone; FSDP shards must all take part in the gather / forward
        ranks = None if self.sharding == "fsdp" else [0]
        return self._call(method, ranks=ranks, args=args, kwargs=kwargs)

    def _sharded(self, method: str, batch: Sequence[Trajectory] | Sequence[Group],
                 advantages: Sequence[float | list[float]] | None, combine: Any = _first, *,
                 positions: bool = False) -> GroupCall:
        """Sends each rank its shard. With ``positions`` (``train_step``) the batch is first cut into the single
        trainer's ``num_mini_batches`` consecutive parts and each part is sharded, so that every mini-batch is
        shared out between the ranks; each rank also gets its trajectories' indices in the whole batch, from which
        the ranks cut the exact same mini-batches (:meth:`PolicyStep._mini_batches`)."""
        from agentrl.trainer.advantages import as_advantage, compute_advantages

        trajs = _flatten(batch)
        if advantages is None:
            advantages = compute_advantages(batch, self.config.advantage)  # type: ignore[arg-type]
        advs = [as_advantage(a) for a in advantages]
        if len(advs) != len(trajs):
            raise ValueError(f"got {len(advs)} advantages for {len(trajs)} trajectories")
        shards = plan_shards(trajs, self.config, self.world_size, mini_batches=positions)
        per_rank = []
        for idx in shards:
            kwargs = {"positions": idx} if positions else {}
            per_rank.append((([trajs[i] for i in idx], [advs[i] for i in idx]), kwargs))
        return self._call(method, per_rank, combine=combine)

    # ------------------------------------------------------------------------------------------ the calls
    def _ping(self) -> GroupCall:
        return self._call("ping", combine=all)

    def _get_version(self) -> GroupCall:
        return self._call("get_version", ranks=[0])

    def _get_optimizer_steps(self) -> GroupCall:
        return self._call("get_optimizer_steps", ranks=[0])

    def _pid(self) -> GroupCall:
        return self._call("pid", combine=list)

    def _train_step(self, batch: Sequence[Trajectory] | Sequence[Group],
                    advantages: Sequence[float | list[float]] | None = None) -> GroupCall:
        if not _flatten(batch):
            raise ValueError("train_step got an empty batch")
        return self._sharded("train_step", batch, advantages, positions=True)

    def _sft_step(self, trajectories: Sequence[Trajectory]) -> GroupCall:
        trajs = list(trajectories)
        if not trajs:
            raise ValueError("sft_step got an empty batch")
        per_rank = [(([trajs[i] for i in idx],), {}) for idx in shard_by_loss_tokens(trajs, self.world_size)]
        return self._call("sft_step", per_rank)

    def _compute_logprobs(self, batch: Sequence[Trajectory] | Sequence[Sequence[int]]) -> GroupCall:
        return self._rank0_or_all("compute_logprobs", batch)

    def _state_dict_for_inference(self, dtype: Any = None) -> GroupCall:
        return self._rank0_or_all("state_dict_for_inference", dtype)

    def _state_dict_ref(self) -> GroupCall:
        return self._rank0_or_all("state_dict_ref")

    def _rendezvous(self) -> GroupCall:
        return self._call("rendezvous", ranks=[0])

    def _prepare_weight_broadcast(self) -> GroupCall:
        return self._all("prepare_weight_broadcast")

    def _join_weight_broadcast(self, init_args: dict[str, Any], client: Any, rank: int = 0) -> GroupCall:
        # every rank joins (rank 0 sends; the others take part in a sharded model's gathers)
        return self._call("join_weight_broadcast",
                          [((init_args, client), {"rank": r}) for r in range(self.world_size)])

    def _broadcast_weights(self) -> GroupCall:
        return self._all("broadcast_weights")

    def _save_checkpoint(self, path: str) -> GroupCall:
        return self._all("save_checkpoint", str(path))  # rank 0 writes the whole model (see the Trainer)

    def _load_checkpoint(self, path: str) -> GroupCall:
        return self._all("load_checkpoint", str(path))

    def _start_step(self) -> GroupCall:
        self._stream_groups = set()
        return self._all("start_step")

    def _accumulate(self, batch: Sequence[Trajectory] | Sequence[Group],
                    advantages: Sequence[float | list[float]] | None = None) -> GroupCall:
        trajs = _flatten(batch)
        if not trajs:
            raise ValueError("accumulate got an empty batch")
        gids = ({g.id for g in batch} if isinstance(batch[0], Group)  # type: ignore[union-attr]
                else {t.group_id for t in trajs})
        if advantages is None and gids & self._stream_groups:
            raise ValueError(f"group {sorted(gids & self._stream_groups)[0]!r} was already accumulated in this "
                             "step: advantages are per group, so each accumulate() call must carry whole groups")
        self._stream_groups |= gids

        def combine(results: list[dict[str, float]]) -> dict[str, float]:
            return {"accumulate/seqs": sum(r["accumulate/seqs"] for r in results),
                    "accumulate/loss_tokens": sum(r["accumulate/loss_tokens"] for r in results),
                    "accumulate/s": max(r["accumulate/s"] for r in results)}

        return self._sharded("accumulate", batch, advantages, combine)

    def _finish_step(self) -> GroupCall:
        return self._all("finish_step")

    def _abort_step(self) -> GroupCall:
        self._stream_groups = set()
        return self._all("abort_step")

    def _take_logprob_records(self) -> GroupCall:
        k = self.config.record_logprobs

        def combine(results: list[list[dict]]) -> list[dict]:
            # each rank sampled up to k of its own shard; keep k of their union (a seeded choice, reproducible)
            merged = [r for part in results for r in part]
            if len(merged) <= k:
                return merged
            version = merged[0]["version"]
            return random.Random(f"records:{self.config.seed}:{version}").sample(merged, k)

        return self._call("take_logprob_records", combine=combine)

    # --------------------------------------------------------------------------------------------- life
    def stop(self, reason: str = "stopped") -> None:
        """Kills every rank and frees the placement group (idempotent)."""
        from ray.util.placement_group import remove_placement_group

        if self._stopped is None:
            self._stopped = reason
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001  (already gone)
                pass
        if self.placement_group is not None:
            try:
                remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001
                pass
            self.placement_group = None


def trainer_bundle(num_cpus: float, num_gpus: float) -> dict[str, float]:
    """What one trainer rank asks Ray for."""
    bundle = {"CPU": float(num_cpus)}
    if num_gpus:
        bundle["GPU"] = float(num_gpus)
    return {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.001}


def create_trainer_group(config: TrainerConfig, model_path: str | os.PathLike, *, num_cpus: float = 1,
                         num_gpus: float = 0, strategy: str = "PACK", timeout_s: float = 600.0) -> TrainerGroup:
    """Starts ``config.world_size`` trainer ranks in one placement group (bundle per rank: ``num_cpus`` CPUs and
    ``num_gpus`` GPUs), waits for every model to load, and joins them with ``torch.distributed`` (rank 0's address
    and a free port, handed out through Ray). Raises :class:`agentrl.inference.placement.ResourceError` when Ray
    cannot place the ranks within ``timeout_s``; a rank that fails to start raises its error (the others are
    stopped)."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from agentrl.inference.placement import ResourceError
    from agentrl.trainer.actor import TrainerActor

    n = config.world_size
    bundle = trainer_bundle(num_cpus, num_gpus)
    pg = placement_group([dict(bundle) for _ in range(n)], strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise ResourceError(
            f"trainer.world_size={n}: Ray did not place {n} x {bundle} (strategy {strategy}) within {timeout_s:g} s; "
            f"Ray has {ray.available_resources()} free. Lower trainer.world_size or trainer_num_cpus, or give Ray "
            "more.") from None
    actors = [TrainerActor.options(  # type: ignore[attr-defined]
        num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), name=None,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
    ).remote(config, str(model_path)) for r in range(n)]
    group = TrainerGroup(config, actors, pg, [{"rank": r, "sharding": "?"} for r in range(n)])
    try:
        GroupCall(group, "start", [a.ping.remote() for a in actors], list(range(n)), _first).result()
        address, port = ray.get(actors[0].rendezvous.remote())
        info = GroupCall(group, "init_distributed",
                         [a.init_distributed.remote(address, port, r, n, 1800.0) for r, a in enumerate(actors)],
                         list(range(n)), list).result()
    except BaseException:
        group.stop("failed to start")
        raise
    group.info, group.sharding = info, info[0]["sharding"]
    log.info("trainer group: %d ranks (%s, %s, rendezvous %s:%d); pids %s", n, group.sharding,
             "nccl" if num_gpus else "gloo", address, port,
             ", ".join(f"rank {i['rank']}: {i['host']}:{i['pid']}" for i in info))
    return group


def create_trainer(config: TrainerConfig, model_path: str | os.PathLike, *, num_cpus: float = 1,
                   num_gpus: float = 0) -> Any:
    """One trainer actor (``world_size: 1``) or a :class:`TrainerGroup`, both with the same remote-call surface
    (``trainer.train_step.remote(batch)`` etc., awaitable). ``ray.init`` must have run."""
    if config.world_size == 1:
        from agentrl.trainer.actor import create_trainer_actor

        return create_trainer_actor(config, model_path, num_cpus=num_cpus, num_gpus=num_gpus)
    return create_trainer_group(config, model_path, num_cpus=num_cpus, num_gpus=num_gpus)


def stop_trainer(trainer: Any) -> None:
    """Stops what :func:`create_trainer` started."""
    if isinstance(trainer, TrainerGroup):
        trainer.stop()
    else:
        ray.kill(trainer)
