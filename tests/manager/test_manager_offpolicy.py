"""EnvManager's off-policy rules end to end (envs in process, EchoPolicy stamping its current version on tokens):
stale held winners, a stale cancel landing while an episode releases its env, the cap on stale replacements, a
lagging engine, resume, and deadline batches."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.testing.manager_envs import EVENTS, EchoPolicy

SLEEP = "agentrl.testing.manager_envs:SleepEnv"

pytestmark = pytest.mark.timeout(60)


def _oldest(traj) -> int:
    return min(v for v, m in zip(traj.versions, traj.loss_mask) if m)


async def _until(cond, timeout=10.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


async def test_a_held_winner_that_went_stale_is_replaced():
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=1, group_size=2, async_ratio=1, batch_size=100)
    # member 0 finishes at once, member 1 runs long; replacements are quick
    spec = EpisodeSpec(SLEEP, {"turns_per_instance": [1, 60, 1], "step_latency": 0.02, "tag": "held"}, seed=1)
    async with EnvManager(cfg, pol) as m:
        m.start([spec])
        await _until(lambda: m.held == 1)  # a winner with version-0 tokens waits for its mate
        pol.current_version = 2
        m.set_version(2)  # v - alpha = 1: the held winner and the running mate are both stale
        g = await asyncio.wait_for(m.next_group(), 10)
        met = m.metrics()
        await m.stop()
    assert [_oldest(t) for t in g.trajectories] == [2, 2]
    assert met["dropped_stale"] == 2 and met["held"] == 0


async def test_a_stale_cancel_landing_while_the_episode_releases_its_env_is_not_a_winner():
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=1, group_size=1, async_ratio=1, batch_size=1)
    spec = EpisodeSpec(SLEEP, {"turns": 1, "close_latency": 0.3, "tag": "release"}, seed=2)
    async with EnvManager(cfg, pol) as m:
        m.start([spec])
        await _until(lambda: m.metrics()["env_steps"] == 1)  # the body is done; aclose takes 0.3 s
        assert m.running == 1
        pol.current_version = 2
        m.set_version(2)  # the cancel arrives during the release: it cannot stop the task any more
        g = await asyncio.wait_for(m.next_group(), 10)
        met = m.metrics()
        await m.stop()
    (t,) = g.trajectories
    assert _oldest(t) == 2 and t.id.endswith(".1")  # the replacement, not the stale first attempt
    assert met["dropped_stale"] == 1 and met["surplus"] == 0
    assert [e for tag, e in EVENTS if tag == "release"].count("close") == met["started"] == 2


async def test_stale_replacements_are_charged_to_the_group_budget():
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=1, group_size=1, async_ratio=0, max_failures_per_group=2)
    specs = [EpisodeSpec(SLEEP, {"turns": 50, "step_latency": 0.01}, seed=i, group_id=f"task{i}") for i in range(2)]
    async with EnvManager(cfg, pol) as m:
        m.start(specs)
        end = asyncio.get_running_loop().time() + 60
        while m.metrics()["failed_groups"] < 2:  # every episode goes stale before it can finish (50 turns)
            assert asyncio.get_running_loop().time() < end, m.metrics()
            await asyncio.sleep(0.03)
            pol.current_version += 1
            m.set_version(pol.current_version)
        met = m.metrics()
        await m.stop()
    # each task got 1 + max_failures_per_group attempts, then was given up (no endless resampling)
    assert met["failed_groups"] == 2 and met["dropped_stale"] == 2 * 3 and met["started"] == 6


@pytest.mark.parametrize("sync_every", [1, 2])
async def test_a_lagging_engine_wastes_no_episode(sync_every):
    alpha, num_groups, gs = 1, 2, 2
    B = num_groups * gs
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=num_groups, group_size=gs, async_ratio=alpha, max_concurrency=64)
    specs = (EpisodeSpec(SLEEP, {"turns": 3, "step_latency": 0.01, "latency_sigma": 0.01}, seed=i) for i in range(10**6))
    trained = 0
    async with EnvManager(cfg, pol) as m:
        m.set_version(0)
        m.start(specs)
        for step in range(12):
            batch = await asyncio.wait_for(m.next_batch(num_groups), 10)
            for g in batch:
                assert all(step - _oldest(t) <= alpha for t in g.trajectories)
            trained += sum(len(g.trajectories) for g in batch)
            await asyncio.sleep(0.03)  # the train step
            v = step + 1
            if v % sync_every == 0:
                pol.current_version = v  # the weight sync
            m.set_version(v)
        met = m.metrics()
        await m.stop()
    assert met["dropped_stale"] == 0 and met["cancelled"] == 0
    assert met["started"] - trained <= (alpha + 1) * B  # what is left is in flight for the next steps


async def test_restore_continues_admission_without_a_burst():
    pol = EchoPolicy()
    pol.current_version = 10
    cfg = ManagerConfig(num_groups=1, group_size=4, async_ratio=0)
    specs = (EpisodeSpec(SLEEP, {"turns": 2, "step_latency": 0.01}, seed=i) for i in range(10**6))
    async with EnvManager(cfg, pol) as m:
        m.restore(version=10, accepted=40)  # resumed at step 10 with B = 4
        m.start(specs)
        await _until(lambda: m.metrics()["started"] >= 4, 60)  # the batch admission allows, however slowly workers start
        # Every admitted episode has ended, and admission runs when one ends: a burst would have started more.
        await _until(lambda: m.metrics()["finished"] >= 4, 60)
        started = m.metrics()["started"]
        await m.stop()
    assert started == 4  # one batch, as at step 0 (a fresh counter would have admitted 44)


async def test_next_batch_waits_for_a_due_group_before_taking_faster_ones():
    alpha = 1
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=2, group_size=1, async_ratio=alpha)
    # task 0 is slow (20 turns); every other task finishes in 1
    specs = iter([EpisodeSpec(SLEEP, {"turns_per_instance": [20, 1], "step_latency": 0.01, "tag": "due"},
                              seed=i, group_id=f"task{i}") for i in range(100)])
    async with EnvManager(cfg, pol) as m:
        m.set_version(0)
        m.start(specs)
        first = await asyncio.wait_for(m.next_batch(2), 10)  # step 0: nothing due yet, completion order
        pol.current_version = 1
        m.set_version(1)
        second = await asyncio.wait_for(m.next_batch(2), 10)  # step 1: task0 (admitted at 0) is due
        met = m.metrics()
        await m.stop()
    assert "task0" not in [g.id for g in first]
    assert second[0].id == "task0" and second[0].trajectories[0].num_turns == 20
    assert met["dropped_stale"] == 0


async def test_a_ready_group_that_went_stale_before_it_was_taken_is_reopened():
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=1, group_size=2, async_ratio=1, batch_size=100)
    spec = EpisodeSpec(SLEEP, {"turns": 1, "tag": "reopen"}, seed=3)
    async with EnvManager(cfg, pol) as m:
        m.start([spec])
        await _until(lambda: m.metrics()["ready"] == 1)  # complete, version-0 tokens, not taken yet
        assert m.accepted == 2
        pol.current_version = 2
        m.set_version(2)  # both winners are stale now: the group goes back to open and gets two new members
        g = await asyncio.wait_for(m.next_group(), 10)
        met = m.metrics()
        await m.stop()
    assert [_oldest(t) for t in g.trajectories] == [2, 2]
    assert met["dropped_stale"] == 2 and met["delivered_groups"] == 1 and m.accepted == 2
