"""The text-environment contract.

An agentrl env is a :class:`gymnasium.Env` whose actions are the model's text and whose observations are chat
messages: ``reset`` returns the conversation's opening messages and ``step`` returns the messages to append.
Envs are async-first: the manager drives ``areset``/``astep``/``aclose``. A sync-only env inherits async methods
that run its sync methods in a bounded thread pool, never on the event loop; an env that does real I/O (sandboxes,
HTTP tools) overrides the async methods natively.

Rewards. ``step``'s ``reward`` is the *per-step* reward of that action; the manager records one per step in
``Trajectory.rewards``. The episode's reward (``Trajectory.reward``, what trajectory-level advantages use) is their
sum, unless the last step's ``info["episode_reward"]`` gives it (a final score that is not a sum). An env whose
reward is earned over several turns reports the intermediate rewards per step, which the turn-level advantage
estimators use (``trainer.advantage.estimator: turn_return | gigpo``, :mod:`agentrl.trainer.turn_credit`).

State keys (for ``gigpo``). An env that can tell when two episodes of a group reach the same state reports
``info["state_key"]`` in ``reset`` and in every ``step``: the key of the state the env is in after that call. The
manager collects them into ``Trajectory.info["state_keys"]`` (entry ``k``: the state turn ``k``'s action was taken
in), where the trainer reads them. Keys are strings, numbers or JSON values compared by value; ``None`` (or no key)
means "no key". An env may also report the whole list itself as ``info["state_keys"]`` in its last step.
"""

from __future__ import annotations

import os
import string
from typing import Any, Callable, SupportsFloat, TypeVar, Union

import gymnasium
import numpy as np
from gymnasium import spaces

from agentrl.syncpool import SyncPool

Message = dict[str, Any]
"""A chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": str}`` (tool messages may carry
``name``)."""

Observation = Union[str, list[Message]]
"""What ``reset``/``step`` return as ``obs``: the messages the env adds to the conversation (a bare string means
one user message)."""

StepResult = tuple[Observation, SupportsFloat, bool, bool, dict[str, Any]]

T = TypeVar("T")


class TextSpace(spaces.Space[str]):
    """Any Python ``str``, of any length and alphabet (gymnasium's ``Text`` space limits both).

    ``sample()`` returns a short random printable string drawn from the space's own RNG.
    """

    def __init__(self, max_sample_length: int = 32, seed: int | np.random.Generator | None = None):
        self.max_sample_length = max_sample_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, self.max_sample_length + 1))
        alphabet = string.ascii_letters + string.digits + " .,:;!?-_()<>{}[]\"'\n"
        idx = self.np_random.integers(0, len(alphabet), size=n)
        return "".join(alphabet[i] for i in idx)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)

    def __repr__(self) -> str:
        return "TextSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextSpace)


class MessagesSpace(spaces.Space[list]):
    """A list of chat messages (dicts with a ``role`` and a ``content`` string), or a bare string.

    ``sample()`` returns one user message with random text.
    """

    ROLES = ("system", "user", "assistant", "tool")

    def __init__(self, seed: int | np.random.Generator | None = None):
        self._text = TextSpace()
        super().__init__(shape=None, dtype=None, seed=seed)

    def seed(self, seed: int | None = None) -> int | list[int]:
        out = super().seed(seed)
        self._text.seed(int(self.np_random.integers(2**31)))
        return out

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        return [{"role": "user", "content": self._text.sample()}]

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        if not isinstance(x, (list, tuple)):
            return False
        return all(
            isinstance(m, dict) and m.get("role") in self.ROLES and isinstance(m.get("content"), str) for m in x
        )

    def __repr__(self) -> str:
        return "MessagesSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MessagesSpace)


def as_messages(obs: Observation) -> list[Message]:
    """Returns ``obs`` as a list of messages (a bare string becomes one user message)."""
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    return list(obs)


_pool: SyncPool | None = None


def set_sync_env_threads(n: int) -> None:
    """Bounds the thread pool that runs sync-only envs (default ``AGENTRL_ENV_THREADS`` or 32); up to ``4 n``
    calls that never return are tolerated besides (see :mod:`agentrl.syncpool`)."""
    global _pool
    old, _pool = _pool, SyncPool(n, name="agentrl-env")
    if old is not None:
        old.close()


def sync_pool_stats() -> dict[str, int]:
    """The sync env pool's counters: size, serving, idle, queued, hung (calls abandoned by their caller that are
    still running)."""
    if _pool is None:
        set_sync_env_threads(int(os.environ.get("AGENTRL_ENV_THREADS", "32")))
    return _pool.stats()  # type: ignore[union-attr]


