"""Cost models that stand in for the engine, the trainer and the envs in a simulated run (virtual clock).

Each part costs what its parameters say and nothing else; the manager, admission, schedulers and the controller
that drive them are the real ones.

- :class:`EngineModel` / :class:`SimEngine`: continuous batching. A request first waits its prefill
  (``prefill_s_per_token`` x prompt tokens), then decodes in steps whose duration grows with the batch:
  ``decode_step_s + decode_step_s_per_seq x running``. A weight update pauses the engine for ``sync_s``.
- :class:`TrainerModel` / :class:`SimTrainer`: a step costs ``tokens x flops_per_token / (peak_flops x mfu x
  gpus)`` seconds (6 x parameters is the usual ``flops_per_token`` for a forward and backward).
- :class:`SimEnv`: ``turns`` steps (or a lognormal count), each taking a latency drawn from ``fixed``, ``normal``
  or ``lognormal`` (mean, sigma), clipped at 0, and failing with probability ``fail_prob``.
- :class:`SimPolicy`: each turn asks the engine for a response whose length is lognormal (``response_mean``,
  ``response_sigma``, at most ``max_response``), on a context that grows by the env's messages
  (``obs_tokens``) and the responses so far.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from dataclasses import dataclass
from typing import Any

from agentrl.core import Env
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord


@dataclass
class EngineModel:
    """Continuous-batching cost parameters, in seconds (see the module docstring)."""

    prefill_s_per_token: float = 0.0
    decode_step_s: float = 0.02
    decode_step_s_per_seq: float = 0.0
    sync_s: float = 0.0
    chunk: int = 16  # decode steps simulated at once (the batch is re-read between chunks)


@dataclass
class TrainerModel:
    """``flops_per_token`` (6 x parameters for forward + backward), ``peak_flops`` per GPU, ``mfu``, ``gpus``."""

    flops_per_token: float = 6 * 0.5e9
    peak_flops: float = 989e12
    mfu: float = 0.3
    gpus: int = 1

    def step_s(self, tokens: int) -> float:
        return tokens * self.flops_per_token / (self.peak_flops * self.mfu * self.gpus)


class SimEngine:
    """See :class:`EngineModel`. ``version`` moves with :meth:`update_weights`, as a real engine's does."""

    def __init__(self, model: EngineModel) -> None:
        self.model, self.running, self._version = model, 0, 0
        self.busy_s = 0.0  # time with at least one request decoding
        self._busy_since: float | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()

    @property
    def version(self) -> int:
        return self._version

    async def generate_tokens(self, prompt_tokens: int, new_tokens: int) -> list[int]:
        """Waits what ``new_tokens`` cost after a ``prompt_tokens`` prefill; returns each token's version."""
        m = self.model
        await self._resumed.wait()
        self._track(+1)
        try:
            await asyncio.sleep(prompt_tokens * m.prefill_s_per_token)
            versions: list[int] = []
            while len(versions) < new_tokens:
                await self._resumed.wait()
                k = min(max(1, m.chunk), new_tokens - len(versions))
                await asyncio.sleep(k * (m.decode_step_s + m.decode_step_s_per_seq * self.running))
                versions += [self._version] * k  # a chunk is sampled by the weights it started with
            return versions
        finally:
            self._track(-1)

    def _track(self, d: int) -> None:
        now = asyncio.get_running_loop().time()
        if self.running == 0 and d > 0:
            self._busy_since = now
        self.running += d
        if self.running == 0 and self._busy_since is not None:
            self.busy_s += now - self._busy_since
            self._busy_since = None

    async def update_weights(self, state_dict: Any, version: int) -> int:
        self._resumed.clear()
        try:
            await asyncio.sleep(self.model.sync_s)
        finally:
            self._version = version
            self._resumed.set()
        return 0


class _Call:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class SimTrainer:
    """The trainer actor's remote-call surface, costing :class:`TrainerModel` time per step."""

    def __init__(self, model: TrainerModel) -> None:
        self.model, self.version, self.busy_s = model, 0, 0.0
        self.staleness: dict[int, int] = {}
        self._open: list[Any] | None = None
        for name in ("train_step", "start_step", "accumulate", "finish_step", "abort_step",
                     "state_dict_for_inference", "save_checkpoint", "take_logprob_records"):
            setattr(self, name, _Call(getattr(self, "_" + name)))

    async def _cost(self, groups: list[Any]) -> None:
        tokens = sum(len(t.token_ids) for g in groups for t in g.trajectories)
        for g in groups:
            for t in g.trajectories:
                vs = [v for v, m in zip(t.versions, t.loss_mask) if m]
                if vs:
                    s = self.version - min(vs)
                    self.staleness[s] = self.staleness.get(s, 0) + 1
        dt = self.model.step_s(tokens)
        self.busy_s += dt
        await asyncio.sleep(dt)

    async def _train_step(self, groups: list[Any], *a: Any, **kw: Any) -> dict[str, float]:
        await self._cost(list(groups))
        self.version += 1
        return {}

    async def _start_step(self) -> None:
        self._open = []

    async def _accumulate(self, groups: list[Any], *a: Any, **kw: Any) -> dict[str, float]:
        await self._cost(list(groups))
        return {}

    async def _finish_step(self) -> dict[str, float]:
        self._open = None
        self.version += 1
        return {}

    async def _abort_step(self) -> None:
        self._open = None

    async def _state_dict_for_inference(self, *a: Any) -> dict[str, Any]:
        return {}

    async def _save_checkpoint(self, path: str) -> str:
        os.makedirs(path, exist_ok=True)  # the controller writes its own state beside it
        return path

    async def _take_logprob_records(self) -> list[Any]:
        return []


