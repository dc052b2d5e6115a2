"""Envs that fail the way env workers must survive (importable inside Ray env workers), for tests and the
fault-injection benchmark. Use them by entry point, e.g. ``EpisodeSpec("agentrl.testing.faulty_envs:SyncHangEnv")``.

- :class:`SyncHangEnv`: a sync-only env whose ``step`` (or ``reset``) blocks its thread until :func:`release_hung`
  is called in the same process (never, in a worker).
- :class:`StuckLoopEnv`: an async env whose ``astep`` blocks the worker's whole event loop (``time.sleep``), as a
  buggy env or a C extension holding the GIL would: the worker stops answering without dying. With
  ``once_file``, only the first instance (on any process of this host) to create that file gets stuck.
- :class:`InfraFailEnv`: its sandbox "fails" the way a real one does (a ``SandboxError`` naming its
  ``failure_cause``) at the step ``fail_at`` (``-1``: reset) of the first ``fail_times`` instances opened with the
  same ``key`` in this process; the others run ``turns`` steps and terminate with reward 1.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from agentrl.core import Env

_RELEASE = threading.Event()


def release_hung() -> None:
    """Lets every :class:`SyncHangEnv` call blocked in this process return (tests clean up their threads)."""
    _RELEASE.set()


class SyncHangEnv(Env):
    """Sync ``reset``/``step``; the step number ``hang_at`` (``-1``: reset) blocks until :func:`release_hung`."""

    description = "test env: a sync step that never returns"

    def __init__(self, hang_at: int = 0, turns: int = 3):
        super().__init__()
        self.hang_at, self.turns, self.t = hang_at, turns, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        if self.hang_at == -1:
            _RELEASE.wait()
        return "hang test", {}

    def step(self, action: str):
        if self.t == self.hang_at:
            _RELEASE.wait()
        self.t += 1
        return f"turn {self.t}", 1.0, self.t >= self.turns, False, {"pid": os.getpid()}


class StuckLoopEnv(Env):
    """Async; its first step blocks the event loop for ``stuck_s`` seconds (only in the instance that creates
    ``once_file``, when given), else steps take ``step_latency`` seconds of ``asyncio.sleep``."""

    description = "test env: an async step that blocks the worker's event loop"

    def __init__(self, once_file: str | None = None, stuck_s: float = 3600.0, turns: int = 3,
                 step_latency: float = 0.05):
        super().__init__()
        self.once_file, self.stuck_s, self.turns, self.step_latency = once_file, stuck_s, turns, step_latency
        self.t = 0

    def _wins(self) -> bool:
        if self.once_file is None:
            return True
        try:
            os.close(os.open(self.once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        return [{"role": "user", "content": f"task={(options or {}).get('task')}"}], {}

    async def astep(self, action: str):
        import asyncio

        if self.t == 0 and self._wins():
            time.sleep(self.stuck_s)  # blocks the whole loop: nothing else in this worker runs
        await asyncio.sleep(self.step_latency)
        self.t += 1
        return [{"role": "user", "content": f"turn {self.t}"}], 1.0, self.t >= self.turns, False, {"pid": os.getpid()}


_INFRA_OPENED: dict[str, int] = {}


class InfraFailEnv(Env):
    """See the module docstring; :data:`_INFRA_OPENED` counts the instances reset per ``key``."""

    def __init__(self, key: str, cause: str = "sandbox_lost", fail_at: int = 0, fail_times: int = 1, turns: int = 2):
        super().__init__()
        self.key, self.cause, self.fail_at, self.fail_times, self.turns = key, cause, fail_at, fail_times, turns
        self.t = 0
        self.failing = False

    def _fail(self) -> None:
        from agentrl.sandboxes import SandboxError

        raise SandboxError(f"injected infrastructure failure ({self.cause})", sandbox_id=f"fake-{self.key}",
                           cause=self.cause)

    async def areset(self, *, seed=None, options=None):
        n = _INFRA_OPENED.get(self.key, 0)
        _INFRA_OPENED[self.key] = n + 1
        self.failing, self.t = n < self.fail_times, 0
        if self.failing and self.fail_at < 0:
            self._fail()
        return [{"role": "user", "content": f"attempt {n}"}], {"attempt": n}

    async def astep(self, action):
        if self.failing and self.t == self.fail_at:
            self._fail()
        self.t += 1
        done = self.t >= self.turns
        return [{"role": "user", "content": f"turn {self.t}"}], 1.0 if done else 0.0, done, False, {"t": self.t}
