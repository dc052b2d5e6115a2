"""The training controller end to end: real Ray, real CPU vLLM engine, real trainer actor, real env manager."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.config import ConfigError
from agentrl.pipeline import RunFiles, load_config

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
# Small and fast: 2 groups of 2 per step, no warm start, short evals.
SMALL = ["steps=3", "manager.num_groups=2", "manager.group_size=2", "warm_start.episodes=0", "eval.episodes=4",
         "rollout.max_turns=3", "manager.max_turns=3", "checkpoint_every=1", "progress=false", "tensorboard=true",
         "trainer.record_logprobs=2"]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"quickstart.yaml: trainer.loss.nmae: unknown key \(did you mean 'name'\?\)"):
        load_config(QUICKSTART, ["trainer.loss.nmae=ppo"])
    with pytest.raises(ConfigError, match="sync_every must be in"):
        load_config(QUICKSTART, ["async_ratio=0", "sync_every=2"])
    with pytest.raises(ConfigError, match="unknown env id 'agentrl/FrozenLak-v0'"):
        load_config(QUICKSTART, ["env.id=agentrl/FrozenLak-v0"])
    with pytest.raises(ConfigError, match="set async_ratio at the top level"):
        load_config(QUICKSTART, ["manager.async_ratio=1"])


def kill_session(sid: int) -> None:
    """SIGKILLs every process of session ``sid`` (the driver was started in a new session), leaving other Ray
    clusters on the machine alone."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # fields after the command: state, ppid, pgrp, session
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


def run_cli(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


@pytest.mark.parametrize("alpha", [0, 1])
def test_training_runs_with_bounded_staleness(tmp_path, alpha):
    run_dir = tmp_path / f"run{alpha}"
    p = run_cli([str(QUICKSTART), *SMALL, f"async_ratio={alpha}", f"run_dir={run_dir}"])
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-4000:]
    r = rows(run_dir)
    assert [x["step"] for x in r] == [1, 2, 3]
    for x in r:
        # The trainer saw no token older than alpha versions (alpha = 0: strictly on-policy).
        assert x["train/staleness/max"] <= alpha, x
        assert x["train/batch/num_seqs"] == 4
        assert 0.0 <= x["time/trainer_idle_frac"] <= 1.0
    if alpha == 0:
        assert all(x["train/staleness/max"] == 0 for x in r)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_before"]["episodes"] == 4 and summary["eval_after"]["episodes"] == 4
    assert RunFiles(run_dir).latest_checkpoint()[0] == 3
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    check_viewer_files(run_dir, steps=3, per_step=4, alpha=alpha)


def check_viewer_files(run_dir: Path, steps: int, per_step: int, alpha: int) -> None:
    """What ``agentrl view`` shows: every step's trained trajectories, and the trainer's log-probs of 2 of them."""
    from agentrl.viewer.data import LogprobIndex, TrajectoryIndex

    idx = TrajectoryIndex(run_dir / "trajectories.jsonl")
    idx.refresh()
    assert idx.problems.count == 0 and not idx.problems.pending_tail
    assert list(idx.steps) == [s for s in range(1, steps + 1) for _ in range(per_step)]  # no step repeated
    assert 0 <= max(idx.staleness) <= alpha
    lp = LogprobIndex(run_dir / "trainer_logprobs.jsonl")
    lp.refresh()
    assert len(lp.where) == 2 * steps and lp.problems.count == 0
    for tid in lp.where:
        rec, row = lp.get(tid), idx.by_id[tid]
        traj, _ = idx.record(row)
        assert rec["version"] == rec["step"] - 1 == idx.steps[row] - 1
        assert len(rec["logprobs"]) == len(traj["token_ids"]) - 1 and all(x <= 0 for x in rec["logprobs"])


def test_sigkill_then_resume_repeats_and_skips_no_step(tmp_path):
    run_dir = tmp_path / "run"
    args = [str(QUICKSTART), *SMALL, "steps=5", "async_ratio=1", f"run_dir={run_dir}"]
    p = run_cli(args)
    files = RunFiles(run_dir)
    deadline = time.time() + 480
    try:
        while time.time() < deadline:
            latest = files.latest_checkpoint()
            if latest is not None and latest[0] >= 2:
                break
            if p.poll() is not None:
                pytest.fail(f"training exited early: {p.stdout.read()[-4000:]}")
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint of step 2 within the deadline")
    finally:
        kill_session(p.pid)  # the driver and everything it started (Ray, the engine core), as a crash would
        p.wait()
    killed_at = files.latest_checkpoint()[0]
    assert killed_at < 5

    p2 = run_cli(["--resume", str(run_dir)])
    out, _ = p2.communicate(timeout=600)
    assert p2.returncode == 0, out[-4000:]
    assert f"resumed from {files.checkpoint_dir(killed_at)}" in out
    steps = [x["step"] for x in rows(run_dir)]
    assert steps == [1, 2, 3, 4, 5], steps  # nothing repeated, nothing skipped
    state = json.loads((files.checkpoint_dir(5) / "trainer_state.json").read_text())
    assert state["version"] == 5 and state["optimizer_steps"] == 5
    check_viewer_files(run_dir, steps=5, per_step=4, alpha=1)
