"""``agentrl eval --policy vllm``: the tiny model through the real in-process vLLM engine (CPU), end to end: the
engine starts, every instance gets a trajectory with generated tokens, the report counts them, the engine is shut
down and the command exits 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.engine


def test_tiny_model_end_to_end(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "eval", str(REPO / "configs" / "eval_tiny_vllm.yaml"),
         "--limit", "3", "--out", str(out), "--no-progress", "--name", "tiny",
         "--set", "policy.engine.executor=in_core"],
        cwd=REPO, capture_output=True, text=True, timeout=570,  # < pytest-timeout (600 s): loaded machines are slow
    )
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] and report["total"]["n"] == 9 and report["total"]["errors"] == 0
    assert report["total"]["generated_tokens"] > 0 and report["total"]["prompt_tokens"] > 0
    recs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(recs) == 9
    for rec in recs:
        traj = Trajectory.from_dict(rec["trajectory"])
        traj.validate()
        assert traj.num_generated > 0 and rec["generated_tokens"] == traj.num_generated
        assert all(v == 0 for v, m in zip(traj.versions, traj.loss_mask) if m)  # one fixed weight version
        assert rec["termination"] in ("terminated", "truncated")
        if rec["env"].startswith("agentrl/BFCL"):
            # Single turn: graded, with a reason when wrong.
            assert rec["termination"] == "terminated" and isinstance(rec["info"]["correct"], bool)
            assert rec["info"]["correct"] or rec["info"]["error_type"]
    # Rerunning resumes: nothing left to do, and the engine is not even started.
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", str(REPO / "configs" / "eval_tiny_vllm.yaml"),
                        "--limit", "3", "--out", str(out), "--no-progress"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "0 run now, 9 already done" in r.stdout, r.stderr[-2000:]