def _draw(rng: random.Random, dist: str, mean: float, sigma: float) -> float:
    if dist == "fixed" or sigma <= 0:
        return max(0.0, mean)
    if dist == "normal":
        return max(0.0, rng.gauss(mean, sigma))
    if dist == "lognormal":  # mean and sigma of the distribution itself, not of its log
        s2 = math.log(1 + (sigma / mean) ** 2)
        return rng.lognormvariate(math.log(mean) - s2 / 2, math.sqrt(s2))
    raise ValueError(f"latency distribution must be fixed, normal or lognormal, got {dist!r}")


class SimEnv(Env):
    """An env that only costs time (see the module docstring); its reward is 1 on success, drawn with
    ``success_prob``."""

    def __init__(self, turns: float = 1, turns_sigma: float = 0.0, latency: float = 0.0, latency_sigma: float = 0.0,
                 latency_dist: str = "fixed", fail_prob: float = 0.0, success_prob: float = 0.5,
                 ) -> None:
        super().__init__()
        self.turns_mean, self.turns_sigma = turns, turns_sigma
        self.latency, self.latency_sigma, self.latency_dist = latency, latency_sigma, latency_dist
        self.fail_prob, self.success_prob = fail_prob, success_prob
        self.rng = random.Random()

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.rng = random.Random(f"{seed}-{random.random()}")  # members of a group differ
        self.turns = max(1, round(_draw(self.rng, "lognormal" if self.turns_sigma > 0 else "fixed",
                                        self.turns_mean, self.turns_sigma)))
        self.t = 0
        return [{"role": "user", "content": "task"}], {}

    async def astep(self, action: str):
        await asyncio.sleep(_draw(self.rng, self.latency_dist, self.latency, self.latency_sigma))
        if self.rng.random() < self.fail_prob:
            raise ConnectionError("simulated env failure")
        self.t += 1
        done = self.t >= self.turns
        reward = float(self.rng.random() < self.success_prob) if done else 0.0
        return [{"role": "user", "content": "obs"}], reward, done, False, {}

    async def aclose(self) -> None:
        # async on purpose: a sync close would run on the sync-env thread pool, which the virtual clock cannot see
        pass

    def reset(self, *, seed=None, options=None):  # the manager drives the async methods
        raise NotImplementedError

    def step(self, action):
        raise NotImplementedError


@dataclass
class ResponseModel:
    """Lognormal response lengths in tokens (mean, sigma), capped at ``max_response``; ``prompt_tokens`` to start;
    ``obs_tokens`` added to the context by each env answer."""

    response_mean: float = 256
    response_sigma: float = 0.0
    max_response: int = 4096
    prompt_tokens: int = 256
    obs_tokens: int = 64


class SimPolicy(Policy):
    """Each turn: one engine request of a drawn length on the context so far (see the module docstring)."""

    def __init__(self, engine: SimEngine, model: ResponseModel, seed: int = 0) -> None:
        self.engine, self.model, self.rng = engine, model, random.Random(seed)

    @property
    def version(self) -> int:
        return self.engine.version

    def session(self, meta: EpisodeMeta) -> "_SimSession":
        return _SimSession(self)


class _SimSession(PolicySession):
    def __init__(self, policy: SimPolicy) -> None:
        self.p, self.rec = policy, TokenRecord(prompt_len=policy.model.prompt_tokens)
        self.rec.add_fixed([0] * policy.model.prompt_tokens)

    async def act(self, new_messages: list[Any]) -> Action:
        m = self.p.model
        if len(self.rec) > m.prompt_tokens:  # the env's answer joins the context
            self.rec.add_fixed([0] * m.obs_tokens)
        n = max(1, min(m.max_response, round(_draw(self.p.rng, "lognormal" if m.response_sigma > 0 else "fixed",
                                                   m.response_mean, m.response_sigma))))
        versions = await self.p.engine.generate_tokens(len(self.rec), n)
        self.rec.add_generated([1] * n, [0.0] * n, versions)
        return Action(text="a", token_ids=[1] * n, logprobs=[0.0] * n, versions=versions)

    def token_record(self) -> TokenRecord:
        return self.rec
