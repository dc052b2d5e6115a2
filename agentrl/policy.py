"""The policy side of an episode, as the environment manager sees it.

The manager knows nothing about tokens or engines. For each episode it opens a :class:`PolicySession` and, every
turn, hands it the messages the env just added and awaits an :class:`Action`. The vLLM agent loop
(``agentrl.agent.loop``) is one implementation: it keeps the trajectory's token ids across turns (token-in/token-out)
and reports them through :meth:`PolicySession.token_record`. Scripted policies and latency models for benchmarks
are others.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from agentrl.core import Message
from agentrl.trajectory import TokenTape


@dataclass
class Action:
    """One agent turn.

    ``text`` is what the env's ``step`` receives. ``token_ids``/``logprobs``/``versions`` describe the generated
    tokens of this turn (aligned, possibly empty for text-only policies). ``finish_reason`` is the engine's
    (``"stop"``, ``"length"``, ``"abort"``...). ``context_exhausted`` says the conversation hit the policy's max
    context, and the manager then ends the episode as truncated. ``tool_calls``: the calls the policy read from its
    own output, OpenAI-style (``id``, ``type``, ``function.name``, ``function.arguments`` as a JSON string).
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    context_exhausted: bool = False
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TokenRecord(TokenTape):
    """The token-level part of a trajectory (see :mod:`agentrl.trajectory` for the invariants). ``segments``: the
    lengths of the training samples ``token_ids`` is split into (empty: one). ``info``: per-episode counters the
    trajectory's ``info`` gets."""

    prompt_len: int = 0
    segments: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeMeta:
    """What a policy may know about the episode it acts in."""

    trajectory_id: str
    group_id: str
    env_id: str
    seed: int | None
    task: Any = None


class PolicySession(abc.ABC):
    """One episode's policy state. Created by :meth:`Policy.session`, used by one episode task only."""

    @abc.abstractmethod
    async def act(self, new_messages: list[Message]) -> Action:
        """Returns the next action, given the messages the env added since the last call (on the first call, the
        opening messages from ``reset``)."""

    def token_record(self) -> TokenRecord | None:
        """Returns the episode's tokens so far, or None for policies that do not produce tokens."""
        return None

    async def aclose(self) -> None:
        """Releases what the session holds (e.g. aborts an in-flight request). Called once, also on cancel."""


class Policy(abc.ABC):
    """A factory of per-episode sessions."""

    @abc.abstractmethod
    def session(self, meta: EpisodeMeta) -> PolicySession:
        """Returns a new session for the episode described by ``meta``."""

    @property
    def version(self) -> int:
        """The policy version new tokens are generated with (0 for fixed policies)."""
        return 0


class ScriptedPolicy(Policy):
    """A deterministic policy from a function ``fn(conversation, meta) -> str`` (for tests, demos, oracles).

    ``conversation`` is the full list of messages so far, the session's own actions included as assistant turns.
    """

    def __init__(self, fn):
        self.fn = fn

    def session(self, meta: EpisodeMeta) -> PolicySession:
        return _ScriptedSession(self.fn, meta)


class _ScriptedSession(PolicySession):
    def __init__(self, fn, meta: EpisodeMeta):
        self.fn, self.meta, self.conversation = fn, meta, []

    async def act(self, new_messages: list[Message]) -> Action:
        self.conversation.extend(new_messages)
        text = self.fn(list(self.conversation), self.meta)
        self.conversation.append({"role": "assistant", "content": text})
        return Action(text=text)
