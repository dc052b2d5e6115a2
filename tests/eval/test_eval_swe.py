"""``agentrl eval`` on the SWE env (real docker sandboxes): gold patches resolve, empty patches do not, and the
predictions file is SWE-bench's format; ``agentrl eval validate-swe`` runs the SWE validator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Two instances: enough to check one prediction per instance; each episode costs a few seconds of docker work.
IDS = ["agentrl-suite__intervals-1", "agentrl-suite__romanum-1"]

pytestmark = pytest.mark.docker


def _eval(out: Path, policy: str) -> dict:
    cfg = out.parent / f"{policy}.yaml"
    cfg.write_text(
        "envs:\n  - id: agentrl/SWE-v0\n"
        f"    kwargs: {{sandbox: {{backend: docker}}, instance_ids: {json.dumps(IDS)}}}\n"
        f"policy: {{kind: {policy}, name: {policy}-model}}\nout: '{out}'\nconcurrency: 2\nprogress: false\n"
    )
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", str(cfg)], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def test_swe_oracle_resolves_and_empty_does_not(tmp_path):
    report = _eval(tmp_path / "oracle", "oracle")
    assert report["total"]["n"] == 2 and report["total"]["success"] == 2
    preds = [json.loads(x) for x in (tmp_path / "oracle" / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in preds) == sorted(IDS)
    assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in preds)
    assert all(p["model_name_or_path"] == "oracle-model" and p["model_patch"].startswith("diff --git") for p in preds)
    recs = [json.loads(x) for x in (tmp_path / "oracle" / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["info"]["resolved"] is True and r["termination"] == "terminated" for r in recs)

    report = _eval(tmp_path / "empty", "empty")
    assert report["total"]["n"] == 2 and report["total"]["success"] == 0
    preds = [json.loads(x) for x in (tmp_path / "empty" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 2 and all(p["model_patch"] == "" for p in preds)


def test_validate_swe_command(tmp_path):
    out = tmp_path / "v.json"
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "validate-swe", "--ids", IDS[0],
                        "--backend", "docker", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(x["instance_id"], x["ok"]) for x in rows] == [(IDS[0], True)]
