"""Test and benchmark envs and policies for the environment manager (importable inside Ray env workers).

Envs (use them by entry point, e.g. ``EpisodeSpec("agentrl.testing.manager_envs:SleepEnv", {...})``):

- :class:`SleepEnv`: an async env whose steps take a configurable ``asyncio.sleep`` latency (fixed, per-turn list,
  or normal with a clipped minimum), with injectable faults (raise, hang, garbage results, fail-slow).
- :class:`SyncSleepEnv`: the same latency with ``time.sleep`` in sync ``reset``/``step`` (runs in the thread pool).

Both append ``(tag, event)`` to the process-local :data:`EVENTS` list on close and on a cancelled step, so that
tests in one process can check that cancellation really closed the env.

Policies: :class:`EchoPolicy` (optional async latency, fake tokens with the policy's current version, records
session closes).
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import threading
import time
from typing import Any

from agentrl.core import Env
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord

EVENTS: list[tuple[Any, str]] = []
"""Process-local log of ``(tag, event)``: ``close``, ``step_cancelled``, ``step_thread:<thread name>``."""

_CREATED: dict[Any, int] = {}
_FAILED_ONCE: set[tuple[Any, int]] = set()  # (tag, seed) of the transient failures already raised

FAULTS = ("raise", "hang", "garbage", "bad_reward", "nan_reward", "bad_obs", "bad_info", "exit")


class SleepEnv(Env):
    """A multi-turn env whose every step sleeps (asyncio) and then returns one user message and a reward.

    kwargs: ``turns`` (terminates after this many steps), ``step_latency`` (seconds, or a list: one per turn),
    ``latency_sigma`` (adds N(0, σ) noise, clipped at ``min_latency``), ``reset_latency``, ``reward_per_step``,
    ``fault`` (one of :data:`FAULTS`) at step ``fault_at`` (``-1``: at reset) with probability ``fault_prob``,
    ``slow_prob``/``slow_factor`` (fail-slow: this instance is ``slow_factor`` × slower), ``hang_prob`` (this
    instance hangs at its first step), ``hang_after`` (instances created with this ``tag`` in this process beyond
    the first ``hang_after`` hang at their first step: deterministic losers for tests), ``final_reward`` (reported
    as ``info["episode_reward"]`` at the end), ``tag`` (for :data:`EVENTS`), ``close_latency`` (seconds ``aclose``
    takes). Episode length: ``turns``; or ``turns_per_instance[k]`` for the k-th instance created with this ``tag``
    in this process (the last value repeats); or a long tail, ``turns_tail`` = a Pareto shape, ``turns =
    min(turns_max, floor(Pareto(shape)))`` (at shape 1 about half the episodes are one turn long). The length is
    logged as ``(tag, "turns:<n>")`` at reset. Fault and length draws use a per-instance RNG that is not the reset
    seed, so members of a group (same seed) differ. ``fail_once_seeds``: the first reset of each of these seeds
    with this ``tag`` in this process raises (a transient failure: a later attempt at the same task succeeds).
    """

    description = "manager test env with async sleep latency and injectable faults"

    def __init__(self, turns: int = 3, step_latency: float | list[float] = 0.0, latency_sigma: float = 0.0,
                 min_latency: float = 0.001, reset_latency: float = 0.0, reward_per_step: float = 1.0,
                 fault: str | None = None, fault_at: int = 0, fault_prob: float = 1.0, slow_prob: float = 0.0,
                 slow_factor: float = 10.0, hang_prob: float = 0.0, final_reward: float | None = None,
                 tag: Any = None, hang_after: int | None = None, close_latency: float = 0.0,
                 turns_per_instance: list[int] | None = None, turns_tail: float | None = None, turns_max: int = 64,
                 fail_once_seeds: list[int] | None = None):
        super().__init__()
        self.fail_once_seeds = set(fail_once_seeds or ())
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        self.turns, self.step_latency, self.latency_sigma = turns, step_latency, latency_sigma
        self.min_latency, self.reset_latency, self.reward_per_step = min_latency, reset_latency, reward_per_step
        self.final_reward, self.tag = final_reward, tag
        rng = random.Random()
        self._faulty = fault is not None and rng.random() < fault_prob
        self.fault, self.fault_at = fault, fault_at
        self._factor = slow_factor if rng.random() < slow_prob else 1.0
        self._hang = rng.random() < hang_prob
        _CREATED[tag] = _CREATED.get(tag, 0) + 1
        if hang_after is not None and _CREATED[tag] > hang_after:
            self._hang = True
        self._noise = rng
        self.close_latency = close_latency
        k = _CREATED[tag] - 1
        if turns_per_instance:
            self.turns = turns_per_instance[min(k, len(turns_per_instance) - 1)]
        elif turns_tail is not None:
            self.turns = min(turns_max, math.floor(rng.paretovariate(turns_tail)))
        self.t = 0
        self.seed_seen: int | None = None
        self.options_seen: dict | None = None

    def _latency(self) -> float:
        base = self.step_latency[min(self.t, len(self.step_latency) - 1)] if isinstance(self.step_latency, list) else self.step_latency
        if self.latency_sigma > 0:
            base = base + self._noise.gauss(0.0, self.latency_sigma)
        return max(self.min_latency, base) * self._factor if base > 0 or self.latency_sigma > 0 else 0.0

    def _fault_now(self, at: int) -> Any:
        if not self._faulty or self.fault_at != at:
            return None
        return self.fault

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t, self.seed_seen, self.options_seen = 0, seed, options
        EVENTS.append((self.tag, f"turns:{self.turns}"))
        if seed in self.fail_once_seeds and (self.tag, seed) not in _FAILED_ONCE:
            _FAILED_ONCE.add((self.tag, seed))
            raise RuntimeError(f"injected transient reset failure (tag={self.tag}, seed={seed})")
        if self.reset_latency > 0:
            await asyncio.sleep(self.reset_latency)
        fault = self._fault_now(-1)
        if fault == "raise":
            raise RuntimeError(f"injected reset failure (tag={self.tag})")
        if fault == "exit":  # a game that quits the way a script does
            sys.exit(3)
        if fault == "hang":
            await asyncio.Event().wait()
        if fault == "garbage":
            return "just an observation, no info"
        task = (options or {}).get("task")
        return [{"role": "system", "content": "You are tested."},
                {"role": "user", "content": f"task={task} seed={seed}"}], {"tag": self.tag}

    async def astep(self, action: str):
        try:
            lat = self._latency()
            if self._hang or self._fault_now(self.t) == "hang":
                await asyncio.Event().wait()
            if lat > 0:
                await asyncio.sleep(lat)
            elif lat == 0:
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            EVENTS.append((self.tag, "step_cancelled"))
            raise
        return self._result(action)

    def _result(self, action: str):
        fault = self._fault_now(self.t)
        self.t += 1
        done = self.t >= self.turns
        info: Any = {"t": self.t, "tag": self.tag}
        if done and self.final_reward is not None:
            info["episode_reward"] = self.final_reward
        obs: Any = [{"role": "user", "content": f"turn {self.t}: got {action[:40]}"}]
        reward: Any = self.reward_per_step
        if fault == "raise":
            raise ValueError(f"injected step failure at turn {self.t} (tag={self.tag})")
        if fault == "exit":
            sys.exit(3)
        if fault == "garbage":
            return obs, reward, done  # 3-tuple
        if fault == "bad_reward":
            reward = "1.0"
        if fault == "nan_reward":
            reward = float("nan")
        if fault == "bad_obs":
            obs = [{"role": "wizard", "content": 3}]
        if fault == "bad_info":
            info = ["not", "a", "dict"]
        return obs, reward, done, False, info

    async def aclose(self) -> None:
        if self.close_latency > 0:
            await asyncio.sleep(self.close_latency)
        EVENTS.append((self.tag, "close"))


class SyncSleepEnv(Env):
    """A sync-only env: ``step`` blocks with ``time.sleep(step_latency)``; records the thread it ran on and the
    largest number of steps that ran at the same time in this process (:attr:`max_parallel`)."""

    _lock = threading.Lock()
    _active = 0
    max_parallel = 0

    def __init__(self, turns: int = 2, step_latency: float = 0.05, tag: Any = None, exit_on_step: bool = False):
        super().__init__()
        self.turns, self.step_latency, self.tag, self.t = turns, step_latency, tag, 0
        self.exit_on_step = exit_on_step  # step calls sys.exit(3), in the env thread pool

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        return f"sync task seed={seed}", {}

    def step(self, action: str):
        if self.exit_on_step:
            sys.exit(3)
        EVENTS.append((self.tag, f"step_thread:{threading.current_thread().name}"))
        cls = SyncSleepEnv
        with cls._lock:
            cls._active += 1
            cls.max_parallel = max(cls.max_parallel, cls._active)
        try:
            time.sleep(self.step_latency)
        finally:
            with cls._lock:
                cls._active -= 1
        self.t += 1
        return f"sync turn {self.t}", 0.5, self.t >= self.turns, False, {"t": self.t}

    def close(self) -> None:
        EVENTS.append((self.tag, "close"))


class EchoPolicy(Policy):
    """Answers ``text`` after ``latency`` seconds (asyncio.sleep). Each action carries ``tokens_per_turn`` fake
    tokens stamped with the policy's current :attr:`current_version`; ``token_record()`` gives one prompt token per
    env message (mask 0, version -1) and the generated tokens (mask 1). Records opened and closed session ids."""

    def __init__(self, latency: float = 0.0, text: str = "ok", tokens_per_turn: int = 2, raise_on: str | None = None):
        self.latency, self.text, self.tokens_per_turn, self.raise_on = latency, text, tokens_per_turn, raise_on
        self.current_version = 0
        self.opened: list[str] = []
        self.closed: list[str] = []

    @property
    def version(self) -> int:
        return self.current_version

    def session(self, meta: EpisodeMeta) -> PolicySession:
        self.opened.append(meta.trajectory_id)
        return _EchoSession(self, meta)


class _EchoSession(PolicySession):
    def __init__(self, policy: EchoPolicy, meta: EpisodeMeta):
        self.p, self.meta = policy, meta
        self.rec = TokenRecord([], [], [], [], 0)
        self.first = True

    async def act(self, new_messages: list[dict]) -> Action:
        for _ in new_messages:
            self.rec.token_ids.append(7)
            self.rec.loss_mask.append(0)
            self.rec.logprobs.append(0.0)
            self.rec.versions.append(-1)
        if self.first:
            self.rec.prompt_len, self.first = len(new_messages), False
        if self.p.latency > 0:
            await asyncio.sleep(self.p.latency)
        if self.p.raise_on is not None and any(self.p.raise_on in m.get("content", "") for m in new_messages):
            raise RuntimeError(f"policy failure on {self.p.raise_on!r}")
        v = self.p.current_version
        n = self.p.tokens_per_turn
        ids, lps, vs = [11] * n, [-0.5] * n, [v] * n
        self.rec.token_ids += ids
        self.rec.loss_mask += [1] * n
        self.rec.logprobs += lps
        self.rec.versions += vs
        return Action(text=self.p.text, token_ids=ids, logprobs=lps, versions=vs, finish_reason="stop")

    def token_record(self) -> TokenRecord:
        return self.rec

    async def aclose(self) -> None:
        self.p.closed.append(self.meta.trajectory_id)
