"""Data-parallel trainer ranks on a real local Ray cluster with gloo: N ranks compute the same update as one trainer
(uneven shards, token- and sequence-normalised losses, streamed steps, two mini-batches), checkpoints round-trip at world_size 2 and
refuse another world_size, a dead rank fails the step naming it, and a too-large world_size is refused before any
model loads. One Ray cluster for the module and two groups of two tiny-model ranks: ``dp_group`` (decoupled PPO,
``sharding: replicate``, shared by the tests in file order, killed by the dead-rank test) and a GRPO group with
``sharding: fsdp`` (FSDP2 over gloo: sharded step, gathered state dict, log-probs and a checkpoint round trip)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import ray
import torch

from agentrl.inference.placement import ResourceError
from agentrl.trainer.advantages import turn_spans
from agentrl.trainer.config import AdvantageConfig, LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.dp_group import TrainerRankError, create_trainer, shard_by_loss_tokens, stop_trainer
from agentrl.trainer.trainer import Trainer
from agentrl.trajectory import Group, Trajectory

ROOT = Path(__file__).resolve().parents[2]

# decoupled PPO runs on replicated ranks (the CPU default), GRPO on FSDP2 shards (the GPU default, here over gloo)
SHARDING = {"decoupled_ppo": "replicate", "grpo": "fsdp"}
LOSSES = {
    # AReaL's decoupled PPO (token mean, behaviour-corrected)
    "decoupled_ppo": LossConfig(name="decoupled_ppo"),
    # GRPO: PPO-clip on group-relative advantages, per-sequence mean, KL to the reference model
    "grpo": LossConfig(name="ppo", aggregation="seq_mean_token_mean", kl_coef=0.05, entropy_coef=0.01),
}


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def dp_group(ray_local, tiny_model_dir: Path):
    group = create_trainer(_cfg(LOSSES["decoupled_ppo"], record_logprobs=3, world_size=2), tiny_model_dir)
    try:
        yield group
    finally:
        stop_trainer(group)


def _groups(seed: int = 0) -> list[Group]:
    """Three groups whose trajectories differ a lot in length, so balancing by loss tokens gives shards of
    different sizes."""
    g = random.Random(seed)
    groups = []
    for gi, lengths in enumerate([(30, 3, 4), (2, 5, 3), (6, 2, 25)]):
        prompt = [g.randrange(1, 64) for _ in range(3 + gi)]
        trajs = []
        for j, n in enumerate(lengths):
            trajs.append(Trajectory(
                id=f"t{gi}-{j}", group_id=f"g{gi}", env_id="test",
                token_ids=prompt + [g.randrange(1, 64) for _ in range(n)], loss_mask=[0] * len(prompt) + [1] * n,
                logprobs=[0.0] * len(prompt) + [-4.2 + g.gauss(0, 0.5) for _ in range(n)],
                versions=[-1] * len(prompt) + [0] * n, prompt_len=len(prompt), reward=g.choice([-1.0, 0.0, 1.0, 2.0]),
            ))
        groups.append(Group(id=f"g{gi}", trajectories=trajs))
    return groups


def _cfg(loss: LossConfig, **kw) -> TrainerConfig:
    # Adam's first step moves every weight by about lr * g / |g|, so a weight whose gradient is ~1e-8 turns float
    # rounding of its summation order into a full-size difference; eps 1e-6 keeps the comparison about the update.
    return TrainerConfig(device="cpu", micro_batch_size=2, optimizer=OptimizerConfig(lr=1e-3, eps=1e-6), loss=loss,
                         advantage=AdvantageConfig(estimator="grpo"), **kw)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _rank_weights(group, rank: int) -> dict[str, torch.Tensor]:
    return ray.get(group.actors[rank].state_dict_for_inference.remote(torch.float32))


def test_shards_balance_loss_tokens_and_may_be_uneven() -> None:
    trajs = [t for g in _groups() for t in g.trajectories]
    shards = shard_by_loss_tokens(trajs, 2)
    assert sorted(i for s in shards for i in s) == list(range(len(trajs)))
    sizes = [len(s) for s in shards]
    assert sizes[0] != sizes[1]  # the equivalence tests below run on uneven shards
    tokens = [sum(sum(trajs[i].loss_mask) for i in s) for s in shards]
    assert abs(tokens[0] - tokens[1]) <= max(sum(t.loss_mask) for t in trajs)
    assert shard_by_loss_tokens(trajs[:1], 3)[1:] == [[], []]  # fewer trajectories than ranks: empty shards


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_two_ranks_equal_one_trainer(dp_group, tiny_model_dir: Path, tmp_path: Path, name: str) -> None:
    cfg = _cfg(LOSSES[name], record_logprobs=3)
    groups = _groups()
    single = Trainer(cfg, tiny_model_dir)
    initial = single.state_dict_for_inference(torch.float32)
    m1 = single.train_step(groups)
    expected = single.state_dict_for_inference(torch.float32)
    assert _max_diff(initial, expected) > 1e-4  # the step moved the weights

    group = dp_group if name == "decoupled_ppo" else create_trainer(
        _cfg(LOSSES[name], record_logprobs=3, world_size=2, sharding=SHARDING[name]), tiny_model_dir)
    try:
        assert group.sharding == SHARDING[name] and group.get_version.remote().result() == 0
        m2 = group.train_step.remote(groups).result()
        if SHARDING[name] == "replicate":
            for rank in (0, 1):  # both replicas hold the update
                assert _max_diff(_rank_weights(group, rank), expected) <= 1e-5, rank
        else:
            assert _max_diff(group.state_dict_for_inference.remote(torch.float32).result(), expected) <= 1e-5
        for key in ("loss", "grad_norm", "reward/mean", "adv/std", "batch/loss_tokens", "batch/num_seqs", "entropy",
                    "staleness/mean", "ratio/clip_frac"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
        assert group.get_version.remote().result() == 1
        recs = group.take_logprob_records.remote().result()
        assert len(recs) == 3 and {r["version"] for r in recs} == {0}

        if name == "decoupled_ppo":  # a streamed step over two ranks equals one more train_step
            single.train_step(groups[1:])
            group.start_step.remote().result()
            a = group.accumulate.remote(groups[1:2]).result()
            assert a["accumulate/seqs"] == 3
            with pytest.raises(ValueError, match="already accumulated"):
                group.accumulate.remote(groups[1:2])
            group.accumulate.remote(groups[2:]).result()
            assert group.finish_step.remote().result()["version"] == 2
            assert _max_diff(_rank_weights(group, 1), single.state_dict_for_inference(torch.float32)) <= 1e-5
        else:  # FSDP: log-probs, and a checkpoint round trip of the gathered model and optimizer
            trajs = [t for g in groups for t in g.trajectories]
            lp = group.compute_logprobs.remote(trajs).result()
            assert float((lp - single.compute_logprobs(trajs)).abs().max()) <= 1e-5
            at_ckpt = group.state_dict_for_inference.remote(torch.float32).result()
            ck = group.save_checkpoint.remote(str(tmp_path / "fsdp")).result()
            assert json.loads((Path(ck) / "model/config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
            group.train_step.remote(groups).result()
            assert group.load_checkpoint.remote(ck).result()["sharding"] == "fsdp"
            assert _max_diff(group.state_dict_for_inference.remote(torch.float32).result(), at_ckpt) == 0.0
            single.train_step(groups)  # optimizer state restored: the same second step as one trainer
            group.train_step.remote(groups).result()
            assert _max_diff(group.state_dict_for_inference.remote(torch.float32).result(),
                             single.state_dict_for_inference(torch.float32)) <= 1e-5
    finally:
        if group is not dp_group:
            stop_trainer(group)


def test_two_ranks_equal_one_trainer_with_two_mini_batches(ray_local, tiny_model_dir: Path) -> None:
    """``num_mini_batches: 2``: the ranks take the single trainer's two optimizer steps on its two mini-batches
    (each shared out between the ranks), not each its own split of its shard."""
    cfg = _cfg(LOSSES["decoupled_ppo"], num_mini_batches=2)
    groups = _groups()
    single = Trainer(cfg, tiny_model_dir)
    initial = single.state_dict_for_inference(torch.float32)
    m1 = single.train_step(groups)
    expected = single.state_dict_for_inference(torch.float32)
    assert _max_diff(initial, expected) > 1e-4 and m1["optimizer_steps"] == 2
    group = create_trainer(_cfg(LOSSES["decoupled_ppo"], num_mini_batches=2, world_size=2), tiny_model_dir)
    try:
        m2 = group.train_step.remote(groups).result()
        for rank in (0, 1):
            assert _max_diff(_rank_weights(group, rank), expected) <= 1e-5, rank
        assert m2["optimizer_steps"] == 2 and m2["train/skipped_steps"] == 0
        for key in ("loss", "grad_norm", "batch/loss_tokens", "ratio/clip_frac", "mismatch/kl_k3"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
    finally:
        stop_trainer(group)


def test_two_ranks_equal_one_trainer_with_per_turn_advantages(ray_local, tiny_model_dir: Path) -> None:
    """Per-turn advantage lists cross to the ranks with their trajectories: the sharded step equals one trainer's."""
    groups = _groups()
    trajs = [t for g in groups for t in g.trajectories]
    for t in trajs:  # cut each completion into two turns by one env token
        cut = t.prompt_len + max(1, (len(t.token_ids) - t.prompt_len) // 2)
        if cut < len(t.token_ids) - 1:
            t.loss_mask[cut], t.logprobs[cut], t.versions[cut] = 0, 0.0, -1
    advs = [[0.3 * (i % 4) - 0.5, 1.0 - 0.2 * i][: len(turn_spans(t))] for i, t in enumerate(trajs)]
    assert {len(a) for a in advs} == {1, 2}
    single = Trainer(_cfg(LOSSES["decoupled_ppo"]), tiny_model_dir)
    m1 = single.train_step(groups, advs)
    expected = single.state_dict_for_inference(torch.float32)
    group = create_trainer(_cfg(LOSSES["decoupled_ppo"], world_size=2), tiny_model_dir)
    try:
        m2 = group.train_step.remote(groups, advs).result()
        for rank in (0, 1):
            assert _max_diff(_rank_weights(group, rank), expected) <= 1e-5, rank
        for key in ("loss", "grad_norm", "adv/mean", "batch/loss_tokens"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
    finally:
        stop_trainer(group)


def test_two_ranks_with_the_prefix_tree_equal_one_flat_trainer(ray_local, tiny_model_dir: Path) -> None:
    """Issue 27: two replicated ranks in the prefix-tree layout, each over its shard (sharded by tree), take the
    update of one trainer in the flat layout. FSDP ranks in the tree layout: tests/trainer/test_prefix_tree_dp.py
    (plain gloo processes; the Ray form of that test did not finish within 900 s at load 1,100+ here)."""
    sharding, loss = "replicate", LOSSES["decoupled_ppo"]
    groups = _groups()
    single = Trainer(_cfg(loss), tiny_model_dir)
    m1 = single.train_step(groups)
    expected = single.state_dict_for_inference(torch.float32)
    group = create_trainer(_cfg(loss, world_size=2, sharding=sharding, prefix_tree=True), tiny_model_dir)
    try:
        m2 = group.train_step.remote(groups).result()
        for rank in (0, 1):
            assert _max_diff(_rank_weights(group, rank), expected) <= 1e-5, rank
        for key in ("loss", "grad_norm", "batch/loss_tokens"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
        assert m2["batch/flat_tokens"] == m1["batch/num_tokens"]
        assert m2["batch/tree_tokens"] < m2["batch/flat_tokens"]
    finally:
        stop_trainer(group)


def test_checkpoint_round_trip_at_world_size_2(dp_group, tiny_model_dir: Path, tmp_path: Path) -> None:
    groups, group = _groups(), dp_group
    group.train_step.remote(groups).result()
    saved = group.state_dict_for_inference.remote(torch.float32).result()
    ck = group.save_checkpoint.remote(str(tmp_path / "ck")).result()
    state = json.loads((Path(ck) / "trainer_state.json").read_text())
    version = group.get_version.remote().result()
    assert state["world_size"] == 2 and state["sharding"] == "replicate" and state["version"] == version
    group.train_step.remote(groups).result()  # moves past the checkpoint ...
    after_two = _rank_weights(group, 1)
    assert group.load_checkpoint.remote(ck).result()["version"] == version  # ... and back
    for rank in (0, 1):
        assert _max_diff(_rank_weights(group, rank), saved) == 0.0
    assert group.get_version.remote().result() == version
    group.train_step.remote(groups).result()  # optimizer state restored too: the same second step again
    assert _max_diff(_rank_weights(group, 0), after_two) <= 1e-6
    alone = Trainer(_cfg(LOSSES["decoupled_ppo"]), tiny_model_dir)
    with pytest.raises(ValueError, match=r"saved by 2 trainer rank\(s\).*trainer.world_size=1.*world_size=2"):
        alone.load_checkpoint(ck)


def test_a_rank_with_an_empty_shard_still_steps(dp_group) -> None:
    group = dp_group
    version = group.get_version.remote().result()
    before = _rank_weights(group, 0)
    m = group.train_step.remote(_groups()[0].trajectories[:1], [1.0]).result()  # one trajectory, two ranks
    assert m["batch/num_seqs"] == 1 and m["train/skipped_steps"] == 0 and m["version"] == version + 1
    after = [_rank_weights(group, r) for r in (0, 1)]
    assert _max_diff(after[0], before) > 0 and _max_diff(after[0], after[1]) == 0.0


def test_dead_rank_fails_the_step_naming_it(dp_group) -> None:  # the last user of dp_group
    group = dp_group
    ray.kill(group.actors[1])  # rank 0 will wait in the step's first all-reduce
    with pytest.raises(TrainerRankError, match=r"trainer rank 1 of 2 died during train_step.*--resume"):
        group.train_step.remote(_groups(1)).result(timeout=300)
    with pytest.raises(TrainerRankError, match="stopped"):
        group.get_version.remote()
    with pytest.raises(ray.exceptions.RayActorError):  # rank 0 was stopped too (it was stuck in a collective)
        ray.get(group.actors[0].ping.remote(), timeout=60)


def test_world_size_beyond_ray_is_refused_before_any_model_loads(ray_local) -> None:
    from agentrl.controller.run import check_resources, load_config

    # The dead-rank test before this one removed its placement group; Ray reports the freed CPUs a moment later.
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    cfg = load_config(ROOT / "configs/quickstart.yaml", ["trainer.world_size=5", "trainer_num_cpus=1"])
    with pytest.raises(ResourceError, match=r"trainer.world_size=5 x trainer_num_cpus=1 asks 5 x \{CPU 1\}.*CPU 4 "
                                            r"free"):
        check_resources(cfg)
    check_resources(load_config(ROOT / "configs/quickstart.yaml", ["trainer.world_size=2", "engine.replicas=2"]))
