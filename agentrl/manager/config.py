"""The environment manager's typed inputs: what to run (:class:`EpisodeSpec`), how (:class:`ManagerConfig`), and
the error it raises when it cannot go on (:class:`ManagerError`)."""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Literal


@dataclass
class EpisodeSpec:
    """What to run: the env (``env_id`` registered, or ``"package.module:Class"``), its constructor kwargs, the
    reset seed, the task (passed as ``options["task"]``), extra reset ``options``, an optional ``group_id`` (one is
    generated when None) and ``max_turns`` (None: the manager's ``max_turns``)."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    task: Any = None
    group_id: str | None = None
    max_turns: int | None = None
    options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ValueError(f"EpisodeSpec.env_id must be a non-empty str, got {self.env_id!r}")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"EpisodeSpec.env_kwargs must be a dict, got {type(self.env_kwargs).__name__}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"EpisodeSpec.max_turns must be >= 1, got {self.max_turns}")


@dataclass
class EpisodeConfig:
    """How the manager runs episodes: where envs live, how many run at once, group shapes, timeouts (see
    :mod:`agentrl.manager` for the rules they drive). Everything of :class:`ManagerConfig` except the admission rule,
    which a training run derives from its own ``async_ratio`` and batch (``TrainConfig.manager`` is one of these).
    ``max_failures_per_group``: failed or stale attempts a group may replace before it is given up.
    ``infra_retries`` (0..100): fresh attempts a group member (an episode and its replacements) gets after
    infrastructure failures (its sandbox killed from outside, its engine gone, its memory or disk limit hit:
    :data:`~agentrl.manager.host.INFRA_CAUSES`), in a fresh env and so a fresh sandbox, without charging the group's
    failure budget; each failure is still counted (``failed``, ``failures/<cause>``) and each such retry in
    ``infra_retried``. Past it, such a failure is charged to the budget like any other."""

    CONFIG_HINTS: ClassVar[dict[str, str]] = {
        "async_ratio": "set async_ratio at the top level: a training run owns its admission rule",
        "batch_size": "a training run's batch is num_groups * group_size trajectories, derived, not set",
    }

    workers: int = 0  # 0: envs in this process; N: N Ray env-worker actors
    ray_address: str | None = None  # used only when Ray is not initialised yet
    ray_num_cpus: int | None = None  # for a local Ray started by the manager
    worker_num_cpus: float = 0.0  # Ray CPUs reserved per env worker
    worker_imports: list[str] = field(default_factory=list)  # modules each worker imports (registers envs)
    restart_dead_workers: bool = True
    sync_env_threads: int = 32  # thread pool for sync-only envs, per worker
    max_concurrency: int = 256
    stale_policy: Literal["cancel", "drop"] = "cancel"
    num_groups: int = 1
    group_size: int = 1
    extra_groups: int = 0
    extra_per_group: int = 0
    max_turns: int = 32
    step_timeout_s: float = 300.0
    reset_timeout_s: float = 300.0
    close_timeout_s: float = 30.0
    policy_timeout_s: float | None = None
    episode_timeout_s: float | None = None
    max_failures_per_group: int = 3
    infra_retries: int = 3
    rpc_grace_s: float = 10.0  # extra driver-side wait for a worker's reply beyond the call's own timeout
    rpc_batch_window_s: float = 0.0  # Ray workers: >0 holds requests/replies this long to send them in one call
    latency_window: int = 65536  # env step latencies kept for percentiles
    failed_history: int = 1024

    def validate(self) -> None:
        for name in ("max_concurrency", "num_groups", "group_size", "max_turns", "sync_env_threads",
                     "latency_window", "failed_history"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("workers", "extra_groups", "extra_per_group", "max_failures_per_group"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.infra_retries <= 100:
            raise ValueError(f"infra_retries must be within [0, 100], got {self.infra_retries}")
        for name in ("step_timeout_s", "reset_timeout_s", "close_timeout_s", "policy_timeout_s", "episode_timeout_s",
                     "rpc_grace_s"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be > 0, got {v}")
        if self.rpc_batch_window_s < 0:
            raise ValueError(f"rpc_batch_window_s must be >= 0, got {self.rpc_batch_window_s}")
        if self.worker_num_cpus < 0:
            raise ValueError(f"worker_num_cpus must be >= 0, got {self.worker_num_cpus}")


@dataclass
class ManagerConfig(EpisodeConfig):
    """Settings of :class:`~agentrl.manager.EnvManager`: :class:`EpisodeConfig` plus the admission rule
    (:mod:`agentrl.manager.admission`): ``async_ratio`` α (None disables the version-based admission and staleness
    rules) and the batch ``batch_size`` B in trajectories (default ``num_groups * group_size``)."""

    async_ratio: int | None = None
    batch_size: int | None = None

    @classmethod
    def of(cls, episodes: EpisodeConfig, *, async_ratio: int | None = None,
           batch_size: int | None = None) -> "ManagerConfig":
        """``episodes``' settings with this admission rule."""
        fields = {f.name: getattr(episodes, f.name) for f in dataclasses.fields(EpisodeConfig)}
        return cls(**fields, async_ratio=async_ratio, batch_size=batch_size)

    def validate(self) -> None:
        super().validate()
        if self.async_ratio is not None and self.async_ratio < 0:
            raise ValueError(f"async_ratio must be >= 0 or null, got {self.async_ratio}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        b = self.batch_size or self.num_groups * self.group_size
        if self.async_ratio is not None and b % self.group_size:
            raise ValueError(f"batch_size ({b}) must be a multiple of group_size ({self.group_size}): admission "
                             f"counts whole groups")


class ManagerError(RuntimeError):
    """The manager cannot go on (e.g. every env worker is dead) or was used wrongly."""


TaskSource = Iterable[EpisodeSpec] | Iterator[EpisodeSpec] | Callable[[], "EpisodeSpec | None"]
"""An iterable of specs, or a zero-argument callable returning the next spec (None when exhausted)."""
