"""The training controller end to end: real Ray, real CPU vLLM engine, real trainer actor, real env manager."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from agentrl.config import ConfigError
from agentrl.controller.run import RunFiles, load_config

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
# Small and fast: 2 groups of 2 per step, no warm start, short evals, the model in the engine-core process (the
# engine starts sooner; test_examples.py's run of examples/train_openai_agent.py trains with vLLM's default).
SMALL = ["steps=3", "manager.num_groups=2", "manager.group_size=2", "warm_start.episodes=0", "eval.episodes=4",
         "rollout.max_turns=3", "manager.max_turns=3", "checkpoint_every=1", "progress=false", "tensorboard=true",
         "trainer.record_logprobs=2", "engine.executor=in_core"]


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
    with pytest.raises(ConfigError, match=r"manager.batch_size: unknown key \(a training run's batch is num_groups \* group_size"):
        load_config(QUICKSTART, ["manager.batch_size=12"])
    # The env's own kwargs are checked at load too (by making one env), not minutes later in every episode; a
    # library that validates with assert (reasoning-gym) is reported like one that raises ValueError.
    with pytest.raises(ConfigError, match=r"env: cannot make 'agentrl/FrozenLake-v0' with kwargs \{.*'size': -1.*\}: "
                                          r"ValueError: FrozenLakeEnv: size must be"):
        load_config(QUICKSTART, ["env.kwargs.size=-1"])
    with pytest.raises(ConfigError, match=r"env: cannot make .*TypeError: .*unexpected keyword argument 'bogus'"):
        load_config(QUICKSTART, ["env.kwargs.bogus=1"])
    with pytest.raises(ConfigError, match=r"env: cannot make 'reasoning_gym/chain_sum' .*AssertionError: min_terms"):
        load_config(QUICKSTART, ["env.id=reasoning_gym/chain_sum", "env.kwargs={min_terms: 0}"])


def test_trainer_scores_at_the_rollout_temperature():
    # Unset, the trainer's temperature is derived from the rollout's (it used to stay 1.0: at rollout 0.7 a
    # tenth of the tokens hit the IS cap with identical weights).
    assert load_config(QUICKSTART, ["rollout.temperature=0.7"]).trainer_config().temperature == 0.7
    assert load_config(QUICKSTART, ["rollout.temperature=0.7", "trainer.temperature=0.7"]).trainer_config().temperature == 0.7
    cfg = load_config(QUICKSTART, ["rollout.temperature=0.7"])
    assert cfg.trainer.temperature == 1.0  # derived where it is used, never written back into the config
    with pytest.raises(ConfigError, match=r"trainer.temperature \(0.5\) must equal rollout.temperature \(0.7\)"):
        load_config(QUICKSTART, ["rollout.temperature=0.7", "trainer.temperature=0.5"])
    with pytest.raises(ConfigError, match="rollout.temperature must be > 0 for training"):
        load_config(QUICKSTART, ["rollout.temperature=0"])
    with pytest.raises(ConfigError, match=r"rollout.top_p \(0.9\) must be 1.0"):
        load_config(QUICKSTART, ["rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match="rollout.top_k"):
        load_config(QUICKSTART, ["rollout.top_k=20"])


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


# α = 0 here, with two engine replicas fed by the trainer's gloo broadcast through vLLM's weight-transfer API (never
# through the driver), full weights or, with trainer.lora, the adapter alone. The other path a training run can take
# on the CPU, one engine in the driver, runs at α = 1 in the SIGKILL/resume test below (the same checks per step) and
# at α = 0 in test_consistency.py (20 steps, KL(μ‖π) < 1e-6 at every one).
@pytest.mark.parametrize("lora", [False, True])
def test_training_runs_with_bounded_staleness(tmp_path, lora):
    run_dir = tmp_path / "run"
    engine = ["engine.replicas=2", "engine.weight_sync=gloo"] + (["trainer.lora.rank=16"] if lora else [])
    # fp32 (the tiny model's dtype), sampling at temperature 0.7: the trainer derives its temperature from it
    p = run_cli([str(QUICKSTART), *SMALL, *engine, "async_ratio=0", "rollout.temperature=0.7", f"run_dir={run_dir}"])
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-4000:]
    r = rows(run_dir)
    assert [x["step"] for x in r] == [1, 2, 3]
    check_step_rows(r, alpha=0, path="broadcast")
    assert all(x["train/staleness/max"] == 0 for x in r)
    # After every weight sync the trainer's log-probs of the engine's sampled tokens equal the engine's
    # (steps 2 and 3 train on tokens of weights the engine got from the trainer).
    assert all(x["train/mismatch/kl_k3"] < 1e-6 for x in r), [x["train/mismatch/kl_k3"] for x in r]
    if lora:  # every sync broadcast the adapter alone: exactly the bytes of the adapter a checkpoint holds
        adapter = load_file(str(RunFiles(run_dir).latest_checkpoint()[1] / "model" / "adapter_model.safetensors"))
        assert {x["weights/bytes"] for x in r} == {float(sum(t.numel() * t.element_size() for t in adapter.values()))}
    check_run_files(run_dir, steps=3)
    check_viewer_files(run_dir, steps=3, per_step=4, alpha=0)


def check_step_rows(r: list[dict], alpha: int, path: str) -> None:
    for x in r:
        # The trainer saw no token older than alpha versions (alpha = 0: strictly on-policy).
        assert x["train/staleness/max"] <= alpha, x
        assert x["train/batch/num_seqs"] == 4
        assert 0.0 <= x["time/trainer_idle_frac"] <= 1.0
        assert x["manager/dropped_stale"] == 0  # staleness is bounded by the batch schedule, not by cancelling
        # The agent loop's template checks, as run totals: the tiny model's template never drifts.
        assert x["chat/sessions"] >= 4 and x["chat/drift_handover"] == x["chat/drift_env"] == 0.0
        # How the weights travelled, and what it cost: every step syncs (sync_every 1).
        assert x["weights/path"] == path and x["weights/bytes"] > 100_000 and x["weights/sync_s"] > 0, x


def check_run_files(run_dir: Path, steps: int) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_before"]["episodes"] == 4 and summary["eval_after"]["episodes"] == 4
    step, _, state = RunFiles(run_dir).latest_checkpoint()
    assert step == steps
    # a checkpoint carries the evaluation before RL: a resumed run reports it and does not evaluate again
    assert state["history"]["eval_before"] == summary["eval_before"]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))


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

    in_flight = json.loads(files.checkpoint_dir(killed_at).with_suffix(".json").read_text())["open_tasks"]
    assert in_flight  # alpha = 1: the next batches were running when the checkpoint was written

    p2 = run_cli(["--resume", str(run_dir)])
    out, _ = p2.communicate(timeout=600)
    assert p2.returncode == 0, out[-4000:]
    assert f"resumed from {files.checkpoint_dir(killed_at)}" in out
    r = rows(run_dir)
    steps = [x["step"] for x in r]
    assert steps == [1, 2, 3, 4, 5], steps  # nothing repeated, nothing skipped
    check_step_rows(r, alpha=1, path="in_driver")
    check_run_files(run_dir, steps=5)
    state = json.loads((files.checkpoint_dir(5) / "trainer_state.json").read_text())
    assert state["version"] == 5 and state["optimizer_steps"] == 5
    check_viewer_files(run_dir, steps=5, per_step=4, alpha=1)
    # Every task was trained exactly once or is still open at the end: none skipped, none duplicated across the
    # SIGKILL (the tasks in flight at the checkpoint were replayed, those trained after it were rolled back).
    trained = [i for x in r for i in x["tasks"]]
    assert len(trained) == len(set(trained)) == 5 * 2
    final = json.loads(files.checkpoint_dir(5).with_suffix(".json").read_text())
    assert not set(trained) & set(final["open_tasks"])
    assert set(trained) | set(final["open_tasks"]) == set(range(final["next_task"]))
    assert set(in_flight) <= set(trained) | set(final["open_tasks"])


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_run_that_stops_on_an_error_says_what_it_keeps_and_how_to_go_on(tmp_path, monkeypatch, capsys, checkpoint):
    """An engine core killed mid-run (the OOM killer) ended ``agentrl train`` in a 60-line traceback of vLLM's
    internals that said nothing of the run dir or of ``--resume``."""
    import agentrl.controller.run as run_mod
    from agentrl.cli import main

    run_dir = tmp_path / "run"

    async def dies(cfg, *, resume=False, policy=None):
        files = run_mod.RunFiles(cfg.run_dir)
        files.root.mkdir(parents=True)
        for step in (1, 2, 3):
            files.append_metrics({"step": step})
        if checkpoint:
            (files.checkpoint_dir(2)).mkdir(parents=True)
            (files.checkpoint_dir(2) / "trainer_state.json").write_text("{}")
            files.checkpoint_dir(2).with_suffix(".json").write_text(json.dumps({"step": 2}))
        raise RuntimeError("EngineCore encountered an issue.\nSee stack trace (above) for the root cause.")

    monkeypatch.setattr(run_mod, "train", dies)
    assert main(["train", str(QUICKSTART), f"run_dir={run_dir}", "progress=false"]) == 1
    err = capsys.readouterr().err
    assert f"the run stopped: RuntimeError: EngineCore encountered an issue. (traceback in {run_dir / 'error.log'})" in err
    assert "has metrics up to step 3" in err
    if checkpoint:
        assert f"continue from the checkpoint of step 2 with: agentrl train --resume {run_dir}" in err
    else:
        assert "no checkpoint yet" in err
    log = (run_dir / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "in dies" in log and "root cause" in log

    async def refuses(cfg, *, resume=False, policy=None):  # what train() finds before it starts: still exit 2
        raise ConfigError(f"{cfg.run_dir}: run directory already has metrics.jsonl; use --resume or another run_dir")

    monkeypatch.setattr(run_mod, "train", refuses)
    (run_dir / "error.log").unlink()
    assert main(["train", str(QUICKSTART), f"run_dir={run_dir}", "progress=false"]) == 2
    assert "config error: " in capsys.readouterr().err and not (run_dir / "error.log").exists()


async def test_work_that_waits_on_a_dead_engine_ends_with_engine_dead():
    """A sync run whose engine core was killed mid-rollout waited forever: every episode failed at once and the
    manager kept replacing the failed groups. ``unless_dead`` ends the wait once the engine says it is dead."""
    import asyncio

    from agentrl.inference.base import EngineDead, unless_dead

    class Engine:
        why = None

        def dead(self):
            return self.why

    engine, cancelled = Engine(), asyncio.Event()

    async def waits_for_episodes():
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    async def dies_soon():
        await asyncio.sleep(0)
        engine.why = "the vLLM engine core exited"

    asyncio.ensure_future(dies_soon())
    with pytest.raises(EngineDead, match="the vLLM engine core exited"):
        await unless_dead(engine, waits_for_episodes(), poll_s=0.01)
    assert cancelled.is_set()
    assert await unless_dead(Engine(), asyncio.sleep(0, result=7)) == 7  # a live engine: the work's own result
