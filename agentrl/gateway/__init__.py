"""An OpenAI-compatible gateway that records every token: train unmodified agent harnesses.

Harnesses written against the OpenAI API (mini-swe-agent, a user's own ``openai`` loop) talk to
:class:`Gateway`; each request is rendered with the model's chat template by the shared renderer
(:mod:`agentrl.chat`), sampled token-in/token-out on the engine, and recorded per session with its exact prompt and
completion token ids, behaviour log-probs and per-token versions. Sessions become trajectories whose segments are
exactly what the engine saw (:mod:`~agentrl.gateway.sessions`); :mod:`~agentrl.gateway.harness` runs harnesses as
episodes of the environment manager so that groups, admission and staleness apply as for native episodes.

Modules: :mod:`~agentrl.gateway.config` (:class:`GatewayConfig`), :mod:`~agentrl.gateway.protocol` (OpenAI
request validation, error bodies), :mod:`~agentrl.gateway.planning` (segments, where a prompt goes),
:mod:`~agentrl.gateway.choices` (generations as the client's choices), :mod:`~agentrl.gateway.sessions` (assembly:
sampling and commits), :mod:`~agentrl.gateway.store` (live sessions, bounds, metrics, the render thread),
:mod:`~agentrl.gateway.guard` (Host, Origin, content type, timeouts; shared with the viewer),
:mod:`~agentrl.gateway.keys` (the server key and issued session keys),
:mod:`~agentrl.gateway.responses` (response bodies), :mod:`~agentrl.gateway.live` (token-by-token deltas that the
final reading keeps), :mod:`~agentrl.gateway.streaming` (the streamed answer's loop), :mod:`~agentrl.gateway.writers`
(each dialect's event stream), :mod:`~agentrl.gateway.server` (aiohttp),
:mod:`~agentrl.gateway.harness` (manager integration). Standalone: ``agentrl gateway --model DIR``.

Python API::

    from agentrl.gateway import Gateway, GatewayConfig, harness_policy

    async with Gateway(engine, tokenizer, GatewayConfig(port=0)) as gw:   # standalone: sessions end by API
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/s/my-session/v1", api_key="x")
        ...
        traj = gw.store.end("my-session", reward=1.0)                       # a validated Trajectory

    async def my_agent(ctx):                                                # training: one harness run per episode
        client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key)
        ...
        return reward
    await agentrl.controller.run.train(cfg, policy=harness_policy(my_agent))      # cfg.env.id = "agentrl/Harness-v0"
"""

from agentrl.gateway.config import GatewayConfig
from agentrl.gateway.harness import (HARNESS_ENV_ID, HarnessContext, HarnessEnv, HarnessPolicy, HarnessResult,
                                     harness_policy)
from agentrl.gateway.protocol import APIError
from agentrl.gateway.server import Gateway
from agentrl.gateway.sessions import Completion, Session
from agentrl.gateway.store import SessionStore

__all__ = ["APIError", "Completion", "Gateway", "GatewayConfig", "HARNESS_ENV_ID", "HarnessContext", "HarnessEnv",
           "HarnessPolicy", "HarnessResult", "Session", "SessionStore", "harness_policy"]
