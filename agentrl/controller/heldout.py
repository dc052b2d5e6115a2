"""Held-out evaluation by task content: which seeds evaluation, training and warm-start demonstrations play.

Seed ranges alone do not hold tasks out: a 3x3 FrozenLake has a few thousand distinct boards, with the common ones
drawn by many seeds, and a dataset env takes its seed modulo the dataset's size. So the evaluation set is chosen by
the env's content identity (:meth:`agentrl.core.Env.task_key`) and withheld from everything else::

    evaluation   seeds EVAL_SEED_START + j, j = 0, 1, ...: a seed is kept when its task is new, until eval.episodes
                 distinct tasks (or the scan gives up: fewer, reported as ``tasks``)
    training     task i = the i-th seed from env.seed_start whose task is not an evaluation task, below EVAL_SEED_START
    warm start   demonstration i = the i-th seed from DEMO_SEED_START whose task is not an evaluation task

Invariants: no training or demonstration episode plays a task an evaluation episode plays; every evaluation
episode plays a different task; the maps depend on the config alone (a resumed run replays the same seeds). An env
whose ``task_key`` is None (seeds identify tasks) keeps the plain ranges, and no env instance is built for keys.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from agentrl.config import ConfigError

EVAL_SEED_START = 1_000_000  # held-out seeds: never used for training or demonstrations
DEMO_SEED_START = 2_000_000
MAX_SKIPPED = 100_000  # consecutive held-out seeds after which a range is declared exhausted


class HeldOutError(ConfigError):
    """No seed is left to play: the range ran into another one, or every task is held out."""


def _keyed(env_id: str) -> bool:
    """Whether ``env_id``'s class overrides :meth:`~agentrl.core.Env.task_key` (else seeds identify tasks)."""
    from agentrl.core import Env
    from agentrl.registration import spec

    ep = spec(env_id).entry_point
    if isinstance(ep, str):
        module, _, attr = ep.partition(":")
        ep = getattr(importlib.import_module(module), attr)
    if not inspect.isclass(ep):
        return True  # a factory: ask the instance it builds
    return inspect.getattr_static(ep, "task_key", Env.task_key) is not Env.__dict__["task_key"]


class SeedMap:
    """Index ``i`` -> the ``i``-th seed from ``start`` (below ``stop``) whose task is not held out."""

    def __init__(self, held: "HeldOut", start: int, stop: int | None, what: str):
        self.held, self.start, self.stop, self.what = held, start, stop, what
        self._seeds: list[int] = []
        self._next = start

    def __call__(self, i: int) -> int:
        while len(self._seeds) <= i:
            skipped = 0
            while self.held.is_held_out(self._next):
                self._next += 1
                skipped += 1
                if skipped > MAX_SKIPPED:
                    raise HeldOutError(f"{self.what}: {MAX_SKIPPED} seeds in a row from {self._next - skipped} "
                                       f"play evaluation tasks; every task seems held out (lower eval.episodes)")
            if self.stop is not None and self._next >= self.stop:
                raise HeldOutError(f"{self.what}: task {len(self._seeds)} would use seed {self._next} >= {self.stop}, "
                                   f"where the held-out evaluation seeds start (lower env.seed_start)")
            self._seeds.append(self._next)
            self._next += 1
        return self._seeds[i]


class HeldOut:
    """The evaluation set of ``env`` (an :class:`~agentrl.controller.config.EnvConfig`) with ``episodes`` distinct
    tasks, and the training and demonstration seed maps that avoid them (see the module docstring). ``scan``: how
    many evaluation seeds to try for new tasks."""

    def __init__(self, env: Any, episodes: int, scan: int | None = None):
        self.env_cfg = env
        self._env = None
        if episodes and _keyed(env.id):
            import agentrl

            built = agentrl.make(env.id, **dict(env.kwargs)).unwrapped
            if type(built).task_key is not _base_task_key():
                self._env = built
        self.eval_seeds: list[int] = []
        self.eval_keys: set[str] = set()
        limit = scan if scan is not None else max(20 * episodes, 2000)
        for j in range(min(limit, DEMO_SEED_START - EVAL_SEED_START)):
            if len(self.eval_seeds) >= episodes:
                break
            seed = EVAL_SEED_START + j
            k = self.key(seed)
            if k is None or k not in self.eval_keys:
                self.eval_seeds.append(seed)
                if k is not None:
                    self.eval_keys.add(k)
        self.train = SeedMap(self, env.seed_start, EVAL_SEED_START, "training")
        self.demos = SeedMap(self, DEMO_SEED_START, None, "warm start")

    @property
    def keyed(self) -> bool:
        """Whether tasks are told apart by content (the env has a ``task_key``)."""
        return self._env is not None

    def key(self, seed: int) -> str | None:
        return None if self._env is None else self._env.task_key(seed)

    def is_held_out(self, seed: int) -> bool:
        """Whether ``seed`` plays an evaluation task (its content, or the seed itself for an env without keys)."""
        if self._env is None:
            return EVAL_SEED_START <= seed < DEMO_SEED_START and seed - EVAL_SEED_START < len(self.eval_seeds)
        return self.key(seed) in self.eval_keys

    def close(self) -> None:
        if self._env is not None:
            self._env.close()


def _base_task_key() -> Any:
    from agentrl.core import Env

    return Env.task_key
