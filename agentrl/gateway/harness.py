"""Training an unmodified harness: gateway sessions as episodes of the environment manager.

The user's harness is an async function ``harness(ctx) -> reward`` (or a :class:`HarnessResult`): it runs its own
agent loop against ``ctx.base_url`` with ``ctx.api_key`` (any OpenAI client), on ``ctx.task`` / ``ctx.seed``, and
returns the reward (it grades itself or calls the env's grader). :class:`HarnessPolicy` makes each such run an
episode of :class:`agentrl.manager.EnvManager`, so groups, admission (α), staleness and versions apply unchanged::

    manager ── episode (env agentrl/Harness-v0) ──> HarnessPolicy.session(meta)
        act(opening)  -> opens gateway session <trajectory id> with its own API key, starts harness(ctx)
                      -> waits for the harness's next completed request -> Action(tokens, log-probs, versions)
        env.step      -> nothing to do (observations live in the harness), reward 0
        act([])       -> the next request ... until the harness returns R
                      -> Action(text=<end marker with R>) -> env.step: terminated, reward R
        token_record  -> the session's segments (agentrl.gateway.sessions) -> Trajectory for the trainer

One manager turn per completed request: ``Action.versions`` carry the request's token versions, so the manager's
staleness rule (cancel or drop an episode whose oldest token is older than ``v − α``) sees every token the harness
sampled, and ``ManagerConfig.max_turns`` bounds the requests per episode. Cancelling the episode (stale, a group
already full, the manager stopping) cancels the harness task and closes its session: later requests with its key
fail (401/409), so even a harness that runs sync code in a thread stops at its next request. A harness that raises
fails its episode (``termination: error``; the manager replaces it within ``max_failures_per_group``).

The gateway runs in the driver's event loop (where the policy lives); :meth:`HarnessPolicy.start` starts it, or
the first episode does. A harness with blocking code must run it in a thread (``asyncio.to_thread``), as the
examples do, or it would stall the event loop that serves its own requests. Envs in Ray workers
(``ManagerConfig.workers > 0``) need ``worker_imports: [agentrl.gateway.harness]`` to find ``agentrl/Harness-v0``.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agentrl.core import Env
from agentrl.gateway.config import GatewayConfig
from agentrl.gateway.server import Gateway
from agentrl.gateway.sessions import Completion, Session
from agentrl.inference.base import InferenceEngine
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord

HARNESS_ENV_ID = "agentrl/Harness-v0"
END_MARKER = "agentrl-harness-end:"


@dataclass
class HarnessContext:
    """What a harness run gets. ``base_url`` ends with ``/v1`` (OpenAI clients' ``base_url``); ``api_key`` is this
    session's own key; ``model`` the served model name; ``task``/``seed`` the episode's (a group shares them)."""

    base_url: str
    api_key: str
    model: str
    task: Any
    seed: int | None
    trajectory_id: str
    group_id: str

    def openai_env(self) -> dict[str, str]:
        """Environment variables that point OpenAI-client-based tools (and litellm) at this session."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_BASE": self.base_url, "OPENAI_API_KEY": self.api_key}


@dataclass
class HarnessResult:
    """A harness's outcome: the reward and extra info for the trajectory."""

    reward: float
    info: dict[str, Any] = field(default_factory=dict)


HarnessFn = Callable[[HarnessContext], Awaitable["float | HarnessResult"]]


