"""Two OpenEnv servers written with openenv-core whose actions are not one text field (test fixture):
``counter`` (``{"amount": int}``: reach exactly 5) and ``tools`` (``{"tool": str, "arguments": dict}``: ``add``
two numbers, then ``answer`` 42). Run as ``python openenv_typed_server.py counter|tools PORT``."""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class CountAction(Action):
    amount: int = Field(..., description="how much to add")


class CountObservation(Observation):
    text: str = ""


class Counter(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.total, self._state = 0, State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> CountObservation:
        self.total, self._state = 0, State(episode_id=episode_id, step_count=0)
        return CountObservation(text="Add integers until the total is exactly 5.", done=False, reward=0.0)

    def step(self, action: CountAction, timeout_s: float | None = None, **_: Any) -> CountObservation:
        self.total += action.amount
        done = self.total >= 5
        return CountObservation(text=f"total {self.total}", done=done, reward=float(self.total == 5) if done else 0.0)

    @property
    def state(self) -> State:
        return self._state


class ToolAction(Action):
    tool: str = Field(..., description="add or answer")
    arguments: dict[str, Any] = Field(..., description="the tool's arguments")


class ToolObservation(Observation):
    result: str = ""


class Tools(Counter):
    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> ToolObservation:
        return ToolObservation(result="What is 40 + 2? Use add, then answer with value.", done=False, reward=0.0)

    def step(self, action: ToolAction, timeout_s: float | None = None, **_: Any) -> ToolObservation:
        if action.tool == "add":
            return ToolObservation(result=str(action.arguments.get("a", 0) + action.arguments.get("b", 0)), done=False,
                                   reward=0.0)
        return ToolObservation(result="done", done=True, reward=float(action.arguments.get("value") == 42))


if __name__ == "__main__":
    env, action, obs = {"counter": (Counter, CountAction, CountObservation),
                        "tools": (Tools, ToolAction, ToolObservation)}[sys.argv[1]]
    uvicorn.run(create_fastapi_app(env, action, obs), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