async def run_sync(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs a blocking ``fn(*args, **kwargs)`` in the bounded env thread pool and returns its result. Cancelling
    the caller (a timeout) abandons a call that never returns without losing a pool thread or blocking exit."""
    if _pool is None:
        set_sync_env_threads(int(os.environ.get("AGENTRL_ENV_THREADS", "32")))
    return await _pool.run(lambda: fn(*args, **kwargs))  # type: ignore[union-attr]


class Env(gymnasium.Env[Observation, str]):
    """Base class of text environments.

    Subclasses implement ``reset`` and ``step`` (sync), or ``areset`` and ``astep`` (async), or both.
    Contract:

    - ``reset(*, seed=None, options=None) -> (obs, info)``: ``obs`` holds the opening messages (system prompt
      and task). The same seed gives the same episode; all randomness comes from ``self.np_random``.
    - ``step(action: str) -> (obs, reward, terminated, truncated, info)``: ``obs`` holds the messages to append
      after the agent's turn. An invalid action is part of the game: it gets an observation that says what was
      wrong and the reward documented by the env, never an exception.
    - ``aclose()`` releases everything the env holds (sandboxes, sockets); it is safe to call twice.
    - ``task_key(seed) -> str | None``: the content identity of the task ``reset(seed=seed)`` draws (a board, a
      secret, a question and its hidden table, a dataset item's id), so that two seeds drawing the same task give
      the same key. The training controller holds evaluation tasks out by this key: no training or warm-start
      episode plays a task an evaluation episode plays (:mod:`agentrl.controller.heldout`). It may reset this
      instance (it is called on a scratch instance) but must not start anything costly (no sandbox). The default,
      None, says that distinct seeds draw distinct tasks; an env whose seeds can collide (few distinct tasks, or a
      seed taken modulo a dataset's size) must override it.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    observation_space: spaces.Space = MessagesSpace()
    action_space: spaces.Space = TextSpace()
    #: A one-line description shown by ``agentrl envs list``.
    description: str = ""

    def __init__(self) -> None:
        # Fresh instances per env: gymnasium seeds spaces in place.
        self.observation_space = MessagesSpace()
        self.action_space = TextSpace()

    def task_key(self, seed: int) -> str | None:
        """The content identity of the task ``reset(seed=seed)`` draws (see the class docstring); None: seeds
        identify tasks."""
        return None

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Async ``reset``; by default runs ``reset`` in the env thread pool."""
        return await run_sync(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> StepResult:
        """Async ``step``; by default runs ``step`` in the env thread pool."""
        return await run_sync(self.step, action)

    async def aclose(self) -> None:
        """Async ``close``; by default runs ``close`` in the env thread pool."""
        await run_sync(self.close)


class Wrapper(gymnasium.Wrapper[Observation, str, Observation, str]):
    """A gymnasium wrapper that forwards the async methods too."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, action: str) -> StepResult:
        return await self.env.astep(action)

    async def aclose(self) -> None:
        await self.env.aclose()

    @property
    def description(self) -> str:
        return getattr(self.env, "description", "")


class OrderEnforcing(Wrapper, gymnasium.utils.RecordConstructorArgs):
    """Refuses a step before the first reset (``gymnasium.error.ResetNeeded``), as gymnasium's ``make`` does: an env
    stepped from its constructor's state answers from no task at all (GuessNumber paid 1.0 for such a guess)."""

    def __init__(self, env: gymnasium.Env):
        # Recorded so that ``env.spec.make()`` can rebuild the wrapped env (gymnasium's check_env does).
        gymnasium.utils.RecordConstructorArgs.__init__(self)
        super().__init__(env)
        self._has_reset = False

    def _started(self) -> None:
        self._has_reset = True

    def _require_reset(self) -> None:
        if not self._has_reset:
            raise gymnasium.error.ResetNeeded("Cannot call env.step() before calling env.reset()")

    def _checked(self, result: StepResult) -> StepResult:
        return result

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self._started()
        return out

    def step(self, action: str) -> StepResult:
        self._require_reset()
        return self._checked(self.env.step(action))

    async def areset(self, **kwargs):
        out = await self.env.areset(**kwargs)
        self._started()
        return out

    async def astep(self, action: str) -> StepResult:
        self._require_reset()
        return self._checked(await self.env.astep(action))


class TimeLimit(OrderEnforcing):
    """Truncates an episode after ``max_episode_steps`` steps (sync and async paths alike), and refuses a step before
    the first reset as :class:`OrderEnforcing` (one wrapper, not two: ``make`` wraps every env in one of them).

    ``info["TimeLimit.truncated"]`` is set when this wrapper truncated the episode.
    """

    def __init__(self, env: gymnasium.Env, max_episode_steps: int):
        gymnasium.utils.RecordConstructorArgs.__init__(self, max_episode_steps=max_episode_steps)
        super().__init__(env)
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.max_episode_steps = max_episode_steps
        self._elapsed = 0

    def _started(self) -> None:
        self._has_reset = True
        self._elapsed = 0

    def _checked(self, result: StepResult) -> StepResult:
        obs, reward, terminated, truncated, info = result
        self._elapsed += 1
        if self._elapsed >= self.max_episode_steps and not terminated and not truncated:
            truncated = True
            info = dict(info, **{"TimeLimit.truncated": True})
        return obs, reward, terminated, truncated, info
