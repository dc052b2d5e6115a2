"""Starting Ray: the one place where agentrl calls ``ray.init``, so that every Ray it starts has the same settings.

Ray starts its worker processes at niceness 15 by default (its ``worker_niceness``), so that its own daemons keep
priority over user code. agentrl's workers are its trainer ranks, engine replicas and env workers, and they share the
host's cores with what the driver runs at its own priority: the in-driver vLLM engine and its processes, the agent
loops. At +15 a trainer rank gets about a thirtieth of a core that it shares with the engine (the kernel's weights for
nice 0 and 15 are 1024 and 36), so on a host with few cores the trainer ran only in what the engine left, and its
step time followed the engine's load rather than its own work. A Ray that agentrl starts therefore runs its workers
at the driver's priority (niceness 0 relative to it), as NeMo RL's and rLLM's launchers do with
``RAY_worker_niceness=0``.

A cluster that is joined (``address``) keeps its own setting (Ray refuses ``_system_config`` there; set
``RAY_worker_niceness`` where that cluster is started), and ``RAY_worker_niceness`` in the environment wins over ours.
"""

from __future__ import annotations

import os
from typing import Any

WORKER_NICENESS = 0  # relative to the driver


def init(address: str | None = None, num_cpus: int | None = None, *, log_to_driver: bool = False) -> None:
    """``ray.init`` without the dashboard; a local cluster (no ``address``) with ``num_cpus`` CPUs (Ray's count when
    None) and its workers at the driver's priority."""
    import ray

    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": log_to_driver}
    if address:
        kw["address"] = address
    else:
        kw["num_cpus"] = num_cpus
        if "RAY_worker_niceness" not in os.environ:
            kw["_system_config"] = {"worker_niceness": WORKER_NICENESS}
    ray.init(**kw)
