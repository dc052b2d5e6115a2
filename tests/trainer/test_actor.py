"""The trainer as a real Ray actor: train step, version, weights and a checkpoint across the process boundary."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch

from agentrl.trainer.actor import create_trainer_actor
from agentrl.trainer.config import OptimizerConfig, TrainerConfig
from agentrl.trajectory import Trajectory


@pytest.fixture(scope="module")
def ray_local():
    # One local cluster for the module: starting Ray is the slow part.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _traj(i: int, completion: list[int], reward: float) -> Trajectory:
    prompt = [1, 2, 3]
    return Trajectory(
        id=f"t{i}", group_id="g", env_id="test", token_ids=prompt + completion,
        loss_mask=[0] * 3 + [1] * len(completion), logprobs=[0.0] * 3 + [-4.0] * len(completion),
        versions=[-1] * 3 + [0] * len(completion), prompt_len=3, reward=reward,
    )


def test_trainer_actor_round_trip(ray_local, tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = TrainerConfig(device="cpu", optimizer=OptimizerConfig(lr=1e-3))
    actor = create_trainer_actor(cfg, tiny_model_dir, num_cpus=1)
    assert ray.get(actor.get_version.remote()) == 0
    trajs = [_traj(0, [10, 11, 12], 1.0), _traj(1, [20, 21, 22], 0.0)]
    before = ray.get(actor.state_dict_for_inference.remote())
    metrics = ray.get(actor.train_step.remote(trajs))
    assert metrics["version"] == 1 and metrics["grad_norm"] > 0
    assert ray.get(actor.get_version.remote()) == 1
    after = ray.get(actor.state_dict_for_inference.remote())
    assert set(after) == set(before) and "model.embed_tokens.weight" in after
    assert not torch.equal(after["model.norm.weight"], before["model.norm.weight"])
    lp = ray.get(actor.compute_logprobs.remote(trajs))
    assert lp.shape == (2, 5)
    ck = ray.get(actor.save_checkpoint.remote(str(tmp_path / "ck")))
    assert (Path(ck) / "trainer_state.json").exists()
    assert ray.get(actor.load_checkpoint.remote(ck))["version"] == 1


def test_trainer_actor_streamed_step_and_records(ray_local, tiny_model_dir: Path) -> None:
    cfg = TrainerConfig(device="cpu", optimizer=OptimizerConfig(lr=1e-3), record_logprobs=1)
    actor = create_trainer_actor(cfg, tiny_model_dir, num_cpus=1)
    a = [_traj(0, [10, 11, 12], 1.0), _traj(1, [20, 21, 22], 0.0)]
    b = [_traj(2, [30, 31], 1.0), _traj(3, [40, 41, 42, 43], 0.0)]
    for t in b:
        t.group_id = "h"
    ray.get(actor.start_step.remote())
    assert ray.get(actor.accumulate.remote(a))["accumulate/seqs"] == 2
    ray.get(actor.accumulate.remote(b))
    metrics = ray.get(actor.finish_step.remote())
    assert metrics["version"] == 1 and metrics["batch/num_seqs"] == 4
    recs = ray.get(actor.take_logprob_records.remote())
    assert len(recs) == 1 and recs[0]["version"] == 0
    assert ray.get(actor.take_logprob_records.remote()) == []
    ray.get(actor.start_step.remote())
    ray.get(actor.abort_step.remote())
    assert ray.get(actor.get_version.remote()) == 1


def test_bad_model_path_fails_at_creation(ray_local, tmp_path: Path) -> None:
    with pytest.raises(ray.exceptions.RayActorError):
        create_trainer_actor(TrainerConfig(device="cpu"), tmp_path / "missing")
