"""Any gymnasium env whose observations or actions are not text, as an agentrl env: ``gymnasium/<id>`` for every id
of gymnasium's registry without a namespace (CartPole-v1, FrozenLake-v1, Taxi-v4, Blackjack-v1, Pendulum-v1, and the
ids other packages register the same way). The inner env runs unchanged; only its spaces are put into words.

Flow: the inner env is made once (``gymnasium.make(id, **env_kwargs)``, with ``render_mode="ansi"`` when the env
offers it). ``reset`` returns one user message: the env's id, how to answer (the action space, with names for the
classic envs or from ``action_names``), then the observation as text. Each ``step`` parses the model's text into
an action, steps the inner env, and returns the next observation as text with the inner reward, ``terminated``,
``truncated`` and the info's JSON-safe values.

Observations as text: the ansi rendering when the env has one (a highlighted cell, such as FrozenLake's agent, in
brackets), then the observation itself: a Discrete's integer, a Box's numbers to ``digits`` significant digits,
Tuple and Dict as JSON.

Actions from text: the answer is read as every built-in env reads it (:func:`agentrl.envs.utils.answer_or_text`).
Discrete: an integer of the space or one of its action names (case-insensitive); Box: as many numbers as the space
holds (a JSON list, or separated by spaces or commas), clipped to its bounds; MultiDiscrete and MultiBinary:
integers the space contains. An answer that does not parse never reaches the inner env: the step pays
``invalid_action_reward`` (default 0), says what was expected, sets ``info["invalid_action"]``, and the episode
goes on (the agent loop's ``max_turns`` bounds it).

``task_key(seed)``: the id and a hash of the first observation's text for ``seed``, read from an env of its own: a
deterministic start (FrozenLake's) is one task whatever the seed, so evaluation holds it out by content.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from agentrl.core import Env, Message, MessagesSpace, StepResult, TextSpace
from agentrl.envs.utils import answer_or_text, preview

# The meaning of each Discrete action of the classic envs, from gymnasium's documentation of each.
ACTION_NAMES = {
    "FrozenLake": ["left", "down", "right", "up"],
    "FrozenLake8x8": ["left", "down", "right", "up"],
    "CliffWalking": ["up", "right", "down", "left"],
    "CliffWalkingSlippery": ["up", "right", "down", "left"],
    "Taxi": ["south", "north", "east", "west", "pickup", "dropoff"],
    "Blackjack": ["stick", "hit"],
    "CartPole": ["left", "right"],
    "MountainCar": ["left", "none", "right"],
    "LunarLander": ["none", "left", "main", "right"],
}
_HIGHLIGHT = re.compile(r"\x1b\[[0-9;]*m(.*?)\x1b\[0m", re.S)
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan", re.I)


def env_names() -> list[str]:
    """gymnasium's ids without a namespace (the family's names)."""
    return sorted(k for k in gymnasium.registry if "/" not in k)


def _jsonable(x: Any, digits: int) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v, digits) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return [_jsonable(v, digits) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist(), digits)
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(f"{float(x):.{digits}g}")
    return str(x)


class GymnasiumTextEnv(Env):
    """A gymnasium env with text in and out (see the module docstring). kwargs: ``env`` (set by the id),
    ``env_kwargs`` (the inner env's), ``action_names`` (a Discrete action space's, in order), ``digits`` (4),
    ``invalid_action_reward`` (0.0)."""

    description = "gymnasium env with its observations and actions put into text"
    observation_space = MessagesSpace()
    action_space = TextSpace()

    def __init__(self, env: str, env_kwargs: dict[str, Any] | None = None, action_names: list[str] | None = None,
                 digits: int = 4, invalid_action_reward: float = 0.0):
        super().__init__()
        self.env_id, self.env_kwargs = env, dict(env_kwargs or {})
        self.digits, self.invalid_action_reward = int(digits), float(invalid_action_reward)
        self.inner = self._make()
        space = self.inner.action_space
        if not isinstance(space, (spaces.Discrete, spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Text)):
            self.inner.close()
            raise ValueError(f"gymnasium/{env}: action space {space} cannot be read from text (Discrete, Box, "
                             "MultiDiscrete, MultiBinary and Text can)")
        base = gymnasium.spec(env).name
        names = action_names if action_names is not None else ACTION_NAMES.get(base)
        if isinstance(space, spaces.Discrete) and names is not None and len(names) != space.n:
            raise ValueError(f"gymnasium/{env}: action_names has {len(names)} names for {space.n} actions")
        self.names = [str(n).lower() for n in names] if isinstance(space, spaces.Discrete) and names else None
        self._key_env: Any = None

    def _make(self) -> Any:
        kwargs = dict(self.env_kwargs)
        probe = gymnasium.make(self.env_id, **kwargs)
        if "render_mode" in kwargs or "ansi" not in probe.unwrapped.metadata.get("render_modes", []):
            return probe
        probe.close()
        return gymnasium.make(self.env_id, render_mode="ansi", **kwargs)

    # ---- text ----------------------------------------------------------------------------------------------
    def how_to_act(self) -> str:
        space = self.inner.action_space
        if isinstance(space, spaces.Discrete):
            first = int(space.start)
            choices = [f"{first + i} ({n})" if self.names else str(first + i)
                       for i, n in enumerate(self.names or [None] * int(space.n))]
            return f"Answer with one action inside <answer></answer>: {', '.join(choices)}."
        if isinstance(space, spaces.Box):
            return (f"Answer with {int(np.prod(space.shape))} numbers inside <answer></answer> (a JSON list), "
                    f"from {_jsonable(space.low, self.digits)} to {_jsonable(space.high, self.digits)}.")
        if isinstance(space, spaces.Text):
            return "Answer inside <answer></answer>."
        return f"Answer with the integers of an action of {space} inside <answer></answer> (a JSON list)."

    def observation_text(self, obs: Any, env: Any = None) -> str:
        """``obs`` of ``env`` (the inner env by default) as the model reads it."""
        env = self.inner if env is None else env
        parts = []
        if env.render_mode == "ansi":
            frame = env.render()
            if isinstance(frame, str) and frame.strip():
                parts.append(_ESCAPE.sub("", _HIGHLIGHT.sub(r"[\1]", frame)).strip("\n"))
        parts.append(f"Observation: {json.dumps(_jsonable(obs, self.digits))}")
        return "\n".join(parts)

    def parse_action(self, text: str) -> Any:
        """The inner env's action for the model's ``text``; raises ValueError saying what was expected."""
        answer = answer_or_text(str(text))
        space = self.inner.action_space
        if isinstance(space, spaces.Text):
            if not space.contains(answer):
                raise ValueError(f"{preview(answer)!r} is not a text of {space}")
            return answer
        if isinstance(space, spaces.Discrete):
            if self.names and answer.lower() in self.names:
                return int(space.start) + self.names.index(answer.lower())
            if re.fullmatch(r"[-+]?\d+", answer) and space.contains(int(answer)):
                return int(answer)
            raise ValueError(f"{preview(answer)!r} is not one of the actions")
        numbers = [float(x) for x in _NUMBER.findall(answer)]
        size = int(np.prod(space.shape))
        if len(numbers) != size or not all(np.isfinite(numbers)):
            raise ValueError(f"{preview(answer)!r} has {len(numbers)} numbers, an action {size} finite ones")
        if isinstance(space, spaces.Box):
            return np.clip(np.asarray(numbers, dtype=space.dtype).reshape(space.shape), space.low, space.high)
        action = np.asarray(numbers).reshape(space.shape)
        if not np.all(action == np.round(action)) or not space.contains(action.astype(space.dtype)):
            raise ValueError(f"{preview(answer)!r} is not an action of {space}")
        return action.astype(space.dtype)

    # ---- Env -----------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        obs, info = self.inner.reset(seed=seed, options=options)
        text = self.observation_text(obs)
        intro = f"You act in the gymnasium environment {self.env_id}. {self.how_to_act()}\n\n{text}"
        return [{"role": "user", "content": intro}], {**self._info(info), "task_key": self._key(text)}

    def step(self, action: str) -> StepResult:
        try:
            inner_action = self.parse_action(action)
        except ValueError as e:
            note = f"Invalid action: {e}. {self.how_to_act()}"
            return [{"role": "user", "content": note}], self.invalid_action_reward, False, False, {"invalid_action": True}
        obs, reward, terminated, truncated, info = self.inner.step(inner_action)
        content = self.observation_text(obs)
        return [{"role": "user", "content": content}], float(reward), bool(terminated), bool(truncated), self._info(info)

    def task_key(self, seed: int) -> str:
        if self._key_env is None:
            self._key_env = self._make()
        return self._key(self.observation_text(self._key_env.reset(seed=seed)[0], self._key_env))

    def _key(self, text: str) -> str:
        return f"gymnasium/{self.env_id}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        return {str(k): v for k, v in _jsonable(info, self.digits).items() if isinstance(v, (str, int, float, bool))}

    def close(self) -> None:
        for env in (self.inner, self._key_env):
            if env is not None:
                env.close()
