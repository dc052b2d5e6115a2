"""Cost models that stand in for the engine, the trainer and the envs in a simulated run (virtual clock).

Each part costs what its parameters say and nothing else; the manager, admission, schedulers and the controller
that drive them are the real ones.

- :class:`EngineModel` / :class:`SimEngine` (:mod:`agentrl.simulate.engine`): continuous batching on replicas,
  prefill and decode steps that grow with the batch and its contexts, weight-sync pauses.
- :class:`TrainerModel` / :class:`SimTrainer`: a step costs ``step_overhead_s + tokens x flops_per_token /
  (peak_flops x mfu x gpus)`` seconds (6 x parameters is the usual ``flops_per_token`` for a forward and backward).
- :class:`SimEnv`: ``turns`` steps (a fixed or lognormal count, or as many as the policy's replayed trajectory has),
  each taking a latency drawn from ``fixed``, ``normal`` or ``lognormal`` (mean, sigma), with fail-slow steps and
  failures at given rates.
- :class:`SimPolicy`: each turn asks the engine for a response whose length is lognormal (``response_mean``,
  ``response_sigma``, at most ``max_response``; part of the spread belongs to the task) or replayed from a run's
  ``trajectories.jsonl``, on a context that grows by the env's messages (``obs_tokens``) and the responses so far.

Randomness: the envs draw from ``ENV_RNG`` (seeded by :func:`agentrl.simulate.run.simulate`) mixed with their seed,
the policy from its own generator: one seed gives one simulation.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
from dataclasses import dataclass
from typing import Any

from agentrl.core import Env
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord
from agentrl.simulate.engine import EngineModel, SimEngine

__all__ = ["EngineModel", "SimEngine", "TrainerModel", "SimTrainer", "SimEnv", "ResponseModel", "SimPolicy"]
ENV_RNG = random.Random()  # the envs' draws (seeded by simulate): not the global generator, which imports touch
END = "<end>"  # the action text of a policy-decided episode's last turn (SimEnv with turns=0)


@dataclass
class TrainerModel:
    """A step costs ``step_overhead_s + tokens x flops_per_token / (peak_flops x mfu x gpus)`` seconds:
    ``flops_per_token`` (6 x parameters for forward + backward; 8 x with the proximal recompute's extra forward),
    ``peak_flops`` per GPU (dense bf16), ``mfu``, ``gpus`` (data-parallel ranks), a fixed ``step_overhead_s``
    (optimizer step, gathering weights for the engine). ``slowdown_while_generating``: the step costs that many times
    more while a rollout is in flight on the same devices (shared CPU cores: the engine, and the driver's agent loops
    between its requests, which the CPU validation found to slow a streamed step as much), plus
    ``slowdown_per_running_request`` times the requests the engine is running (on shared CPU cores a bigger batch
    takes more of them: 2.1x beside rollouts of 64 episodes, 3.2x beside 128 kept in flight); ``exclusive``: the
    engine is paused during a step instead (co-located on the same GPUs).

    Layout: with ``micro_batch_size`` 0 (packed or tree layouts; the GPU presets) every token of a step costs
    ``flops_per_token``. With ``micro_batch_size`` > 0 the trainer pads (its default layout): the trajectories are
    sorted by length and cut into micro-batches of that many, and the body costs ``flops_per_token`` per *padded*
    token (rows x the longest row), while the log-prob head, which only ever sees real positions, costs
    ``head_flops_per_token`` per real token. On a batch of long-tailed lengths the padded count is 2-3x the real one
    (the quickstart's trajectories), so a cost by real tokens underestimates the CPU trainer's step by ~40 %."""

    flops_per_token: float = 6 * 0.5e9
    peak_flops: float = 989e12
    mfu: float = 0.3
    gpus: int = 1
    step_overhead_s: float = 0.0
    slowdown_while_generating: float = 1.0
    slowdown_per_running_request: float = 0.0
    exclusive: bool = False
    micro_batch_size: int = 0
    head_flops_per_token: float = 0.0

    def validate(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"trainer.gpus must be >= 1, got {self.gpus}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"trainer.mfu must be in (0, 1], got {self.mfu}")
        if self.peak_flops <= 0 or self.flops_per_token < 0 or self.step_overhead_s < 0 or self.head_flops_per_token < 0:
            raise ValueError("trainer.peak_flops must be > 0; flops_per_token, head_flops_per_token and "
                             "step_overhead_s >= 0")
        if self.micro_batch_size < 0:
            raise ValueError(f"trainer.micro_batch_size must be >= 0 (0: no padding), got {self.micro_batch_size}")
        if self.slowdown_while_generating < 1:
            raise ValueError(f"trainer.slowdown_while_generating must be >= 1, got {self.slowdown_while_generating}")
        if self.slowdown_per_running_request < 0:
            raise ValueError("trainer.slowdown_per_running_request must be >= 0, got "
                             f"{self.slowdown_per_running_request}")

    def step_s(self, tokens: int, padded: int | None = None) -> float:
        """Seconds of a step over ``tokens`` real tokens laid out as ``padded`` (None: packed, the same count)."""
        body = tokens if padded is None or self.micro_batch_size == 0 else padded
        return (body * self.flops_per_token + tokens * self.head_flops_per_token) / (
            self.peak_flops * self.mfu * self.gpus)

    def padded_tokens(self, lengths: list[int]) -> int:
        """Rows x longest row over the length-sorted micro-batches of ``micro_batch_size`` (the trainer's padded
        layout, :func:`agentrl.trainer.batching.split_micro` without a token cap); the plain sum when 0."""
        if self.micro_batch_size == 0:
            return sum(lengths)
        ls, k = sorted(lengths, reverse=True), self.micro_batch_size
        return sum(len(ls[i:i + k]) * ls[i] for i in range(0, len(ls), k))


class _Call:
    """A remote method of the simulated trainer actor: like a Ray actor's (one thread), a call runs once every call
    made before it ended, however many its callers have in flight (the streamed steps send ``accumulate`` per group
    without waiting); ``remote()`` submits it at once and returns the awaitable of its result."""

    def __init__(self, fn: Any, thread: asyncio.Lock) -> None:
        self.fn, self.thread = fn, thread

    def remote(self, *a: Any, **kw: Any) -> "asyncio.Future[Any]":
        async def run() -> Any:
            async with self.thread:  # FIFO: tasks start, and so queue, in the order they were made
                return await self.fn(*a, **kw)

        return asyncio.ensure_future(run())


class SimTrainer:
    """The trainer actor's remote-call surface, costing :class:`TrainerModel` time per step; its calls run one at a
    time, in the order they were made (:class:`_Call`). ``engine``: the :class:`SimEngine` it shares devices with
    (slowdowns, exclusive co-location); ``staleness``: trained trajectories by their oldest generated token's age in
    versions."""

    def __init__(self, model: TrainerModel, engine: SimEngine | None = None) -> None:
        self.model, self.engine, self.version, self.busy_s = model, engine, 0, 0.0
        self.staleness: dict[int, int] = {}
        self.tokens = 0
        self._open: list[Any] | None = None
        thread = asyncio.Lock()
        for name in ("train_step", "start_step", "accumulate", "finish_step", "abort_step",
                     "state_dict_for_inference", "save_checkpoint", "take_logprob_records"):
            setattr(self, name, _Call(getattr(self, "_" + name), thread))

    async def _cost(self, groups: list[Any], overhead: float = 0.0) -> None:
        lengths = [len(t.token_ids) for g in groups for t in g.trajectories]
        tokens = sum(lengths)
        self.tokens += tokens
        for g in groups:
            for t in g.trajectories:
                vs = [v for v, m in zip(t.versions, t.loss_mask) if m]
                if vs:
                    s = self.version - min(vs)
                    self.staleness[s] = self.staleness.get(s, 0) + 1
        await self._spend(self.model.step_s(tokens, self.model.padded_tokens(lengths)) + overhead)

    async def _spend(self, dt: float) -> None:
        m, eng = self.model, self.engine
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if eng is not None:
            eng.training = True
            if m.exclusive:
                eng.pause()
        try:
            shared = m.slowdown_while_generating != 1 or m.slowdown_per_running_request != 0
            if eng is None or not shared or m.exclusive:
                await asyncio.sleep(dt)
            else:  # in tenths, each slowed by the rollout in flight when it starts
                for _ in range(10):
                    busy = eng.running or eng.episodes
                    factor = m.slowdown_while_generating + m.slowdown_per_running_request * eng.running
                    await asyncio.sleep(dt / 10 * (factor if busy else 1.0))
        finally:
            if eng is not None:
                eng.training = False
                if m.exclusive:
                    eng.resume()
            self.busy_s += loop.time() - t0

    async def _train_step(self, groups: list[Any], *a: Any, **kw: Any) -> dict[str, float]:
        await self._cost(list(groups), self.model.step_overhead_s)
        self.version += 1
        return {}

    async def _start_step(self) -> None:
        self._open = []

    async def _accumulate(self, groups: list[Any], *a: Any, **kw: Any) -> dict[str, float]:
        await self._cost(list(groups))
        return {}

    async def _finish_step(self) -> dict[str, float]:
        self._open = None
        await self._spend(self.model.step_overhead_s)
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


class Lockstep:
    """A barrier for batch-level (lock-step) env execution, the baseline of ROLL Flash's env-level asynchrony: every
    live episode's action must be in before any env steps, and every env's step must be done before any episode
    generates again, so a turn costs the batch's slowest response plus its slowest env step. Members join at reset
    and leave when their episode ends or closes; a phase opens when all members have arrived."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.members = self.arrived = 0
        self._event: asyncio.Event | None = None

    def join(self) -> None:
        self.members += 1

    def leave(self) -> None:
        self.members -= 1
        self._check()

    async def wait(self) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        ev = self._event
        self.arrived += 1
        self._check()
        await ev.wait()

    def _check(self) -> None:
        if self._event is not None and self.arrived >= self.members:
            self.arrived, ev, self._event = 0, self._event, None
            ev.set()


LOCKSTEP = Lockstep()  # the run's barrier (reset by simulate)


class SimEnv(Env):
    """An env that only costs time (see the module docstring); its reward is 1 on success, drawn with
    ``success_prob``.

    ``turns``: steps per episode (``turns_sigma`` > 0: lognormal), or 0: the policy decides (the episode ends on its
    ``<end>`` action; :class:`SimPolicy` with empirical trajectories). Each step waits a latency from
    ``latency_dist`` (``fixed``, ``normal`` clipped at 0, ``lognormal``; mean ``latency``, sd ``latency_sigma``, at
    most ``latency_max`` when > 0); with probability ``slow_prob`` it is a fail-slow step taking ``slow_factor`` times
    as long; with probability ``fail_prob`` it raises (an infrastructure failure the manager retries or fails).
    ``lockstep``: all episodes step together (:class:`Lockstep`), the batch-level baseline."""

    def __init__(self, turns: float = 1, turns_sigma: float = 0.0, latency: float = 0.0, latency_sigma: float = 0.0,
                 latency_dist: str = "fixed", latency_max: float = 0.0, fail_prob: float = 0.0,
                 slow_prob: float = 0.0, slow_factor: float = 10.0, success_prob: float = 0.5,
                 lockstep: bool = False) -> None:
        super().__init__()
        self.lockstep, self._member = lockstep, False
        if latency_dist not in ("fixed", "normal", "lognormal"):
            raise ValueError(f"env.kwargs.latency_dist must be fixed, normal or lognormal, got {latency_dist!r}")
        for name, v in (("turns", turns), ("latency", latency), ("latency_sigma", latency_sigma),
                        ("latency_max", latency_max), ("slow_factor", slow_factor)):
            if v < 0:
                raise ValueError(f"env.kwargs.{name} must be >= 0, got {v}")
        for name, v in (("fail_prob", fail_prob), ("slow_prob", slow_prob), ("success_prob", success_prob)):
            if not 0 <= v <= 1:
                raise ValueError(f"env.kwargs.{name} must be in [0, 1], got {v}")
        self.turns_mean, self.turns_sigma = turns, turns_sigma
        self.latency, self.latency_sigma, self.latency_dist = latency, latency_sigma, latency_dist
        self.latency_max, self.slow_prob, self.slow_factor = latency_max, slow_prob, slow_factor
        self.fail_prob, self.success_prob = fail_prob, success_prob
        self.rng = random.Random()

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.rng = random.Random(f"{seed}-{ENV_RNG.random()}")  # members of a group differ
        self.turns = 0 if self.turns_mean == 0 else max(1, round(_draw(
            self.rng, "lognormal" if self.turns_sigma > 0 else "fixed", self.turns_mean, self.turns_sigma)))
        self.t = 0
        if self.lockstep and not self._member:
            self._member = True
            LOCKSTEP.join()
        return [{"role": "user", "content": "task"}], {}

    def _leave(self) -> None:
        if self._member:
            self._member = False
            LOCKSTEP.leave()

    def latency_s(self) -> float:
        dt = _draw(self.rng, self.latency_dist, self.latency, self.latency_sigma)
        if self.latency_max > 0:
            dt = min(dt, self.latency_max)
        if self.slow_prob and self.rng.random() < self.slow_prob:
            dt *= self.slow_factor
        return dt

    async def astep(self, action: str):
        if self._member:
            await LOCKSTEP.wait()  # every action is in
        await asyncio.sleep(self.latency_s())
        if self._member:
            await LOCKSTEP.wait()  # every env has stepped
        if self.fail_prob and self.rng.random() < self.fail_prob:
            self._leave()
            raise ConnectionError("simulated env failure")
        self.t += 1
        done = action == END if self.turns == 0 else self.t >= self.turns
        if done:
            self._leave()
        reward = float(self.rng.random() < self.success_prob) if done else 0.0
        return [{"role": "user", "content": "obs"}], reward, done, False, {}

    async def aclose(self) -> None:
        # async on purpose: a sync close would run on the sync-env thread pool, which the virtual clock cannot see
        self._leave()

    def reset(self, *, seed=None, options=None):  # the manager drives the async methods
        raise NotImplementedError

    def step(self, action):
        raise NotImplementedError


@dataclass
class ResponseModel:
    """Response lengths in tokens: lognormal (``response_mean``, ``response_sigma``), capped at ``max_response``;
    ``task_share`` of the length's log-variance belongs to the task (a prompt that draws long answers draws them
    for every member of its group and every replay: RollPacker's premise), the rest to the response.
    ``prompt_tokens`` to start; ``obs_tokens`` added to the context by each env answer.

    ``trajectories``: a run's ``trajectories.jsonl`` instead: each episode replays one logged trajectory's turn
    count and generated tokens (spread evenly over its turns), drawn at random; the env then needs ``turns: 0``."""

    response_mean: float = 256
    response_sigma: float = 0.0
    task_share: float = 0.0
    max_response: int = 4096
    prompt_tokens: int = 256
    obs_tokens: int = 64
    trajectories: str = ""

    def validate(self) -> None:
        if not 0 <= self.task_share <= 1:
            raise ValueError(f"response.task_share must be in [0, 1], got {self.task_share}")
        for name, value, ok, rule in (("response_mean", self.response_mean, self.response_mean > 0, "> 0"),
                                      ("max_response", self.max_response, self.max_response >= 1, ">= 1"),
                                      ("prompt_tokens", self.prompt_tokens, self.prompt_tokens >= 0, ">= 0"),
                                      ("obs_tokens", self.obs_tokens, self.obs_tokens >= 0, ">= 0")):
            if not ok:
                raise ValueError(f"response.{name} must be {rule}, got {value}")


def load_trajectories(path: str) -> list[tuple[int, int]]:
    """(turns, generated tokens) of every trajectory in a run's ``trajectories.jsonl`` (its ``summary``)."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                s = json.loads(line)["summary"]
                out.append((max(1, int(s["turns"])), int(s["generated"])))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{i}: not a trajectory log line with summary.turns/generated ({e})") from e
    if not out:
        raise ValueError(f"{path}: no trajectories")
    return out


class SimPolicy(Policy):
    """Each turn: one engine request of a drawn length on the context so far (see the module docstring)."""

    def __init__(self, engine: SimEngine, model: ResponseModel, seed: int = 0) -> None:
        self.engine, self.model, self.rng, self.seed = engine, model, random.Random(seed), seed
        self.samples = load_trajectories(model.trajectories) if model.trajectories else None

    @property
    def version(self) -> int:
        return self.engine.version

    def session(self, meta: EpisodeMeta) -> "_SimSession":
        return _SimSession(self, meta)

    def lengths(self, meta: EpisodeMeta) -> list[int] | None:
        """The episode's per-turn lengths when replaying a logged trajectory, else None (drawn turn by turn)."""
        if self.samples is None:
            return None
        turns, gen = self.rng.choice(self.samples)
        return [gen // turns + (1 if i < gen % turns else 0) for i in range(turns)]

    def task_median(self, meta: EpisodeMeta) -> float:
        """The log-mean of this task's lengths: the task's share of the spread is drawn from its seed alone."""
        m = self.model
        s2 = math.log(1 + (m.response_sigma / m.response_mean) ** 2) if m.response_sigma > 0 else 0.0
        mu = math.log(m.response_mean) - s2 / 2
        if m.task_share > 0 and s2 > 0:
            mu += random.Random(f"task-{self.seed}-{meta.seed}-{meta.task}").gauss(0, math.sqrt(m.task_share * s2))
        return mu


class _SimSession(PolicySession):
    def __init__(self, policy: SimPolicy, meta: EpisodeMeta) -> None:
        m = policy.model
        self.p, self.rec = policy, TokenRecord(prompt_len=m.prompt_tokens)
        self.rec.add_fixed([0] * m.prompt_tokens)
        self.plan = policy.lengths(meta)
        s2 = math.log(1 + (m.response_sigma / m.response_mean) ** 2) if m.response_sigma > 0 else 0.0
        self.mu, self.sd = policy.task_median(meta), math.sqrt((1 - m.task_share) * s2)
        self.cached = 0  # context tokens already in the engine's prefix cache
        self.turn = 0
        self.max_new_tokens: int | None = None  # set by tail batching's budget wrapper
        self.open = True
        policy.engine.episodes += 1

    async def aclose(self) -> None:
        if self.open:
            self.open = False
            self.p.engine.episodes -= 1

    async def act(self, new_messages: list[Any]) -> Action:
        m = self.p.model
        if len(self.rec) > m.prompt_tokens:  # the env's answer joins the context
            self.rec.add_fixed([0] * m.obs_tokens)
        if self.plan is not None:
            n = self.plan[min(self.turn, len(self.plan) - 1)]
        else:
            n = round(self.p.rng.lognormvariate(self.mu, self.sd)) if self.sd > 0 else round(math.exp(self.mu))
        n = max(1, min(m.max_response, n, self.max_new_tokens or n))
        self.turn += 1
        versions = await self.p.engine.generate_tokens(len(self.rec), n, self.cached)
        self.rec.add_generated([1] * n, [0.0] * n, versions)
        self.cached = len(self.rec)
        last = self.plan is not None and self.turn >= len(self.plan)
        return Action(text=END if last else "a", token_ids=[1] * n, logprobs=[0.0] * n, versions=versions)

    def token_record(self) -> TokenRecord:
        return self.rec
