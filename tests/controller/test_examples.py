"""examples/train_custom_env.py: a user's own env and reward, trained through the Python API (real engine, Ray)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_train_custom_env_example(tmp_path):
    run_dir = tmp_path / "linewalk"
    # A smaller warm start and evaluation than the example's own (CI time); the same code path.
    small = ["warm_start.episodes=96", "warm_start.steps=8", "eval.episodes=16", "manager.num_groups=4",
             "engine.executor=in_core"]
    p = subprocess.run([sys.executable, "examples/train_custom_env.py", "--steps", "2", "--run-dir", str(run_dir),
                        *small], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_before"]["episodes"] == 16 and 0.0 <= summary["eval_after"]["reward"] <= 1.0
    # The warm start imitated the custom env's scripted expert (its demonstrations were scored by the custom reward).
    assert json.loads((run_dir / "warmstart" / "warmstart.json").read_text())["demonstrations"] == 96


@pytest.mark.timeout(1500)  # engine + Ray trainer start and 2 steps: 8 min at load 20-30
def test_train_openai_agent_example(tmp_path):
    """examples/train_openai_agent.py: a user's own openai-client agent loop trained through the gateway."""
    run_dir = tmp_path / "openai-agent"
    p = subprocess.run([sys.executable, "examples/train_openai_agent.py", "--steps", "2", "--run-dir", str(run_dir)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1400,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # every trained trajectory came through the gateway: requests, sampled tokens and its metrics are logged
        assert r["gateway/requests"] > 0 and r["gateway/sampled_tokens"] > 0 and r["train/batch/loss_tokens"] > 0
        assert 0.0 <= r["gateway/drift_rate"] <= 1.0 and r["gateway/segments_per_session"] >= 1.0
        assert "tool/parse_error_rate" in r and 0.0 <= r["reward"] <= 1.0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
