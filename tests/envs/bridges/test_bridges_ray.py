"""Bridged envs in a real Ray env-worker actor (another process, running uvloop): family ids resolve there, MCP
servers start and end there."""

from __future__ import annotations

import pytest
import ray

import agentrl
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


async def test_reasoning_gym_and_mcp_envs_run_in_a_ray_worker(ray_session):
    legs, mcp = agentrl.make("reasoning_gym/leg_counting").unwrapped, agentrl.make("mcp/Tools-v0").unwrapped
    oracles = {"reasoning_gym/leg_counting": legs.oracle_policy(), "mcp/Tools-v0": mcp.oracle_policy()}

    def act(conversation, meta):
        return oracles[meta.env_id].fn(conversation, meta)

    specs = [EpisodeSpec(env_id, seed=s) for env_id in oracles for s in range(8)]
    async with EnvManager(ManagerConfig(workers=1), ScriptedPolicy(act)) as m:
        trajs = await m.run_episodes(specs)
        stats = await m.worker_stats()
        failed = list(m.failed)
    assert [t.error for t in failed] == []  # no attempt failed (before, uvloop refused concurrent server spawns)
    assert [t.error for t in trajs] == [None] * 16 and all(t.reward == 1.0 for t in trajs)
    assert [t.info["task_key"] for t in trajs[:8]] == [legs.reset(seed=s)[1]["task_key"] for s in range(8)]
    assert stats[0]["opened"] == stats[0]["closed"] == 16
