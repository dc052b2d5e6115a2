"""EnvManager with envs in real Ray env-worker actors: placement, faults through Ray, cancellation inside the
worker, and a worker killed with ``ray.kill`` in the middle of a run. One local Ray session for the module."""

from __future__ import annotations

import asyncio
import collections

import pytest
import ray

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.testing.manager_envs import EchoPolicy

SLEEP = "agentrl.testing.manager_envs:SleepEnv"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


async def test_episodes_spread_over_workers_and_faults_come_back_as_errors(ray_session):
    cfg = ManagerConfig(workers=2, max_concurrency=64, step_timeout_s=1.0, max_failures_per_group=1)
    async with EnvManager(cfg, EchoPolicy()) as m:
        specs = [EpisodeSpec(SLEEP, {"turns": 3, "step_latency": 0.05}, seed=i, task=i) for i in range(40)]
        specs += [EpisodeSpec(SLEEP, {"fault": "garbage"}), EpisodeSpec(SLEEP, {"fault": "raise"}),
                  EpisodeSpec(SLEEP, {"fault": "hang", "fault_at": 1})]
        trajs = await m.run_episodes(specs)
        stats = await m.worker_stats()
        met = m.metrics()
    assert [t.termination for t in trajs[:40]] == ["terminated"] * 40
    assert [t.task for t in trajs[:40]] == list(range(40))
    assert "5-tuple" in trajs[40].error and "injected step failure" in trajs[41].error
    assert "kind='timeout'" in trajs[42].error
    assert len(stats) == 2 and all(s["opened"] >= 15 for s in stats)  # least-loaded placement uses both
    assert all(s["live"] == 0 and s["inflight"] == 0 and s["closed"] == s["opened"] for s in stats)
    assert sum(s["steps"] for s in stats) >= 120
    assert met["failed"] == 6 and met["env_steps"] >= 120


async def test_losers_blocked_in_step_are_cancelled_inside_the_worker(ray_session):
    # placement alternates over the two workers; in each worker the second env of this tag hangs in step
    cfg = ManagerConfig(workers=2, num_groups=1, group_size=2, extra_per_group=2, step_timeout_s=60)
    pol = EchoPolicy()
    async with EnvManager(cfg, pol) as m:
        (g,) = await asyncio.wait_for(m.collect_groups(
            [EpisodeSpec(SLEEP, {"turns": 2, "step_latency": 0.05, "tag": "ray-losers", "hang_after": 1})]), 20)
        stats = await m.worker_stats()
        met = m.metrics()
    assert [t.termination for t in g.trajectories] == ["terminated", "terminated"]
    assert met["cancelled"] == 2 and met["running"] == 0
    assert sum(s["cancelled_calls"] for s in stats) == 2  # the hung steps were cancelled in the workers
    assert sum(s["closed"] for s in stats) == 4 and all(s["live"] == 0 for s in stats)
    assert sorted(pol.closed) == sorted(pol.opened)


async def test_killed_worker_episodes_are_rescheduled_and_the_run_goes_on(ray_session):
    cfg = ManagerConfig(workers=2, max_concurrency=1000, num_groups=30, group_size=4, step_timeout_s=10)
    async with EnvManager(cfg, EchoPolicy()) as m:
        victim = m.workers[0]

        async def kill_soon():
            while m.metrics()["env_steps"] < 100:
                await asyncio.sleep(0.01)
            ray.kill(victim.actor)

        killer = asyncio.ensure_future(kill_soon())
        specs = [EpisodeSpec(SLEEP, {"turns": 4, "step_latency": 0.1, "latency_sigma": 0.02}, seed=i, task=i)
                 for i in range(30)]
        groups = await asyncio.wait_for(m.collect_groups(specs), 60)
        await killer
        for _ in range(600):  # the replacement worker starts in the background
            if m.metrics()["workers_alive"] == 2:
                break
            await asyncio.sleep(0.05)
        met = m.metrics()
        stats = await m.worker_stats()
    assert len(groups) == 30
    ids = [t.id for g in groups for t in g.trajectories]
    assert len(ids) == len(set(ids)) == 120
    assert all(t.termination == "terminated" and t.num_turns == 4 for g in groups for t in g.trajectories)
    assert sorted(g.trajectories[0].task for g in groups) == list(range(30))
    assert met["worker_deaths"] == 1 and met["rescheduled"] > 0
    assert all("WorkerDied" in t.error for t in m.failed) and len(m.failed) == met["rescheduled"]
    assert met["workers_alive"] == 2 and not victim.alive  # a new worker replaced the dead one
    assert all(s["live"] == 0 for s in stats)
    assert collections.Counter(t.termination for t in m.failed) == {"error": met["rescheduled"]}
