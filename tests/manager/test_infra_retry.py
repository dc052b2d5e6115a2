"""Infrastructure failures (an env's sandbox lost, its engine gone, its memory or disk limit hit) are retried by the
manager in a fresh env, up to ``infra_retries`` attempts in a row, without charging the group's failure budget; each
failure is still counted in ``failures/<cause>``, and every task is delivered exactly once (never lost, never twice).
The env raises the SandboxError a real sandbox raises (``agentrl.testing.faulty_envs:InfraFailEnv``); the real
sandboxes' kills, OOM and disk are in tests/sandboxes/test_fleet_manager.py."""

from __future__ import annotations

import secrets

import pytest

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.manager.episode import FAILURE_CAUSES
from agentrl.testing.manager_envs import EchoPolicy

ENV = "agentrl.testing.faulty_envs:InfraFailEnv"


def spec(key: str, **kw) -> EpisodeSpec:
    return EpisodeSpec(ENV, {"key": key, **kw})


@pytest.mark.parametrize("cause,fail_at", [("sandbox_lost", 0), ("sandbox_engine", -1), ("sandbox_oom", 1),
                                           ("sandbox_disk", 0)])
async def test_infra_failure_is_retried_in_a_fresh_env_and_counted_once(cause, fail_at):
    run = secrets.token_hex(4)
    cfg = ManagerConfig(max_concurrency=8, infra_retries=2, max_failures_per_group=0)
    async with EnvManager(cfg, EchoPolicy()) as m:
        # fail_times 2 per key: the first try and its first retry fail, the second retry runs; with no failure
        # budget at all (max_failures_per_group 0) only the infrastructure retries can save the task.
        trajs = await m.run_episodes([spec(f"{run}-{i}", cause=cause, fail_at=fail_at, fail_times=2)
                                      for i in range(6)])
        met = m.metrics()
    assert cause in FAILURE_CAUSES
    assert [t.termination for t in trajs] == ["terminated"] * 6, [t.error for t in trajs]
    assert all(t.reward == 1.0 and t.info["t"] == 2 for t in trajs)
    assert len({t.id for t in trajs}) == 6 and all(t.id.endswith(".2") for t in trajs)  # the third attempt won
    assert met["failed"] == 12 and met[f"failures/{cause}"] == 12 and met["infra_retried"] == 12
    assert met["finished"] == 6 and met["replaced"] == 0 and met["failed_groups"] == 0
    assert met["running"] == 0 and met["pending"] == 0


async def test_infra_retries_are_bounded_then_charged_to_the_failure_budget():
    run = secrets.token_hex(4)
    cfg = ManagerConfig(max_concurrency=4, infra_retries=1, max_failures_per_group=1)
    async with EnvManager(cfg, EchoPolicy()) as m:
        # never recovers: 1 infrastructure retry, then 1 charged replacement, then the task is given up
        trajs = await m.run_episodes([spec(f"{run}-dead", fail_times=10**6)])
        ok = await m.run_episodes([spec(f"{run}-ok", fail_times=0)])
        met = m.metrics()
    assert trajs[0].termination == "error" and trajs[0].info["failure_cause"] == "sandbox_lost"
    assert "injected infrastructure failure" in trajs[0].error
    # try 0 (infra retry 1/1), try 1 (charged: replacement 1/1), try 2 (charged: budget spent -> abandoned)
    assert met["failures/sandbox_lost"] == 3 and met["infra_retried"] == 1 and met["replaced"] == 1
    assert met["failed_groups"] == 1
    assert ok[0].termination == "terminated"


async def test_infra_retry_in_groups_never_delivers_a_member_twice():
    run = secrets.token_hex(4)
    cfg = ManagerConfig(max_concurrency=16, num_groups=3, group_size=4, infra_retries=3, max_failures_per_group=0)
    specs = iter([spec(f"{run}-g{i}", fail_times=2, fail_at=1) for i in range(3)])
    async with EnvManager(cfg, EchoPolicy()) as m:
        groups = await m.collect_groups(specs)
        met = m.metrics()
    assert len(groups) == 3
    ids = [t.id for g in groups for t in g.trajectories]
    assert len(ids) == 12 and len(set(ids)) == 12
    assert all(t.termination == "terminated" for g in groups for t in g.trajectories)
    assert met["failures/sandbox_lost"] == 6 and met["infra_retried"] == 6 and met["failed_groups"] == 0


def test_infra_retries_has_bounds():
    for bad in (-1, 101):
        with pytest.raises(ValueError, match="infra_retries"):
            ManagerConfig(infra_retries=bad).validate()
