"""Env workers under hostile envs: a sync env hung in ``step`` neither blocks process exit nor exhausts the sync
thread pool; a Ray env worker that stops answering (its event loop blocked, or the process stopped) is found by its
heartbeat and replaced like a dead one, its episodes rescheduled; a failed or timed-out step's time counts in
``timings["env_s"]``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agentrl import core
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.testing.manager_envs import EchoPolicy
from agentrl.manager.workers import RayWorker
from agentrl.testing.faulty_envs import release_hung

HANG = "agentrl.testing.faulty_envs:SyncHangEnv"
STUCK = "agentrl.testing.faulty_envs:StuckLoopEnv"
SLEEP = "agentrl.testing.manager_envs:SleepEnv"
SYNC = "agentrl.testing.manager_envs:SyncSleepEnv"

pytestmark = pytest.mark.timeout(180)


def test_hung_sync_step_does_not_block_process_exit(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio
        from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
        from agentrl.testing.manager_envs import EchoPolicy

        async def main():
            cfg = ManagerConfig(step_timeout_s=0.5, max_failures_per_group=0)
            async with EnvManager(cfg, EchoPolicy()) as m:
                trajs = await m.run_episodes([EpisodeSpec({HANG!r}, {{}}) for _ in range(3)])
            print("RESULT", [t.termination for t in trajs], flush=True)

        asyncio.run(main())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("RESULT ['error', 'error', 'error']"), (line, proc.stderr.read()[-2000:])
        t0 = time.monotonic()
        rc = proc.wait(timeout=30)  # joinable threads blocked in the hung steps would hold the exit forever
        assert rc == 0 and time.monotonic() - t0 < 30
    finally:
        proc.kill()


async def test_sync_pool_recovers_after_hung_calls():
    core.set_sync_env_threads(2)
    try:
        cfg = ManagerConfig(step_timeout_s=0.5, reset_timeout_s=5.0, max_failures_per_group=0, max_concurrency=64)
        async with EnvManager(cfg, EchoPolicy()) as m:
            hung = await m.run_episodes([EpisodeSpec(HANG, {}) for _ in range(6)])  # 3x the pool's threads
            assert all("kind='timeout'" in t.error for t in hung)
            ok = await m.run_episodes([EpisodeSpec(SYNC, {"turns": 2, "step_latency": 0.05}) for _ in range(4)])
        assert [t.termination for t in ok] == ["terminated"] * 4, [t.error for t in ok]
        stats = core.sync_pool_stats()
        # the calls running when their timeout hit are hung; queued ones never started
        assert stats["hung"] >= 2 and stats["serving"] <= 2, stats
    finally:
        release_hung()
        core.set_sync_env_threads(int(os.environ.get("AGENTRL_ENV_THREADS", "32")))
    for _ in range(100):  # the released threads return and leave
        if core.sync_pool_stats()["hung"] == 0:
            break
        await asyncio.sleep(0.05)


async def test_failed_and_timed_out_steps_count_in_env_s():
    cfg = ManagerConfig(step_timeout_s=0.6, max_failures_per_group=0)
    async with EnvManager(cfg, EchoPolicy()) as m:
        hang, raised = await m.run_episodes([
            EpisodeSpec(SLEEP, {"turns": 3, "fault": "hang", "fault_at": 0}),
            EpisodeSpec(SLEEP, {"turns": 3, "step_latency": 0.3, "fault": "raise", "fault_at": 0}),
        ])
    assert "kind='timeout'" in hang.error and hang.timings["env_s"] >= 0.55, hang.timings
    assert "injected step failure" in raised.error and raised.timings["env_s"] >= 0.28, raised.timings


# Ray --------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def fast_heartbeat(monkeypatch):
    monkeypatch.setattr(RayWorker, "heartbeat_interval_s", 0.5)
    monkeypatch.setattr(RayWorker, "heartbeat_timeout_s", 4.0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return "State:\tZ" not in open(f"/proc/{pid}/status").read()
    except OSError:
        return False


@pytest.mark.parametrize("how", ["blocked_loop", "sigstop"])
async def test_stuck_ray_worker_is_replaced_and_its_episodes_rescheduled(ray_session, fast_heartbeat, tmp_path, how):
    cfg = ManagerConfig(workers=2, num_groups=12, group_size=2, max_concurrency=64, step_timeout_s=120,
                        reset_timeout_s=120)
    once = str(tmp_path / "stuck-once")
    kwargs = {"turns": 3, "step_latency": 0.2, "stuck_s": 0} if how == "sigstop" else {"turns": 3, "once_file": once}
    async with EnvManager(cfg, EchoPolicy()) as m:
        initial = list(m.workers)
        pids = [await w.actor.pid.remote() for w in initial]
        victim_pid = pids[0]  # sigstop: this one; blocked_loop: whichever runs the first step

        async def stop_soon():
            while m.metrics()["env_steps"] < 4:
                await asyncio.sleep(0.02)
            os.kill(victim_pid, signal.SIGSTOP)

        stopper = asyncio.ensure_future(stop_soon()) if how == "sigstop" else None
        specs = [EpisodeSpec(STUCK, kwargs, seed=i, task=i) for i in range(12)]
        t0 = time.monotonic()
        groups = await asyncio.wait_for(m.collect_groups(specs), 90)  # the steps' own timeout is 120 s
        elapsed = time.monotonic() - t0
        if stopper is not None:
            await stopper
        for _ in range(400):  # the replacement starts in the background
            if m.metrics()["workers_alive"] == 2:
                break
            await asyncio.sleep(0.05)
        met = m.metrics()
        dead = [(w, pid) for w, pid in zip(initial, pids) if not w.alive]
    ids = [t.id for g in groups for t in g.trajectories]
    assert len(groups) == 12 and len(ids) == len(set(ids)) == 24
    assert all(t.termination == "terminated" for g in groups for t in g.trajectories)
    assert met["worker_deaths"] == 1 and met["rescheduled"] >= 1 and met["workers_alive"] == 2
    assert len(dead) == 1 and "heartbeat" in dead[0][0].death_cause, [w.death_cause for w in initial]
    victim_pid = dead[0][1]
    assert all("WorkerDied" in t.error and "heartbeat" in t.error for t in m.failed)
    assert elapsed < 60
    for _ in range(100):  # the stuck process was killed, not left behind
        if not _pid_alive(victim_pid):
            break
        await asyncio.sleep(0.1)
    assert not _pid_alive(victim_pid)
