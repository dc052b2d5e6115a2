"""Harness runs as episodes of the real EnvManager (groups, cancellation, staleness) through the real gateway over
HTTP, with the ``openai`` client; the scripted engine of test_gateway.py is the only stand-in."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import openai
import pytest

from agentrl.chat import load_tokenizer
from agentrl.gateway import HARNESS_ENV_ID, GatewayConfig, HarnessPolicy, HarnessResult
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gateway import ScriptEngine  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from agentrl.models import ensure_tiny_model

    return load_tokenizer(ensure_tiny_model())


def make_harness(turns=2, fail_on=None, wait: asyncio.Event | None = None, seen=None):
    async def harness(ctx):
        if seen is not None:
            seen.append(ctx)
        async with openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) as c:
            msgs = [{"role": "user", "content": f"task {ctx.task} seed {ctx.seed}"}]
            for t in range(turns):
                r = await c.chat.completions.create(model=ctx.model, messages=msgs, max_tokens=8)
                msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": f"turn {t}"}]
                if wait is not None:
                    await wait.wait()
        if fail_on is not None and ctx.seed == fail_on:
            raise RuntimeError("harness crashed")
        return HarnessResult(float(ctx.seed), {"graded": True})
    return harness


async def test_harness_episodes_become_trajectories_in_groups(tok):
    eng = ScriptEngine(tok, ["one<eos>", "two<eos>"])
    seen = []
    pol = HarnessPolicy(eng, tok, make_harness(seen=seen), GatewayConfig(port=0, sampling="config", temperature=0.7))
    cfg = ManagerConfig(num_groups=2, group_size=2, max_turns=16)
    try:
        async with EnvManager(cfg, pol) as m:
            groups = await m.collect_groups(iter([EpisodeSpec(HARNESS_ENV_ID, seed=s, task=f"t{s}") for s in (3, 5)]))
    finally:
        await pol.aclose()
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 4 and all(t.termination == "terminated" for t in trajs)
    for g in groups:
        assert len({t.seed for t in g.trajectories}) == 1  # a group shares its task and seed
        for t in g.trajectories:
            t.validate()
            assert t.reward == float(t.seed) and t.info["graded"] is True
            assert t.num_turns == 3  # two requests, then the end
            assert t.info["gateway/requests"] == 2 and t.info["gateway/drifts"] == 0 and t.segments == []
            assert t.num_generated == t.info["gateway/sampled_tokens"] > 0
    assert sum(t.num_generated for t in trajs) == sum(len(g.token_ids) for g in eng.outputs)
    assert {c.trajectory_id for c in seen} == {t.id for t in trajs}
    assert all(x["params"].temperature == 0.7 for x in eng.calls)  # sampling: config overrides the client
    assert not pol.gateway.store.sessions and not pol.gateway._keys  # every session closed, every key revoked
    assert pol.metrics()["gateway/sessions_ended"] == 4


async def test_failing_harness_fails_its_episode_and_is_replaced(tok):
    eng = ScriptEngine(tok, ["x<eos>"])
    pol = HarnessPolicy(eng, tok, make_harness(turns=1, fail_on=1))
    cfg = ManagerConfig(num_groups=1, group_size=1, max_turns=8, max_failures_per_group=0)
    try:
        async with EnvManager(cfg, pol) as m:
            trajs = await m.run_episodes([EpisodeSpec(HARNESS_ENV_ID, seed=1), EpisodeSpec(HARNESS_ENV_ID, seed=2)])
    finally:
        await pol.aclose()
    assert trajs[0].termination == "error" and "harness crashed" in trajs[0].error
    assert trajs[1].termination == "terminated" and trajs[1].reward == 2.0
    assert trajs[0].num_generated == len(eng.outputs[0].token_ids)  # the failed run's tokens are still recorded


async def test_stale_harness_episode_is_cancelled_with_its_harness(tok):
    eng = ScriptEngine(tok, ["x<eos>"])
    hold = asyncio.Event()
    pol = HarnessPolicy(eng, tok, make_harness(turns=3, wait=hold))
    cfg = ManagerConfig(num_groups=1, group_size=1, async_ratio=0, batch_size=1, max_turns=16)
    try:
        async with EnvManager(cfg, pol) as m:
            m.start(iter([EpisodeSpec(HARNESS_ENV_ID, seed=i) for i in range(3)]))
            for _ in range(3000):  # the first episode holds a version-0 token (its harness then waits)
                if m.metrics()["policy_calls"] >= 1:
                    break
                await asyncio.sleep(0.01)
            assert len(pol.gateway.store.sessions) == 1
            eng._version = 1
            m.set_version(1)  # v - alpha = 1 > 0: stale
            for _ in range(6000):  # (the cancel lands later on a loaded machine)
                if m.metrics()["dropped_stale"] >= 1:
                    break
                await asyncio.sleep(0.01)
            met = m.metrics()
            hold.set()
            g = await m.next_group()
            await m.stop()
    finally:
        await pol.aclose()
    assert met["dropped_stale"] >= 1 and met["cancelled"] >= 1
    t = g.trajectories[0]
    assert t.termination == "terminated" and min(v for v, k in zip(t.versions, t.loss_mask) if k) >= 1
    assert not pol.gateway.store.sessions  # the cancelled episode's session is gone
