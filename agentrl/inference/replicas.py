"""K in-process vLLM engines as Ray actors behind one router: ``engine.replicas: K``.

Layout: each :class:`~agentrl.inference.replica_actor.EngineReplica` actor owns one :class:`~agentrl.inference.vllm_engine.VLLMEngine` (its own
``AsyncLLM``, engine-core process and KV cache; ``tensor_parallel_size`` GPUs on GPU hosts). The actors sit in one
placement group (:mod:`agentrl.inference.placement`). :class:`ReplicatedEngine`, in the driver, is the
:class:`~agentrl.inference.base.InferenceEngine` the agent loop sees: it routes each request with
:class:`~agentrl.inference.router.Router` (a trajectory stays on its replica, for the prefix cache; new ones go to
the replica with the fewest requests in flight) and fans weight updates out to every replica.

Invariants:

- Versions are exact per token: each replica's engine core labels every step with that replica's weight version,
  and a :class:`~agentrl.inference.base.Generation` is produced by one replica, so a token's version is the
  version of the replica that sampled it, at that step. A trajectory that moves to another replica (its replica
  died) keeps exact versions: each turn's tokens carry the labels of the replica that made them.
- Updates cover all replicas: :meth:`ReplicatedEngine.update_weights` checks the state dict on every replica
  (a bad one raises before anything pauses), pauses all, loads on all, then labels and resumes all. Between pause
  and resume no replica generates. A replica that dies or fails a phase is retired (out of routing for good: its
  weights are in an unknown state) with a warning, and the others go on at the new version;
  :class:`EngineReplicaError` only when no replica is left.
- The broadcast path (``weight_sync: nccl|gloo``) keeps the same shape: the trainer's sender pauses, fills and
  finishes every replica through :meth:`ReplicatedEngine.weight_sync_client`; the driver labels and resumes them
  with :meth:`ReplicatedEngine.commit_weight_update` (:mod:`agentrl.inference.weight_transfer`). Serving LoRA,
  the round is the adapter alone and the replicas switch to it at the commit (:mod:`agentrl.inference.lora`).
- Streaming (:meth:`ReplicatedEngine.generate_streaming`, the gateway's path): the replica's actor relays each
  engine step's new ids as a Ray streaming generator, so the caller sees tokens as they are made, not the
  whole completion at the end.
- CPU hosts: the replicas of one node split its cores (``VLLM_CPU_OMP_THREADS_BIND``) so their workers do not
  all pin the same core (vLLM's automatic binding would, for every replica).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections import defaultdict
from typing import Any, Callable

import ray

from agentrl import raystart
from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.inference.config import EngineConfig
from agentrl.inference.replica_actor import EngineReplica
from agentrl.inference.router import Router


log = logging.getLogger("agentrl.inference")


class EngineReplicaError(RuntimeError):
    """A replica died or failed an update; the message names it."""


EngineReplicaActor = ray.remote(EngineReplica)


def place_replicas(cfg: EngineConfig, pg: Any, gpus: bool) -> list[Any]:
    """Starts ``cfg.replicas`` :class:`EngineReplica` actors, actor ``i`` in bundle ``i`` of ``pg`` (no engine
    yet: :meth:`EngineReplica.start` loads the model)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    opts: dict[str, Any] = {"num_cpus": cfg.num_cpus, "max_concurrency": 10_000}
    if cfg.resources:
        opts["resources"] = dict(cfg.resources)
    if gpus:
        opts["num_gpus"] = cfg.tensor_parallel_size
    return [EngineReplicaActor.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i), **opts).remote(i)
        for i in range(cfg.replicas)]


def thread_binding(infos: list[dict[str, Any]], gpus: bool) -> list[dict[str, str]]:
    """Per replica (``infos``: :meth:`EngineReplica.node_info` of each), the environment its engine starts with:
    on CPU hosts with several replicas on one node, ``VLLM_CPU_OMP_THREADS_BIND`` = its share of the node's cores
    (``nobind`` if fewer cores than replicas); one replica on a node keeps vLLM's own binding. A value set in this
    process's environment wins."""
    envs: list[dict[str, str]] = [{} for _ in infos]
    if gpus:
        return envs
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return [{"VLLM_CPU_OMP_THREADS_BIND": os.environ["VLLM_CPU_OMP_THREADS_BIND"]} for _ in infos]
    by_node: dict[str, list[int]] = defaultdict(list)
    for i, info in enumerate(infos):
        by_node[info["node_id"]].append(i)
    for idxs in by_node.values():
        if len(idxs) < 2:
            continue
        cores = infos[idxs[0]]["cores"]
        share = len(cores) // len(idxs)
        for j, i in enumerate(idxs):
            envs[i]["VLLM_CPU_OMP_THREADS_BIND"] = (",".join(str(c) for c in cores[j * share:(j + 1) * share])
                                                    if share >= 1 else "nobind")
    return envs


class ReplicaWeightSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over the replicas (picklable; used in the trainer's sender).

    Each call fans out to every replica and returns when all are done. ``init_weight_transfer_engine`` gives
    replica ``i`` the ranks after replica ``i - 1``'s workers (``rank_offset + i * tensor_parallel_size``): vLLM
    numbers an engine's workers from its own ``rank_offset``, and the replicas are separate engines.
    ``start_weight_update`` pauses (``pause_mode``) before starting; ``finish_weight_update`` leaves the replicas
    paused until :meth:`ReplicatedEngine.commit_weight_update` (or until a ``weight_version`` given here)."""

    def __init__(self, handles: list[Any], tp_size: int, pause_mode: str):
        self.handles, self.tp_size, self.pause_mode = list(handles), tp_size, pause_mode

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        base = int(init_info.get("rank_offset", 1))
        ray.get([h.init_weight_transfer.remote(dict(init_info, rank_offset=base + i * self.tp_size))
                 for i, h in enumerate(self.handles)])

    def check_update(self, update_info: dict[str, Any]) -> None:
        ray.get(self.handles[0].check_update.remote(update_info))

    def start_weight_update(self) -> None:
        ray.get([h.start_weight_update.remote(self.pause_mode) for h in self.handles])

    def update_weights(self, update_info: dict[str, Any]) -> None:
        ray.get([h.receive_weights.remote(update_info) for h in self.handles])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        ray.get([h.finish_weight_update.remote() for h in self.handles])
        if weight_version is not None:
            ray.get([h.commit.remote(int(weight_version)) for h in self.handles])


class ReplicatedEngine(InferenceEngine):
    """``cfg.replicas`` engines as Ray actors behind one router (module docstring). Construction checks that Ray
    can host them (:class:`~agentrl.inference.placement.ResourceError` before any model loads), reserves a
    placement group, starts the engines in parallel and blocks until all are ready; from async code use
    ``await ReplicatedEngine.create(cfg)``. Starts a local Ray if none is running (and stops it on
    :meth:`close`). Use it from one event loop at a time.

    Extra API: :attr:`model_path`, :attr:`max_model_len`, :attr:`start_times_s`, :meth:`get_tokenizer`,
    :meth:`prompt_logprobs`, :meth:`weights_digests`, :meth:`replica_versions`, :meth:`replica_for`,
    :meth:`end_session`, and the broadcast API :meth:`weight_sync_client`, :meth:`trainer_init_args`,
    :meth:`commit_weight_update`.
    """

    def __init__(self, cfg: EngineConfig):
        from agentrl.inference.placement import check_fits, cluster_has_gpus, engine_ask, reserve

        cfg.validate()
        if cfg.backend != "vllm":
            raise ValueError(f"ReplicatedEngine needs backend='vllm', got {cfg.backend!r}")
        self.cfg = cfg
        path = cfg.resolved_model()
        # Replicas may run in another working directory: hand them an absolute path when it is a local one.
        self.model_path = os.path.abspath(path) if os.path.exists(path) else path
        self.max_model_len = cfg.max_model_len
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            raystart.init()
        self._version, self._closed = 0, False
        self._lock: asyncio.Lock | None = None
        self._where: dict[str, int] = {}
        self.pg: Any = None
        self.replicas: list[Any] = []
        try:
            self.gpus = cluster_has_gpus()
            check_fits([engine_ask(cfg, self.gpus)])
            self.pg = reserve(cfg, self.gpus)
            self._start()
        except BaseException:
            self._teardown()
            raise
        self.router, self.alive = Router(len(self.replicas)), [True] * len(self.replicas)

    @classmethod
    async def create(cls, cfg: EngineConfig) -> "ReplicatedEngine":
        """Starts the replicas without blocking the caller's event loop."""
        return await asyncio.to_thread(cls, cfg)

    def _start(self) -> None:
        cfg = self.cfg
        self.replicas = place_replicas(cfg, self.pg, self.gpus)
        infos = ray.get([r.node_info.remote() for r in self.replicas], timeout=cfg.start_timeout_s)
        self.nodes = [info["node_id"] for info in infos]
        envs = thread_binding(infos, self.gpus)
        model = dataclasses.replace(cfg, model=self.model_path)
        self.start_times_s: list[float] = ray.get([r.start.remote(model, envs[i]) for i, r in enumerate(self.replicas)],
                                                  timeout=cfg.start_timeout_s)

    # ---- InferenceEngine ------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The version of the last completed update (all replicas hold it)."""
        return self._version

    def _live(self) -> list[int]:
        return [i for i, a in enumerate(self.alive) if a]

    def dead(self) -> str | None:
        return None if self._live() else "every engine replica died"

    def _pick(self, session_id: str | None) -> int:
        for _ in range(len(self.replicas) + 1):
            i = self.router.pick(session_id)
            if self.alive[i]:
                return i
            self.router.mark_unhealthy(i)
        raise EngineReplicaError("no engine replica is alive")

    def _retire(self, i: int, *, kill: bool = False) -> None:
        """Takes replica ``i`` out of routing for good (``kill``: also stops its actor, freeing its resources)."""
        self.alive[i] = False
        self.router.mark_unhealthy(i)
        if kill:
            try:
                ray.kill(self.replicas[i], no_restart=True)
            except Exception:
                pass

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None
    ) -> Generation:
        """Generates on the replica the router picks (the trajectory's replica for ``session_id``); same contract
        as :meth:`VLLMEngine.generate <agentrl.inference.vllm_engine.VLLMEngine.generate>`. A replica that dies
        before answering is retired and the request goes to another one (nothing of it was returned)."""
        return await self._routed(prompt_ids, params, request_id, session_id, None)

    async def generate_streaming(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None,
        on_tokens: Callable[[list[int]], None],
    ) -> Generation:
        """:meth:`generate`, telling ``on_tokens`` each output step's new ids as the replica's engine makes them
        (the actor streams them back: a Ray streaming generator). A replica that dies before telling anything is
        retired and the request goes to another one; after the first ids told it raises
        :class:`EngineReplicaError`, since what the caller was told cannot be taken back."""
        return await self._routed(prompt_ids, params, request_id, session_id, on_tokens)

    async def _routed(self, prompt_ids: list[int], params: SamplingParams, request_id: str, session_id: str | None,
                      tell: Callable[[list[int]], None] | None) -> Generation:
        if self._closed:
            raise RuntimeError("ReplicatedEngine is closed")
        params.validate()
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        while True:
            i = self._pick(session_id)
            self.router.started(i)
            self._where[request_id] = i
            told = False
            try:
                if tell is None:
                    return await self.replicas[i].generate.remote(list(prompt_ids), params, request_id)
                async for ref in self.replicas[i].generate_stream.options(num_returns="streaming").remote(
                        list(prompt_ids), params, request_id):
                    item = await ref
                    if isinstance(item, Generation):
                        return item
                    told = True
                    tell(item)
                raise EngineReplicaError(f"request {request_id}: replica {i} ended its stream without a result")
            except asyncio.CancelledError:
                self.replicas[i].abort.remote(request_id)  # the caller went away: free the replica's slot
                raise
            except ray.exceptions.RayActorError:
                self._retire(i)
                if told:
                    raise EngineReplicaError(f"request {request_id}: replica {i} died mid-stream") from None
                if not self._live():
                    raise EngineReplicaError(f"request {request_id}: every engine replica died") from None
            finally:
                self.router.finished(i)
                self._where.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        """Aborts one request on its replica; its ``generate`` returns the tokens so far with ``"abort"``."""
        i = self._where.get(request_id)
        if i is not None and self.alive[i]:
            await self.replicas[i].abort.remote(request_id)

    async def update_weights(self, state_dict: dict[str, Any] | ray.ObjectRef, version: int, *,
                             pause_mode: str | None = None) -> int:
        """Loads ``state_dict`` on every replica and makes ``version`` current (module docstring: check all, pause
        all, load all, label and resume all). The state dict travels once through Ray's object store; pass an
        ``ObjectRef`` to one that is already there (the trainer's ``state_dict_ref``) and it never enters this
        process. Returns the bytes one replica loaded."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, got {type(version).__name__}")
        mode = pause_mode or self.cfg.pause_mode
        if mode not in ("abort", "keep"):
            raise ValueError(f"pause_mode must be 'abort' or 'keep', got {mode!r}")
        ref = state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(state_dict)
        async with self._update_lock():
            # Check on every replica first: a bad state dict raises here, before anything pauses.
            sizes = await self._each("prepare", lambda i: self.replicas[i].prepare.remote(ref), raise_errors=True)
            await self._each("pause", lambda i: self.replicas[i].pause.remote(mode))
            await self._each("load", lambda i: self.replicas[i].load_prepared.remote())
            await self._each("commit", lambda i: self.replicas[i].commit.remote(version))
            self._version = version
        return max(sizes, default=0)

    async def _each(self, phase: str, call: Any, *, raise_errors: bool = False) -> list[Any]:
        """Runs ``call(i)`` on every live replica at once; returns the results of those that succeeded. A replica
        that dies, or fails a phase after the pause (its weights are then in an unknown state), is retired and the
        others go on; raises :class:`EngineReplicaError` when none is left. With ``raise_errors`` (the check before
        pausing), an error of a live replica is raised as is."""
        live = self._live()
        results = await asyncio.gather(*[call(i) for i in live], return_exceptions=True)
        ok = []
        for i, r in zip(live, results):
            if not isinstance(r, BaseException):
                ok.append(r)
                continue
            if raise_errors and not isinstance(r, ray.exceptions.RayActorError):
                raise r
            log.warning("engine replica %d failed the %s phase of a weight update and is retired: %s", i, phase, r)
            self._retire(i, kill=True)
        if not self._live():
            raise EngineReplicaError(f"weight update: every engine replica failed (last phase: {phase})")
        return ok

    def _update_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    # ---- broadcast path --------------------------------------------------------------------------------------
    def weight_sync_client(self) -> ReplicaWeightSyncClient:
        """The control-plane client a trainer's weight-transfer sender drives (picklable; see
        :mod:`agentrl.inference.weight_transfer`)."""
        self._require_broadcast()
        return ReplicaWeightSyncClient([self.replicas[i] for i in self._live()], self.cfg.tensor_parallel_size,
                                       self.cfg.pause_mode)

    def trainer_init_args(self, master_address: str, master_port: int, *, rank: int = 0, **extra: Any) -> dict:
        """The arguments of vLLM's trainer-side init info for these replicas (1 sender + replicas x
        tensor_parallel_size workers), as a plain dict: the trainer makes the info of it
        (:func:`agentrl.inference.weight_transfer.trainer_init_info`), so that the driver need not import vLLM's
        weight-transfer modules (~12 s of a core on the CPU) for a dataclass only the trainer reads."""
        self._require_broadcast()
        world = 1 + len(self._live()) * self.cfg.tensor_parallel_size
        return dict(weight_sync=self.cfg.resolved_weight_sync(), master_address=master_address,
                    master_port=master_port, world_size=world, rank=rank, **extra)

    async def commit_weight_update(self, version: int) -> None:
        """After the trainer's ``send_weights``: labels the received weights ``version`` on every replica and
        resumes them."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, got {type(version).__name__}")
        async with self._update_lock():
            await self._each("commit", lambda i: self.replicas[i].commit.remote(version))
            self._version = version

    def _require_broadcast(self) -> None:
        if self.cfg.resolved_weight_sync() not in ("nccl", "gloo"):
            raise RuntimeError(f"engine.weight_sync={self.cfg.weight_sync!r}: the broadcast API needs 'nccl' (GPU) "
                               "or 'gloo' (CPU), set before the engines start")

    # ---- extras -----------------------------------------------------------------------------------------------
    def replica_for(self, session_id: str) -> int | None:
        """The replica a trajectory is pinned to (None before its first request)."""
        return self.router.backend_for(session_id)

    def end_session(self, session_id: str) -> None:
        self.router.end_session(session_id)

    def get_tokenizer(self) -> Any:
        """The model's tokenizer, with the ids its ``tokenizer.json`` defines (:func:`agentrl.chat.load_tokenizer`)."""
        from agentrl.chat import load_tokenizer

        return load_tokenizer(self.cfg.tokenizer or self.model_path)

    async def prompt_logprobs(self, token_ids: list[int], replica: int = 0) -> list[float]:
        """Log-probabilities of ``token_ids[1:]`` under replica ``replica``'s current weights."""
        return await self.replicas[replica].prompt_logprobs.remote(list(token_ids))

    async def weights_digests(self) -> list[str]:
        """Per live replica, a digest of the weights its worker holds."""
        return list(await asyncio.gather(*[self.replicas[i].weights_digest.remote() for i in self._live()]))

    async def weights_digest(self) -> str:
        """The digest all live replicas agree on; raises EngineReplicaError if they differ."""
        digests = await self.weights_digests()
        if len(set(digests)) != 1:
            raise EngineReplicaError(f"replicas hold different weights: {digests}")
        return digests[0]

    async def replica_versions(self) -> list[int]:
        return list(await asyncio.gather(*[self.replicas[i].version.remote() for i in self._live()]))

    async def close(self) -> None:
        """Stops every replica (engine first, then the actor), frees the placement group; idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._teardown)

    def close_sync(self) -> None:
        if not self._closed:
            self._closed = True
            self._teardown()

    def _teardown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if self.replicas:
            # Engine first (vLLM stops its engine-core process), then the actor; a dead replica just fails its close.
            refs = [r.close.remote() for r in self.replicas]
            for ref in refs:
                try:
                    ray.get(ref, timeout=60)
                except Exception:
                    pass
            for r in self.replicas:
                try:
                    ray.kill(r, no_restart=True)
                except Exception:
                    pass
            self.replicas = []
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:
                pass
            self.pg = None
        if self._own_ray and ray.is_initialized():
            ray.shutdown()

    async def __aenter__(self) -> "ReplicatedEngine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
