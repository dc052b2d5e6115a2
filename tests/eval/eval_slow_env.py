"""A slow indexed env for the eval CLI tests, used as ``eval_slow_env:SlowEnv`` (the test puts this directory on
PYTHONPATH). Each step sleeps ``delay`` seconds and ends the episode with a SWE-style info (``patch``,
``resolved``); ``fail_unless`` makes every step raise while that path does not exist; ``marker_dir`` gets one
``<index>.open`` file per reset and one ``<index>.closed`` per close, so a test can check that interrupted episodes
were closed. ``hold_from``/``gate``: the step of every episode whose index is ``>= hold_from`` waits until the path
``gate`` exists, so a test can interrupt a run that cannot have finished, however fast the machine."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrl.core import Env


class SlowEnv(Env):
    def __init__(self, n: int = 120, delay: float = 0.05, marker_dir: str | None = None, fail_unless: str | None = None,
                 hold_from: int | None = None, gate: str | None = None):
        super().__init__()
        self.n, self.delay, self.marker_dir = n, delay, marker_dir
        self.fail_unless = fail_unless  # a path: while it does not exist, every step raises
        self.hold_from, self.gate = hold_from, gate
        self.index: int | None = None

    def task_ids(self) -> list[str]:
        return [f"slow-{i}" for i in range(self.n)]

    def _mark(self, suffix: str) -> None:
        if self.marker_dir is not None and self.index is not None:
            (Path(self.marker_dir) / f"{self.index}.{suffix}").touch()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.index = (options or {}).get("index", seed or 0)
        self._mark("open")
        return [{"role": "user", "content": f"task {self.index}"}], {}

    def step(self, action):
        if self.fail_unless is not None and not Path(self.fail_unless).exists():
            raise RuntimeError("the env is down")
        ok = action == f"fix {self.index}"
        info = {"instance_id": f"slow-{self.index}", "patch": f"patch {self.index}\n" if ok else "", "resolved": ok}
        return [], float(ok), True, False, info

    async def astep(self, action):
        await asyncio.sleep(self.delay)
        if self.hold_from is not None and (self.index or 0) >= self.hold_from:
            while not Path(self.gate).exists():  # held until the test opens the gate (a cancel ends the wait)
                await asyncio.sleep(0.02)
        return self.step(action)

    async def aclose(self):
        self._mark("closed")

    @staticmethod
    def solve(conversation):
        return "fix " + conversation[-1]["content"].split()[-1]
