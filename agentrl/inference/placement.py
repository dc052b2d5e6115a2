"""Where the parts of a run go on a Ray cluster: what each part asks for, one check that the cluster has it all
(run before any model loads), and the placement group that reserves the engine replicas.

What each part asks Ray for (one "bundle" per unit):

- engine replica (``engine.replicas`` of them): ``{"CPU": engine.num_cpus, "GPU": engine.tensor_parallel_size}``
  on a cluster with GPUs (no ``GPU`` key otherwise), plus ``engine.resources``; only on nodes whose Ray labels
  match ``engine.label_selector``. The replicas share one placement group with ``engine.placement_strategy``.
- trainer rank (``trainer.world_size`` of them): ``{"CPU": trainer_num_cpus, "GPU": 1}`` (no GPU on CPU hosts);
  one placement group (``PACK``); see :mod:`agentrl.trainer.dp_group`.
- env workers: ``manager.worker_num_cpus`` each (0 by default), spread over the cluster.

:func:`check_fits` compares the sum of all asks with what Ray reports free, and each bundle with what one node
that matches its labels holds, and raises :class:`ResourceError` naming the config field and what Ray has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.config import ConfigError
from agentrl.inference.config import EngineConfig

_EPS = 1e-9


class ResourceError(ConfigError):
    """The Ray cluster cannot host what the config asks for."""


@dataclass
class Ask:
    """``count`` bundles of ``bundle`` for the part configured by ``fields`` (e.g. ``"engine.replicas=2"``)."""

    fields: str
    count: int
    bundle: dict[str, float]
    label_selector: dict[str, str] = field(default_factory=dict)

    def total(self) -> dict[str, float]:
        return {k: v * self.count for k, v in self.bundle.items() if v}


def cluster_has_gpus() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def replica_bundle(cfg: EngineConfig, gpus: bool) -> dict[str, float]:
    """What one engine replica asks Ray for."""
    bundle: dict[str, float] = {"CPU": float(cfg.num_cpus)}
    if gpus:
        bundle["GPU"] = float(cfg.tensor_parallel_size)
    bundle.update({k: float(v) for k, v in cfg.resources.items()})
    return {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.001}  # Ray refuses an empty bundle


def engine_ask(cfg: EngineConfig, gpus: bool | None = None) -> Ask | None:
    """The replicas' ask, or None when the engine does not run as Ray actors."""
    if not cfg.uses_replica_actors():
        return None
    gpus = cluster_has_gpus() if gpus is None else gpus
    fields = f"engine.replicas={cfg.replicas}" + (f" x engine.tensor_parallel_size={cfg.tensor_parallel_size}"
                                                 if gpus and cfg.tensor_parallel_size > 1 else "")
    return Ask(fields, cfg.replicas, replica_bundle(cfg, gpus), dict(cfg.label_selector))


def trainer_ask(world_size: int, num_cpus: float, gpu: bool) -> Ask:
    """The trainer ranks' ask: ``world_size`` x ``{CPU: num_cpus, GPU: 1 if gpu}``."""
    fields = f"trainer.world_size={world_size} x trainer_num_cpus={num_cpus:g}" + (" (+1 GPU each, trainer.device: "
                                                                                 "cuda)" if gpu else "")
    bundle = {"CPU": float(num_cpus), **({"GPU": 1.0} if gpu else {})}
    return Ask(fields, world_size, {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.001})


def _fmt(res: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(res.items())) or "nothing"


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool | None:
    """Whether ``labels`` satisfy ``selector``; None when the selector uses operators this check does not parse
    (``in(...)``, ``!x``): Ray decides then."""
    for k, v in selector.items():
        if not isinstance(v, str) or v.startswith("!") or "(" in v:
            return None
        if labels.get(k) != v:
            return False
    return True


def check_fits(asks: list[Ask], *, available: dict[str, float] | None = None,
               nodes: list[dict[str, Any]] | None = None) -> None:
    """Raises :class:`ResourceError` unless Ray can host every ask at once: their summed resources fit what Ray
    has free (``available``, default ``ray.available_resources()``), and each bundle fits on one alive node whose
    labels match its selector (``nodes``, default ``ray.nodes()``). The message names each ask's config fields
    and what Ray has."""
    import ray

    asks = [a for a in asks if a is not None and a.count > 0]
    if available is None:
        available = ray.available_resources()
    if nodes is None:
        nodes = ray.nodes()
    alive = [n for n in nodes if n.get("Alive", n.get("alive", True))]
    need: dict[str, float] = {}
    for a in asks:
        for k, v in a.total().items():
            need[k] = need.get(k, 0.0) + v
    short = {k: v for k, v in need.items() if v > available.get(k, 0.0) + _EPS}
    if short:
        parts = "; ".join(f"{a.fields} asks {a.count} x {{{_fmt(a.bundle)}}}" for a in asks)
        have = ", ".join(f"{k} {available.get(k, 0.0):g} free" for k in sorted(short))
        raise ResourceError(
            f"Ray cannot host this run: {parts}; that is {_fmt({k: need[k] for k in short})} but Ray has {have} "
            f"({len(alive)} node(s)). Lower the count or the per-unit ask named above, or give Ray more "
            f"(ray_num_cpus on one machine, more nodes at ray_address).")
    for a in asks:
        fitting = []
        for n in alive:
            labels = n.get("Labels") or n.get("labels") or {}
            match = _labels_match(a.label_selector, labels) if a.label_selector else True
            if match is None:
                fitting = alive  # operators in the selector: leave the decision to Ray
                break
            res = n.get("Resources") or n.get("resources") or {}
            if match and all(res.get(k, 0.0) + _EPS >= v for k, v in a.bundle.items()):
                fitting.append(n)
        if not fitting:
            sel = f" with labels {a.label_selector}" if a.label_selector else ""
            seen = "; ".join(f"node {str(n.get('NodeID', '?'))[:8]}: {_fmt(n.get('Resources') or {})}, "
                             f"labels {({k: v for k, v in (n.get('Labels') or {}).items() if not k.startswith('ray.io/')})}"
                             for n in alive[:8])
            raise ResourceError(
                f"{a.fields}: no node{sel} can hold one unit {{{_fmt(a.bundle)}}}; Ray's nodes: {seen}. "
                "Check engine.label_selector / engine.resources / engine.num_cpus against the cluster.")


def reserve(cfg: EngineConfig, gpus: bool, timeout_s: float = 120.0) -> Any:
    """Creates the replicas' placement group (one bundle per replica) and waits until Ray placed it; raises
    :class:`ResourceError` (after removing it) if it is not placed within ``timeout_s`` (resources held by
    other jobs, or a label no node has)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = replica_bundle(cfg, gpus)
    kwargs: dict[str, Any] = {}
    if cfg.label_selector:
        kwargs["bundle_label_selector"] = [dict(cfg.label_selector)] * cfg.replicas
    pg = placement_group([dict(bundle) for _ in range(cfg.replicas)], strategy=cfg.placement_strategy, **kwargs)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise ResourceError(
            f"engine.replicas={cfg.replicas}: Ray did not place {cfg.replicas} x {{{_fmt(bundle)}}} "
            f"(strategy {cfg.placement_strategy}{', labels ' + str(cfg.label_selector) if cfg.label_selector else ''}) "
            f"within {timeout_s:g} s; Ray has {_fmt(ray.available_resources())} free") from None
    return pg
