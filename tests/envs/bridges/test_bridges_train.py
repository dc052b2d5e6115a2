"""``agentrl rollout`` on bridged envs (a reasoning-gym dataset, the MCP demo server's tools) and ``agentrl train`` on
the reasoning-gym one, at a tiny size: the real CPU vLLM engine, Ray and the trainer, the env ids named without code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.testing.procs import running_descendants

pytestmark = pytest.mark.timeout(2400)

ROOT = Path(__file__).resolve().parents[3]
BRIDGED = [("reasoning_gym/leg_counting", {}), ("mcp/Tools-v0", {"checker": "mcp:check_answer"})]


def _cli(*args: str, timeout: float = 1800) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-m", "agentrl.cli", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p.stdout


# Rollout on the MCP env only: the reasoning-gym env's rollout is the one the train run below makes.
@pytest.mark.parametrize("env_id,kwargs", BRIDGED[1:])
def test_rollout_on_a_bridged_env(tmp_path, env_id, kwargs):
    config = tmp_path / "rollout.yaml"
    config.write_text(yaml.safe_dump({"env": env_id, "env_kwargs": kwargs, "episodes": 4, "out": str(tmp_path / "t.jsonl"),
                                      "progress": False, "rollout": {"max_tokens_per_turn": 16, "max_turns": 2},
                                      "engine": {"executor": "in_core"}}))
    _cli("rollout", "--config", str(config))
    episodes = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and {e["env_id"] for e in episodes} == {env_id}
    assert all(e["termination"] != "error" for e in episodes), [e.get("error") for e in episodes]
    assert all(len(e["token_ids"]) > 0 for e in episodes)
    if env_id.startswith("mcp/"):  # the server's tools reached the prompt the model saw
        assert all("lookup" in json.dumps(e["messages"][0]) for e in episodes)
    assert not running_descendants("mcp_demo_server.py")


# Train on the reasoning-gym env only: the MCP env's train run was not seen to finish on this round's machine
# (load 50-1,300); its rollout above runs the same manager and agent loop.
@pytest.mark.parametrize("env_id,kwargs", BRIDGED[:1])
def test_train_on_a_bridged_env(tmp_path, env_id, kwargs):
    config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    config["env"] = {"id": env_id, "kwargs": kwargs}
    config.update(run_dir=str(tmp_path / "run"), steps=2, checkpoint_every=2, progress=False)
    config["manager"].update(num_groups=2, group_size=2, max_turns=2)
    config["rollout"].update(max_turns=2, max_tokens_per_turn=16)
    config["warm_start"]["episodes"] = 0
    config.setdefault("engine", {})["executor"] = "in_core"
    config["eval"]["episodes"] = 4
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    _cli("train", str(path))
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/batch/num_seqs"] == 4 for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_before"]["episodes"] == 4 and summary["eval_after"]["episodes"] == 4
    trained = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert {t["trajectory"]["env_id"] for t in trained} == {env_id} and len(trained) == 8  # 2 steps x 4