class HarnessEnv(Env):
    """The episode's env side (``agentrl/Harness-v0``): the harness owns the real environment, so this env only
    ends the episode with the reward the policy reports. ``reset`` returns the task as a user message; ``step``
    returns no observation and reward 0 for a request, and ``terminated`` with the harness's reward (also as
    ``info["episode_reward"]``) for the end marker."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = (options or {}).get("task")
        return [{"role": "user", "content": json.dumps({"harness_task": task, "seed": seed}, default=str)}], {}

    def step(self, action: str):
        if isinstance(action, str) and action.startswith(END_MARKER):
            end = json.loads(action[len(END_MARKER):])
            reward = float(end["reward"])
            return [], reward, True, False, {**end.get("info", {}), "episode_reward": reward}
        return [], 0.0, False, False, {}

    # Native async (no thread-pool hop per request): the manager steps this env once per harness request.
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self.reset(seed=seed, options=options)

    async def astep(self, action: str):
        return self.step(action)

    async def aclose(self) -> None:
        self.close()


def _register() -> None:
    import gymnasium

    from agentrl.registration import register

    if HARNESS_ENV_ID not in gymnasium.registry:
        register(HARNESS_ENV_ID, entry_point="agentrl.gateway.harness:HarnessEnv",
                 description="A gateway harness episode: the user's OpenAI-client agent runs against the gateway.")


_register()


class HarnessSession(PolicySession):
    """One episode: one gateway session and one harness run (see the module docstring)."""

    def __init__(self, policy: "HarnessPolicy", meta: EpisodeMeta):
        self.policy, self.meta = policy, meta
        self.session: Session | None = None
        self.task: asyncio.Task | None = None
        self.events: asyncio.Queue[Completion] = asyncio.Queue()
        self._record: TokenRecord | None = None
        self._closed = False

    async def act(self, new_messages: list[dict[str, Any]]) -> Action:
        if self.task is None:
            gw = await self.policy.start()
            self.session, key = gw.open_session(self.meta.trajectory_id, {
                "trajectory_id": self.meta.trajectory_id, "group_id": self.meta.group_id, "env_id": self.meta.env_id,
                "seed": self.meta.seed, "task": self.meta.task})
            self.session.listeners.append(self.events.put_nowait)
            ctx = HarnessContext(gw.url + "/v1", key, gw.model_name, self.meta.task, self.meta.seed,
                                 self.meta.trajectory_id, self.meta.group_id)
            self.task = asyncio.ensure_future(self.policy.harness(ctx))
        if self.events.empty() and not self.task.done():
            getter = asyncio.ensure_future(self.events.get())
            try:
                await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                self.events.put_nowait(getter.result())  # keep the order: handled just below
        if not self.events.empty():
            c = self.events.get_nowait()
            first = c.choices[0]
            return Action(text=first.content or first.text,
                          token_ids=[t for ch in c.choices for t in ch.token_ids],
                          logprobs=[x for ch in c.choices for x in ch.logprobs],
                          versions=[v for ch in c.choices for v in ch.versions],
                          finish_reason=first.finish_reason, tool_calls=first.tool_calls)
        result = self.task.result()  # the harness's exception (if any) fails the episode here
        if not isinstance(result, HarnessResult):
            result = HarnessResult(result)  # type: ignore[arg-type]
        reward = float(result.reward)
        if not math.isfinite(reward):
            raise ValueError(f"harness returned a non-finite reward {result.reward!r}")
        self._close_session()
        return Action(text=END_MARKER + json.dumps({"reward": reward, "info": result.info}, default=str))

    def token_record(self) -> TokenRecord | None:
        if self._record is not None:
            return self._record
        return self.session.token_record() if self.session is not None else None

    def _close_session(self) -> None:
        if self.session is not None and self._record is None:
            self._record = self.session.token_record()
            self.policy.gateway_close(self.session.id)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_session()
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


class HarnessPolicy(Policy):
    """Gateway sessions as the manager's policy (see the module docstring).

    ``engine`` and ``tokenizer``: the model the gateway serves. ``harness``: the user's async function.
    ``cfg``: the gateway's config (default: 127.0.0.1, a free port, ``sampling: config``). Call
    ``await policy.aclose()`` to stop the gateway (the training controller does).
    """

    def __init__(self, engine: InferenceEngine, tokenizer: Any, harness: HarnessFn, cfg: GatewayConfig | None = None):
        self.engine, self.harness = engine, harness
        self.cfg = cfg or GatewayConfig(port=0, sampling="config")
        self.gateway = Gateway(engine, tokenizer, self.cfg)
        self._started: asyncio.Future | None = None

    async def start(self) -> Gateway:
        """Starts the gateway once (concurrent callers wait for the same start); returns it."""
        if self._started is None:
            self._started = asyncio.ensure_future(self.gateway.start())
        await asyncio.shield(self._started)
        return self.gateway

    def gateway_close(self, sid: str) -> None:
        self.gateway.close_session(sid)

    def session(self, meta: EpisodeMeta) -> HarnessSession:
        return HarnessSession(self, meta)

    def metrics(self) -> dict[str, float]:
        """The gateway's metrics (``gateway/drift_rate``, ``gateway/segments_per_session``,
        ``tool/parse_error_rate``, counters)."""
        return self.gateway.metrics()

    @property
    def version(self) -> int:
        return self.engine.version

    async def aclose(self) -> None:
        if self._started is not None:
            await asyncio.gather(self._started, return_exceptions=True)
            await self.gateway.stop()
            self._started = None


def harness_policy(harness: HarnessFn, cfg: GatewayConfig | None = None) -> Callable[[Any, Any, Any], HarnessPolicy]:
    """Returns a policy factory for :func:`agentrl.controller.run.train` (``train(cfg, policy=harness_policy(fn))``):
    the gateway samples with the run's ``rollout`` temperature/top-p/top-k (``sampling: config``, so the trainer's
    ratios are taken against the distribution that was sampled) and the rollout's chat config, unless ``cfg`` is
    given; a given ``cfg`` must sample the same way (``sampling: config``, the rollout's temperature/top_p/top_k),
    else ValueError."""

    def make(engine: Any, tokenizer: Any, rollout: Any) -> HarnessPolicy:
        if cfg is not None:  # the trainer scores tokens under the rollout's sampling: the gateway must sample so
            want = {"sampling": "config", "temperature": rollout.temperature, "top_p": rollout.top_p,
                    "top_k": rollout.top_k}
            bad = [f"{k}={getattr(cfg, k)!r} (rollout: {v!r})" for k, v in want.items() if getattr(cfg, k) != v]
            if bad:
                raise ValueError(f"harness_policy: GatewayConfig {', '.join(bad)}: the gateway would sample from "
                                 f"another distribution than the trainer scores; set sampling='config' and the "
                                 f"rollout's temperature/top_p/top_k")
        gcfg = cfg or GatewayConfig(port=0, sampling="config", temperature=rollout.temperature, top_p=rollout.top_p,
                                    top_k=rollout.top_k, chat=rollout.chat)
        return HarnessPolicy(engine, tokenizer, harness, gcfg)

    return make
