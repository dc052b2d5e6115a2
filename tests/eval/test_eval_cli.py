"""``agentrl eval``: oracle/empty policies over BFCL and ToolUse through the EnvManager, resumability, torn-line
repair, Ctrl-C consistency (a real subprocess and a real SIGINT), predictions, reports and config errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.eval import JsonlLog, SUITES, load_config, run_eval, summarize

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def agentrl_eval(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def read_jsonl(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path} ends in a partial line"
    return [json.loads(line) for line in text.splitlines()]


def slow_env(tmp_path: Path, n: int, delay: float, concurrency: int, extra: str = "") -> tuple[Path, Path, dict]:
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    out = tmp_path / "out"
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(
        "envs:\n"
        "  - id: eval_slow_env:SlowEnv\n"
        "    name: slow\n"
        f"    kwargs: {{n: {n}, delay: {delay}, marker_dir: '{markers}'{extra}}}\n"
        f"concurrency: {concurrency}\nout: '{out}'\nprogress: false\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return cfg, out, env


def test_cli_oracle_and_empty_on_bfcl_and_tool_use(tmp_path):
    out = tmp_path / "oracle"
    r = agentrl_eval("--env", "bfcl", "--env", "tool-use", "--policy", "oracle", "--limit", "8", "--out", str(out),
                     "--no-progress")
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    rows = {row["env"]: row for row in report["rows"]}
    assert set(rows) == set(SUITES["bfcl"]) | {"agentrl/ToolUse-v0"} and len(rows) == 18
    assert all(row["n"] == row["expected"] == 8 and row["accuracy"] == 1.0 for row in rows.values())
    assert report["complete"] and report["total"]["success"] == 144
    md = (out / "report.md").read_text()
    assert "| agentrl/BFCL-parallel-v0 | 8/8 | 8 | 100.0% |" in md
    # The BFCL section: the leaderboard's aggregation of the categories run.
    assert "| multi_turn_miss_func | 8 | 8 | 100.00% |" in md and "Non-Live Overall Acc 100.00%" in r.stdout
    assert report["bfcl"]["qwen_fc"]["leaderboard"]["overall"]["Multi Turn Acc"] == "100.00%"
    recs = read_jsonl(out / "trajectories.jsonl")
    assert len(recs) == 144 and len({(x["env"], x["instance_id"]) for x in recs}) == 144
    assert {x["instance_id"] for x in recs if x["env"] == "agentrl/BFCL-simple-python-v0"} == {
        f"simple_python_{i}" for i in range(8)}
    assert (out / "predictions.jsonl").read_text() == ""  # no SWE env in this suite

    out = tmp_path / "empty"
    r = agentrl_eval("--env", "bfcl", "--policy", "empty", "--limit", "8", "--out", str(out), "--no-progress",
                     "--set", "suite_kwargs.format=prompt")
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    # Calling nothing is right on the irrelevance items only.
    assert report["total"]["n"] == 136 and report["total"]["success"] == 16
    assert set(report["bfcl"]) == {"prompt"}


def test_resume_skips_done_instances_and_extends(tmp_path):
    cfg = load_config(data={"suite": "bfcl-non-live", "limit": 3, "out": str(tmp_path), "progress": False})
    first = run_eval(cfg)
    assert (first.ran, first.skipped) == (21, 0)
    cfg.limit = 5
    second = run_eval(cfg)
    assert (second.ran, second.skipped) == (14, 21)
    third = run_eval(cfg)
    assert (third.ran, third.skipped) == (0, 35)
    recs = read_jsonl(tmp_path / "trajectories.jsonl")
    keys = [(x["env"], x["instance_id"]) for x in recs]
    assert len(keys) == len(set(keys)) == 35
    assert third.report["total"]["n"] == 35 and third.report["total"]["success"] == 35


def test_torn_last_line_is_dropped_and_rerun(tmp_path):
    cfg = load_config(data={"envs": [{"id": "agentrl/BFCL-simple-python-v0"}], "limit": 6, "out": str(tmp_path),
                            "progress": False})
    run_eval(cfg)
    path = tmp_path / "trajectories.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    # A kill in the middle of the last write: the record is half there, without its newline.
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    again = run_eval(cfg)
    assert (again.ran, again.skipped) == (1, 5)
    recs = read_jsonl(path)
    assert sorted(x["instance_id"] for x in recs) == sorted(f"simple_python_{i}" for i in range(6))

    log = JsonlLog(tmp_path / "x.jsonl")
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n{"a": 2, "b":')
    assert log.open() == [{"a": 1}] and log.dropped_partial
    log.append({"a": 3})
    log.close()
    assert read_jsonl(tmp_path / "x.jsonl") == [{"a": 1}, {"a": 3}]


def test_sigint_leaves_consistent_files_and_rerun_completes(tmp_path):
    n = 120
    # Episodes 8.. are held until the gate opens (after the SIGINT landed), so the run cannot finish first.
    gate = tmp_path / "gate"
    cfg, out, env = slow_env(tmp_path, n=n, delay=0.0, concurrency=4, extra=f", hold_from: 8, gate: '{gate}'")
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "eval", str(cfg)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    traj = out / "trajectories.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not traj.exists() or len(traj.read_text().splitlines()) < 8):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    recs = read_jsonl(traj)
    preds = read_jsonl(out / "predictions.jsonl")
    assert 8 <= len(recs) < n
    # Every recorded instance has exactly one prediction, and nothing else has one.
    assert sorted(p["instance_id"] for p in preds) == sorted(r["instance_id"] for r in recs)
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and report["total"]["n"] == len(recs)
    # Every env that was opened was closed (cancelled episodes included).
    markers = {p.name for p in (tmp_path / "markers").iterdir()}
    opened = {m.split(".")[0] for m in markers if m.endswith(".open")}
    assert opened and opened == {m.split(".")[0] for m in markers if m.endswith(".closed")}

    gate.touch()
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", str(cfg)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    recs = read_jsonl(traj)
    preds = read_jsonl(out / "predictions.jsonl")
    ids = [x["instance_id"] for x in recs]
    assert len(ids) == len(set(ids)) == n
    assert sorted(p["instance_id"] for p in preds) == sorted(ids)
    assert all(p["model_patch"] == f"patch {p['instance_id'].split('-')[1]}\n" and p["model_name_or_path"] == "oracle"
               for p in preds)
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] and report["total"]["success"] == n


def test_predictions_repaired_on_resume(tmp_path):
    cfg_path, out, env = slow_env(tmp_path, n=6, delay=0.0, concurrency=2)
    sys.path.insert(0, str(HERE))
    try:
        cfg = load_config(cfg_path)
        run_eval(cfg)
        pred = out / "predictions.jsonl"
        lines = pred.read_text().splitlines(keepends=True)
        # A lost prediction, a duplicate, and one for an instance with no trajectory record.
        pred.write_text(lines[1] + lines[1] + lines[2] + lines[3] + lines[4] + lines[5]
                        + json.dumps({"instance_id": "ghost", "model_name_or_path": "x", "model_patch": ""}) + "\n")
        again = run_eval(cfg)
    finally:
        sys.path.remove(str(HERE))
    assert again.ran == 0
    ids = sorted(p["instance_id"] for p in read_jsonl(pred))
    assert ids == sorted(f"slow-{i}" for i in range(6))


def test_errors_are_results_and_retry_errors_reruns_them(tmp_path):
    cfg_path, out, _ = slow_env(tmp_path, n=4, delay=0.0, concurrency=2)
    up = tmp_path / "up"
    sys.path.insert(0, str(HERE))
    try:
        cfg = load_config(cfg_path)
        cfg.envs[0].kwargs["fail_unless"] = str(up)
        first = run_eval(cfg)
        assert first.ran == 4 and first.report["total"]["errors"] == 4 and first.report["total"]["success"] == 0
        up.touch()
        assert run_eval(cfg).ran == 0  # errors are results unless asked otherwise
        cfg.retry_errors = True
        again = run_eval(cfg)
    finally:
        sys.path.remove(str(HERE))
    assert again.ran == 4 and again.report["total"]["success"] == 4 and again.report["total"]["errors"] == 0
    preds = read_jsonl(out / "predictions.jsonl")
    assert sorted(p["instance_id"] for p in preds) == [f"slow-{i}" for i in range(4)]
    assert all(p["model_patch"] for p in preds)  # the retried results, not the errored ones


def test_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("suite: bfcl\nconcurency: 4\n")
    r = agentrl_eval(str(bad))
    assert r.returncode == 2 and "concurency" in r.stderr and "did you mean 'concurrency'" in r.stderr
    r = agentrl_eval("--env", "agentrl/NoSuchEnv-v0", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "agentrl/NoSuchEnv-v0" in r.stderr
    r = agentrl_eval("--env", "bfcl", "--policy", "remote", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "endpoint" in r.stderr
    with pytest.raises(Exception, match="limit"):
        load_config(data={"suite": "bfcl", "limit": 0})


def test_shipped_configs_load():
    for path in sorted((REPO / "configs").glob("eval_*.yaml")):
        cfg = load_config(path)
        assert cfg.entries(), path


def test_summarize_counts_errors_as_failures():
    recs = [
        {"env": "a", "instance_id": "1", "success": True, "reward": 1.0, "termination": "terminated", "time_s": 1.0,
         "prompt_tokens": 10, "generated_tokens": 5},
        {"env": "a", "instance_id": "2", "success": False, "reward": 0.0, "termination": "error", "time_s": 3.0},
    ]
    rep = summarize(recs, {"a": 3, "b": 1})
    a = rep["rows"][0]
    assert (a["n"], a["success"], a["errors"], a["accuracy"], a["mean_time_s"]) == (2, 1, 1, 0.5, 2.0)
    assert rep["rows"][1]["n"] == 0 and rep["complete"] is False
    assert rep["total"]["prompt_tokens"] == 10 and rep["total"]["generated_tokens"] == 5


def test_a_policy_whose_engine_died_stops_the_run_and_the_same_command_finishes_it(tmp_path, monkeypatch):
    """An engine core killed mid-eval turned every instance left into an error result within seconds (379 of 400),
    which a rerun then skipped as done. Now the run stops at the first episode its death fails, records none of
    those, and the same call runs the rest."""
    import agentrl.eval.run as run_mod
    from agentrl.eval.policies import BuiltPolicy
    from agentrl.policy import ScriptedPolicy

    cfg_path, out, _ = slow_env(tmp_path, n=30, delay=0.0, concurrency=4)
    state = {"calls": 0, "dead": False}

    def act(conversation, meta):
        state["calls"] += 1
        if state["calls"] > 5:
            state["dead"] = True
        if state["dead"]:
            raise RuntimeError("EngineDeadError: EngineCore encountered an issue")
        return "done"

    def dead():
        return "the engine core exited" if state["dead"] else None

    monkeypatch.setattr(run_mod, "build_policy", lambda cfg, kwargs: BuiltPolicy(ScriptedPolicy(act), None, dead))
    sys.path.insert(0, str(HERE))
    try:
        cfg = load_config(cfg_path)
        first = run_eval(cfg)
        assert first.stopped == "the engine core exited"
        records = read_jsonl(out / "trajectories.jsonl")
        assert 0 < len(records) < 30 and all(r["termination"] != "error" for r in records)
        state.update(calls=-1000, dead=False)
        again = run_eval(cfg)
    finally:
        sys.path.remove(str(HERE))
    assert again.stopped is None and again.ran == 30 - len(records) and again.skipped == len(records)
    assert again.report["total"]["n"] == 30 and again.report["total"]["errors"] == 0
