"""``agentrl eval`` on bridged envs: their ``oracle_policy()`` is the eval's oracle, the ids are named without code."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.testing.procs import running_descendants

pytestmark = pytest.mark.timeout(300)


def test_eval_runs_bridged_envs_with_their_oracles(tmp_path, capsys):
    out = tmp_path / "eval"
    args = ["eval", "--env", "reasoning_gym/leg_counting", "--env", "mcp/Tools-v0", "--policy", "oracle",
            "--limit", "8", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert "16/16 succeeded" in capsys.readouterr().out
    episodes = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted({e["env_id"] for e in episodes}) == ["mcp/Tools-v0", "reasoning_gym/leg_counting"]
    assert all(e["reward"] == 1.0 for e in episodes)
    assert not running_descendants("mcp_demo_server.py")  # every episode's server ended with the eval
