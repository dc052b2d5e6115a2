"""The instances of a suite's env: every task of an env with ``task_ids()`` (BFCL, SWE), else seeds; and the
manager's episode spec of each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.config import ConfigError
from agentrl.eval.config import EnvEntry, DEFAULT_SEEDS


@dataclass(frozen=True)
class Instance:
    """One episode to run: ``env`` is the entry's label, ``instance_id`` unique within it."""

    env: str
    env_id: str
    kwargs: tuple[tuple[str, Any], ...]
    instance_id: str
    seed: int
    options: tuple[tuple[str, Any], ...] = ()
    predicts: bool = False  # the env writes SWE-bench predictions (an errored episode gets an empty patch)

    @property
    def key(self) -> tuple[str, str]:
        return (self.env, self.instance_id)


def _ensure_registered(env_id: str) -> None:
    # The BFCL and SWE ids are registered by agentrl.envs; registering here too keeps eval working in a checkout
    # where envs/__init__.py does not list them yet (idempotent).
    import gymnasium

    if env_id in gymnasium.registry:
        return
    if env_id.startswith("agentrl/BFCL-"):
        from agentrl.envs.bfcl import register_all

        register_all()
    elif env_id == "agentrl/SWE-v0":
        from agentrl.registration import register

        register("agentrl/SWE-v0", entry_point="agentrl.envs.swe:SWEEnv",
                 description="SWE-bench-style bug fixing in a docker/bwrap sandbox (offline suite)")


def _make_env(env_id: str, kwargs: dict[str, Any], max_episode_steps: int | None):
    # The manager's own constructor: a registered id, or "package.module:Class".
    from agentrl.manager.workers import make_env

    _ensure_registered(env_id)
    kw = dict(kwargs)
    if max_episode_steps is not None:
        kw["max_episode_steps"] = max_episode_steps
    return make_env(env_id, kw)


def task_ids_of(env: Any) -> list[str] | None:
    """Returns the ids of an indexed env's tasks (``options={"index": i}`` selects the i-th): its ``task_ids()``,
    or the ``instance_id`` of each of its ``instances`` (SWE); None for seed-indexed envs."""
    fn = getattr(env, "task_ids", None)
    if callable(fn):
        return [str(t) for t in fn()]
    insts = getattr(env, "instances", None)
    if isinstance(insts, (list, tuple)) and insts and all(hasattr(i, "instance_id") for i in insts):
        return [str(i.instance_id) for i in insts]
    return None


def list_instances(entry: EnvEntry, limit: int | None, seed: int = 0) -> list[Instance]:
    """Returns the entry's instances in a fixed order (the first ``limit`` if given; ``entry.limit`` wins).

    Raises :class:`ConfigError` naming the env if it cannot be made."""
    n = entry.limit or limit
    try:
        env = _make_env(entry.id, entry.kwargs, None)
    except Exception as e:
        raise ConfigError(f"env {entry.label!r}: cannot make {entry.id!r}: {type(e).__name__}: {e}") from e
    try:
        ids = task_ids_of(env.unwrapped)
        kw = tuple(sorted(entry.kwargs.items()))
        predicts = bool(getattr(env.unwrapped, "writes_predictions", False))
        if ids is not None:
            ids = ids[: n or None]
            return [Instance(entry.label, entry.id, kw, str(t), i, (("index", i),), predicts) for i, t in enumerate(ids)]
        count = n or DEFAULT_SEEDS
        return [Instance(entry.label, entry.id, kw, f"seed-{s}", s) for s in range(seed, seed + count)]
    finally:
        env.close()


def episode_spec(inst: Instance, max_episode_steps: int | None = None) -> Any:
    """Returns the manager's :class:`~agentrl.manager.EpisodeSpec` of an instance: ``seed``, reset ``options``
    (``{"index": i}`` for indexed envs) and, for indexed envs, ``task={"instance_id", "index"}`` (which policies
    see as ``meta.task`` and envs as ``options["task"]``)."""
    from agentrl.manager import EpisodeSpec

    kwargs = dict(inst.kwargs)
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    options = dict(inst.options)
    task = {"instance_id": inst.instance_id, **options} if options else None
    return EpisodeSpec(env_id=inst.env_id, env_kwargs=kwargs, seed=inst.seed, task=task,
                       group_id=f"{inst.env}/{inst.instance_id}", options=options or None)
