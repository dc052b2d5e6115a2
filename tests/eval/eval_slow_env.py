"""A slow indexed env for the eval CLI tests, used as ``eval_slow_env:SlowEnv`` (the test puts this directory on
PYTHONPATH). Each step sleeps ``delay`` seconds and ends the episode with a SWE-style info (``patch``,
``resolved``); ``fail_unless`` makes every step raise while that path does not exist; ``marker_dir`` gets one ``<index>.open`` file per reset and one ``<index>.closed`` per close, so a
test can check that interrupted episodes were closed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrl.core import Env


class SlowEnv(Env):
    def __init__(self, n: int = 120, delay: float = 0.05, marker_dir: str | None = None, fail_unless: str | None = None):
        super().__init__()
        self.n, self.delay, self.marker_dir = n, delay, marker_dir
        self.fail_unless = fail_unless  # a path: while it does not exist, every step raises
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
        return self.step(action)

    async def aclose(self):
        self._mark("closed")

    @staticmethod
    def solve(conversation):
        return "fix " + conversation[-1]["content"].split()[-1]
