"""Helpers shared by the built-in envs: lenient answer parsing, and playing one episode with a text policy.

Parsing convention of every built-in env: if the action holds one or more ``<answer>...</answer>`` blocks, the last
one is the answer; otherwise the whole action is. The answer is then stripped of whitespace, surrounding quotes,
backticks and trailing punctuation, and lowercased where the env compares words.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium

from agentrl.core import Message, as_messages

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_EDGE_CHARS = " \t\r\n\"'`*.!,;:"


def extract_answer(text: str) -> str | None:
    """Returns the content of the last ``<answer>...</answer>`` block of ``text`` (stripped), or None if there is
    none."""
    found = ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def answer_or_text(text: str) -> str:
    """Returns the last ``<answer>`` block's content if there is one, else ``text``; stripped of whitespace,
    quotes, backticks and trailing punctuation."""
    answer = extract_answer(text)
    return (answer if answer is not None else text).strip(_EDGE_CHARS)


def preview(text: str, limit: int = 40) -> str:
    """Returns ``text`` shortened to ``limit`` characters on one line, for quoting a bad action back to the
    model."""
    one_line = " ".join(str(text).split())
    return one_line if len(one_line) <= limit else one_line[: limit - 3] + "..."


def cap_text(text: str, limit: int) -> str:
    """Returns ``text`` with at most ``limit`` characters (and a marker line): its head and tail around the marker."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit:,} characters truncated ...]\n{text[-tail:]}"


def last_content(conversation: list[Message], roles: tuple[str, ...] = ("user",)) -> str:
    """Returns the content of the last message whose role is in ``roles`` (``""`` if there is none)."""
    for m in reversed(conversation):
        if m.get("role") in roles:
            return str(m.get("content", ""))
    return ""


@dataclass
class EpisodeResult:
    """One played episode: the whole ``conversation`` (env messages and the policy's assistant turns), the
    per-step ``rewards``, how it ended, and the last ``info``. ``steps == len(rewards)``."""

    conversation: list[Message] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.rewards)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))


def play_episode(
    env: gymnasium.Env,
    policy: Callable[[list[Message]], str],
    *,
    seed: int | None = None,
    max_steps: int = 100,
    options: dict[str, Any] | None = None,
) -> EpisodeResult:
    """Plays one episode of ``env`` with ``policy(conversation) -> action`` (synchronously) and returns it.

    Stops at termination, truncation, or after ``max_steps`` steps (then neither flag is set). Raises
    ``ValueError`` if the env returns a non-finite reward, since that would poison any return computed from it.
    """
    obs, info = env.reset(seed=seed, options=options)
    result = EpisodeResult(conversation=as_messages(obs), info=info)
    for _ in range(max_steps):
        action = policy(list(result.conversation))
        result.conversation.append({"role": "assistant", "content": action})
        obs, reward, terminated, truncated, info = env.step(action)
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"env returned a non-finite reward {reward!r}")
        result.conversation.extend(as_messages(obs))
        result.rewards.append(reward)
        result.info = info
        if terminated or truncated:
            result.terminated, result.truncated = bool(terminated), bool(truncated)
            break
    return result
