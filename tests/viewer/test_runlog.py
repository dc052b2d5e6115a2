"""What a training run writes for the viewer: crash-safe step logs of trajectories and the trainer's log-prob
records (agentrl.controller.runlog, agentrl.trainer.records)."""

import json
import logging
from pathlib import Path

import pytest

from agentrl.controller.runlog import TRAINER_LOGPROBS, TRAJECTORIES, TrajectoryLog, TrajectoryLogConfig, summarize
from agentrl.trajectory import Trajectory


def traj(i: int, n: int = 6, versions: tuple[int, ...] = (3,), group: str = "g0", **kw) -> Trajectory:
    gen = len(versions)
    return Trajectory(
        id=f"{group}.{i}", group_id=group, env_id="agentrl/FrozenLake-v0",
        token_ids=list(range(10, 10 + n + gen)), loss_mask=[0] * n + [1] * gen,
        logprobs=[0.0] * n + [-0.5] * gen, versions=[-1] * n + list(versions), prompt_len=n,
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}], rewards=[1.0], reward=1.0,
        num_turns=1, **kw)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_lines_carry_step_summary_and_the_whole_trajectory(tmp_path):
    log = TrajectoryLog(tmp_path).open(0)
    t = traj(0, versions=(2, 3))
    assert log.write_trajectories(5, [t]) == 1
    log.close()
    raw = (tmp_path / TRAJECTORIES).read_text()
    assert raw.startswith('{"step": 5, "summary": {')  # the viewer reads the summary from the line's head
    (rec,) = lines(tmp_path / TRAJECTORIES)
    assert Trajectory.from_dict(rec["trajectory"]) == t
    s = rec["summary"]
    assert (s["min_version"], s["max_version"], s["staleness"]) == (2, 3, 5 - 1 - 2)
    assert (s["tokens"], s["generated"], s["turns"], s["reward"]) == (8, 2, 1, 1.0)


def test_summary_of_a_damaged_record_has_no_exception():
    s = summarize({"token_ids": "x", "loss_mask": [1, "a"], "versions": [None, 2], "reward": "NaN", "num_turns": True})
    assert s["tokens"] == 0 and s["reward"] is None and s["turns"] is None and s["min_version"] is None


def test_resume_drops_later_steps_and_a_torn_tail(tmp_path):
    log = TrajectoryLog(tmp_path).open(0)
    for step in (1, 2, 3):
        log.write_trajectories(step, [traj(0), traj(1)])
        log.write_logprobs(step, [{"trajectory_id": "g0.0", "version": step - 1, "logprobs": [-1.0] * 7}])
    log.close()
    with open(tmp_path / TRAJECTORIES, "ab") as f:
        f.write(b'{"step": 4, "summary": {"id": "g0.0"')  # a kill in the middle of a write
    TrajectoryLog(tmp_path).open(2).close()  # resumed from the checkpoint of step 2
    assert [r["step"] for r in lines(tmp_path / TRAJECTORIES)] == [1, 1, 2, 2]
    assert [r["step"] for r in lines(tmp_path / TRAINER_LOGPROBS)] == [1, 2]
    log = TrajectoryLog(tmp_path).open(2)
    log.write_trajectories(3, [traj(0)])
    log.close()
    assert [r["step"] for r in lines(tmp_path / TRAJECTORIES)] == [1, 1, 2, 2, 3]


def test_fresh_start_empties_leftovers_and_keeps_unparseable_lines_of_kept_steps(tmp_path):
    (tmp_path / TRAJECTORIES).write_text('{"step": 1, "x": 1}\nnot json\n{"step": 2, "x": 2}\n')
    TrajectoryLog(tmp_path).open(1).close()
    assert (tmp_path / TRAJECTORIES).read_text() == '{"step": 1, "x": 1}\nnot json\n'  # reported by the viewer
    TrajectoryLog(tmp_path).open(0).close()
    assert (tmp_path / TRAJECTORIES).read_text() == ""


def test_size_bounds(tmp_path, caplog):
    log = TrajectoryLog(tmp_path, TrajectoryLogConfig(per_step=3, max_mb=0.002)).open(0)
    assert log.write_trajectories(1, [traj(i) for i in range(5)]) == 3  # the first ones: whole groups first
    with caplog.at_level(logging.WARNING, logger="agentrl.controller.runlog"):
        assert log.write_trajectories(2, [traj(0)]) == 0  # over 0.002 MiB: nothing more
        assert log.write_trajectories(3, [traj(0)]) == 0
    log.close()
    assert [r["trajectory"]["id"] for r in lines(tmp_path / TRAJECTORIES)] == ["g0.0", "g0.1", "g0.2"]
    assert sum("max_mb" in r.message for r in caplog.records) == 1
    assert TrajectoryLog(tmp_path, TrajectoryLogConfig(per_step=0)).open(1).write_trajectories(2, [traj(0)]) == 0


def test_config_errors_name_the_key():
    from agentrl.config import ConfigError, from_dict
    from agentrl.controller.run import TrainConfig
    from agentrl.trainer.config import TrainerConfig

    with pytest.raises(ConfigError, match="trajectory_log.*per_step must be >= 0"):
        from_dict(TrainConfig, {"env": {"id": "agentrl/FrozenLake-v0"}, "trajectory_log": {"per_step": -1}})
    with pytest.raises(ConfigError, match="record_logprobs must be >= 0"):
        from_dict(TrainerConfig, {"record_logprobs": -2})


def test_trainer_records_its_logprobs_before_the_update(run_dir):
    """The records are the trainer's log-probs with the step's starting weights, one per position 1..n-1."""
    import torch

    from agentrl.models import ensure_tiny_model
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.trainer import Trainer

    trajs = [Trajectory.from_dict(r["trajectory"]) for r in lines(run_dir / TRAJECTORIES)[:4]]
    trainer = Trainer(TrainerConfig(device="cpu", record_logprobs=3), ensure_tiny_model())
    before = trainer.compute_logprobs(trajs)
    assert trainer.take_logprob_records() == []
    trainer.train_step(trajs, advantages=[1.0, -1.0, 0.5, -0.5])
    recs = trainer.take_logprob_records()
    # A uniform sample of 3 of the 4 trained trajectories, each with its log-probs under the starting weights.
    by_id = {t.id: i for i, t in enumerate(trajs)}
    assert len(recs) == 3 and len({r["trajectory_id"] for r in recs}) == 3
    for r in recs:
        i = by_id[r["trajectory_id"]]
        t = trajs[i]
        assert r["version"] == 0 and len(r["logprobs"]) == len(t.token_ids) - 1
        assert torch.allclose(torch.tensor(r["logprobs"]), before[i, : len(t.token_ids) - 1], atol=1e-5)
    assert trainer.take_logprob_records() == []  # taken once
    first = trajs[by_id[recs[0]["trajectory_id"]]]
    assert trainer.compute_logprobs([first])[0, :5].tolist() != recs[0]["logprobs"][:5]  # weights moved since


def test_the_run_directory_fixture_joins_records_to_trajectories(run_dir):
    trajs = {r["trajectory"]["id"]: r for r in lines(run_dir / TRAJECTORIES)}
    recs = lines(run_dir / TRAINER_LOGPROBS)
    assert len(trajs) == 24 and len(recs) == 24
    for r in recs:
        t = trajs[r["trajectory_id"]]
        assert r["step"] == t["step"] and r["version"] == t["step"] - 1
        assert len(r["logprobs"]) == len(t["trajectory"]["token_ids"]) - 1
