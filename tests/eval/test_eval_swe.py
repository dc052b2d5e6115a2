"""``agentrl eval`` on the SWE env (real docker sandboxes): gold patches resolve, empty patches do not, the
predictions file loads with swebench's own loaders, errored episodes give empty predictions and exit status 1, a
gold patch that does not apply is reported as such, and SWE flags are honoured or refused;
``agentrl eval validate-swe`` runs the SWE validator."""

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


def test_swe_oracle_resolves_and_empty_does_not(tmp_path, swebench_check):
    report = _eval(tmp_path / "oracle", "oracle")
    assert report["total"]["n"] == 2 and report["total"]["success"] == 2
    preds = [json.loads(x) for x in (tmp_path / "oracle" / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in preds) == sorted(IDS)
    assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in preds)
    assert all(p["model_name_or_path"] == "oracle-model" and p["model_patch"].startswith("diff --git") for p in preds)
    recs = [json.loads(x) for x in (tmp_path / "oracle" / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["info"]["resolved"] is True and r["termination"] == "terminated" for r in recs)
    from agentrl.envs.swe.repos import SUITE_INSTANCES

    assert sorted(swebench_check(tmp_path / "oracle" / "predictions.jsonl", SUITE_INSTANCES)["to_run"]) == sorted(IDS)

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


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_errored_episodes_exit_1_with_empty_predictions(tmp_path):
    out = tmp_path / "err"
    r = _run("--env", "swe", "--ids", *IDS, "--image", "agentrl-no-such-image:latest", "--policy", "oracle",
             "--out", str(out), "--no-progress")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "2 episode(s) ended in an error" in r.stderr
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in preds) == sorted(IDS) and all(p["model_patch"] == "" for p in preds)
    recs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["termination"] == "error" and "agentrl-no-such-image" in r["error"] for r in recs)


def test_gold_patch_that_does_not_apply_is_reported_as_such(tmp_path):
    from agentrl.envs.swe.repos import SUITE_INSTANCES

    inst = next(json.loads(x) for x in SUITE_INSTANCES.read_text().splitlines() if IDS[0] in x)
    inst["patch"] = inst["patch"].replace("\n ", "\n X", 1)  # a context line that is not in the file
    (tmp_path / "broken.jsonl").write_text(json.dumps(inst) + "\n")
    out = tmp_path / "o"
    r = _run("--env", "swe", "--instances", str(tmp_path / "broken.jsonl"), "--policy", "oracle", "--out", str(out),
             "--no-progress")
    assert r.returncode == 1, r.stderr[-2000:]
    (rec,) = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert rec["termination"] == "error" and "gold patch does not apply" in rec["error"], rec["error"]


def test_swe_flags_are_refused_where_they_do_not_apply(tmp_path):
    r = _run("--env", "tool-use", "--instances", "x.jsonl", "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "--instances: these configure the SWE env" in r.stderr
    r = _run("--env", "swe", "--episodes", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "--episodes: only for `agentrl eval validate-swe`" in r.stderr
    r = _run("validate-swe", "--policy", "vllm")
    assert r.returncode == 2 and "validate-swe does not take --policy" in r.stderr
    r = _run("--env", "swe", "--env-specs", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "c"))
    assert r.returncode == 2 and "missing.yaml" in r.stderr
