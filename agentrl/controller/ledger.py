"""The training tasks of a run: which task each group plays, which were trained, which are still open, which were
given up, and what a resumed run replays.

Task ``i`` plays seed ``seeds(i)`` (by default ``env.seed_start + i``; the controller passes
:attr:`agentrl.controller.heldout.HeldOut.train`, which skips held-out tasks) in group ``task<i>``. A task is
opened once, then either trained (:meth:`TaskLedger.trained`) or dropped (:meth:`TaskLedger.dropped`: the manager
abandoned its group, its failure budget spent or given up by its policy, or a tail-batching long round could not
train it).

Rule (the same whether or not the run is interrupted): a dropped task is closed. It is never replayed, neither
later in the run nor after a resume: checkpoints list it under ``dropped_tasks``, not under ``open_tasks``, and
each step's metrics row lists the tasks dropped since the previous row. Only tasks that were open (opened, not yet
trained or dropped) at the checkpoint are replayed after a resume, so across a crash every task is trained at most
once and none that an uninterrupted run would train is skipped.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Callable, Iterable

from agentrl.controller.heldout import HeldOutError
from agentrl.manager import EpisodeSpec
from agentrl.trajectory import Group

log = logging.getLogger("agentrl.train")


def task_index(group_id: str) -> int:
    """The task index of a group id ``task<i>``."""
    return int(group_id[len("task"):])


class TaskLedger:
    """The training tasks (see the module docstring). ``env``: the run's
    :class:`~agentrl.controller.config.EnvConfig`; ``next_task``/``replay``/``dropped_before``: a checkpoint's
    ``next_task``, ``open_tasks`` and ``dropped_tasks``."""

    def __init__(self, env: Any, next_task: int = 0, replay: list[int] | None = None,
                 seeds: Callable[[int], int] | None = None, dropped_before: Iterable[int] = ()):
        self.env = env
        self.seeds = seeds or (lambda i: env.seed_start + i)
        self.next_task = int(next_task)
        self._replay = collections.deque(sorted(int(i) for i in replay or ()))
        self.open: set[int] = set()
        self.dropped_all: set[int] = {int(i) for i in dropped_before}
        self._dropped_new: list[int] = []
        self.error: str | None = None  # why no further task could be opened (the seed range ran out)

    def open_task(self) -> int | None:
        """Opens the next task, replayed tasks first, then new ones; returns its index, or None when no seed is
        left (:attr:`error` says why)."""
        if self._replay:
            i = self._replay.popleft()
        else:
            try:
                self.seeds(self.next_task)
            except HeldOutError as e:
                if self.error is None:
                    log.error("no further training task: %s", e)
                self.error = str(e)
                return None
            i, self.next_task = self.next_task, self.next_task + 1
        self.open.add(i)
        return i

    def spec_for(self, i: int) -> EpisodeSpec:
        """Task ``i``'s spec (seed ``seeds(i)``, group ``task<i>``)."""
        return EpisodeSpec(self.env.id, env_kwargs=dict(self.env.kwargs), seed=self.seeds(i), group_id=f"task{i}")

    def next_spec(self) -> EpisodeSpec | None:
        """The manager's task source: replayed tasks first, then new ones (None: no seed left)."""
        i = self.open_task()
        return None if i is None else self.spec_for(i)

    def trained(self, groups: list[Group]) -> list[int]:
        """Marks the tasks of ``groups`` trained; returns their indices."""
        ids = [task_index(g.id) for g in groups]
        self.open.difference_update(ids)
        return ids

    def dropped(self, ids: Iterable[int | str]) -> None:
        """Closes tasks the run gave up on (indices, or group ids ``task<i>``): they are never replayed."""
        for x in ids:
            i = task_index(x) if isinstance(x, str) else int(x)
            if i in self.open:
                self.open.discard(i)
                self.dropped_all.add(i)
                self._dropped_new.append(i)

    def take_dropped(self) -> list[int]:
        """The tasks dropped since the last call (for the step's metrics row)."""
        out, self._dropped_new = self._dropped_new, []
        return out

    def state(self) -> dict[str, Any]:
        """``next_task``, ``open_tasks`` (opened, not trained, including those still waiting to be replayed) and
        ``dropped_tasks``."""
        return {"next_task": self.next_task, "open_tasks": sorted(self.open | set(self._replay)),
                "dropped_tasks": sorted(self.dropped_all)}
