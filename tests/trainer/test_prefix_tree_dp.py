"""Data-parallel ranks in the prefix-tree layout (issue 27): sharding by tree (sharers of a prefix on one rank,
balanced by computed tokens) and two FSDP2 ranks over gloo, as plain processes, against one flat trainer."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.trainer.advantages import compute_advantages
from agentrl.trainer.config import AdvantageConfig, LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.dp_group import plan_shards
from agentrl.trainer.dp_rank import free_port
from agentrl.trainer.prefix_tree import _PrefixCount, shard_by_tree
from agentrl.trainer.trainer import Trainer
from agentrl.trajectory import Group, Trajectory

ROOT = Path(__file__).resolve().parents[2]
RANK_MAIN = Path(__file__).with_name("dp_rank_main.py")


def _groups(sizes: list[tuple[int, int]], seed: int = 0) -> list[Group]:
    """One group per ``(prompt_len, samples)``: the samples share the prompt and differ in 2-8 generated tokens."""
    rng = random.Random(seed)
    groups = []
    for gi, (plen, k) in enumerate(sizes):
        prompt = [rng.randrange(1, 64) for _ in range(plen)]
        trajs = []
        for j in range(k):
            n = rng.randrange(2, 9)
            lm = [0] * plen + [1] * n
            trajs.append(Trajectory(
                id=f"t{gi}-{j}", group_id=f"g{gi}", env_id="test",
                token_ids=prompt + [rng.randrange(1, 64) for _ in range(n)], loss_mask=lm,
                logprobs=[-4.0 + rng.gauss(0, 0.3) if m else 0.0 for m in lm], versions=[0 if m else -1 for m in lm],
                prompt_len=plen, reward=float(j % 3)))
        groups.append(Group(id=f"g{gi}", trajectories=trajs))
    return groups


def _distinct(seqs: list[list[int]]) -> int:
    count = _PrefixCount()
    count.add(seqs)
    return len(count)


def test_shard_by_tree_keeps_sharers_together_and_balances_computed_tokens() -> None:
    trajs = [t for g in _groups([(20, 4), (18, 4), (22, 4), (16, 4)]) for t in g.trajectories]
    random.Random(1).shuffle(trajs)
    units = [[t.token_ids] for t in trajs]
    shards = shard_by_tree(units, 2)
    assert sorted(i for s in shards for i in s) == list(range(len(trajs)))
    for s in shards:
        assert s == sorted(s)  # the batch's order
    for g in {t.group_id for t in trajs}:  # every group on one rank
        assert sum(any(trajs[i].group_id == g for i in s) for s in shards) == 1, g
    # each shared prefix is computed once across the ranks: the shards' trees hold exactly the whole batch's nodes
    per_rank = [_distinct([trajs[i].token_ids for i in s]) for s in shards]
    assert sum(per_rank) == _distinct([t.token_ids for t in trajs])
    # balanced by computed tokens: no better cut at group boundaries exists
    group_cost = sorted(_distinct([t.token_ids for t in trajs if t.group_id == g]) for g in {t.group_id for t in trajs})
    best = min(max(sum(c for c, b in zip(group_cost, mask) if b), sum(c for c, b in zip(group_cost, mask) if not b))
               for mask in ([(m >> i) & 1 for i in range(4)] for m in range(16)))
    assert max(per_rank) == best


def test_shard_by_tree_splits_a_group_only_when_it_lowers_the_busiest_rank() -> None:
    one = [t for g in _groups([(4, 8)]) for t in g.trajectories]
    shards = shard_by_tree([[t.token_ids] for t in one], 2)
    assert all(shards)  # a short prompt: splitting the group halves the busiest rank's work
    long = [t for g in _groups([(200, 3)]) for t in g.trajectories]
    shards = shard_by_tree([[t.token_ids] for t in long], 2)
    assert sorted(map(len, shards)) == [0, 3]  # a long shared prompt: computing it twice would cost more
    assert shard_by_tree([[t.token_ids] for t in long[:1]], 3)[1:] == [[], []]
    assert shard_by_tree([], 2) == [[], []]


def test_shard_by_tree_counts_a_split_trajectory_by_its_distinct_prefixes() -> None:
    """Five split-mode trajectories whose three segments repeat one history: each costs its longest segment, not
    the sum of its segments, so three ranks get 2, 2 and 1 of them (by the sum, the same)."""
    rng = random.Random(3)
    units = []
    for _ in range(5):
        segs = [[rng.randrange(1, 64) for _ in range(9)]]
        for _turn in range(2):
            segs.append(segs[-1] + [rng.randrange(1, 64) for _ in range(4)])
        units.append(segs)
    shards = shard_by_tree(units, 3)
    assert sorted(i for s in shards for i in s) == list(range(5))
    assert sorted(map(len, shards)) == [1, 2, 2]
    assert _distinct(units[0]) == len(units[0][-1]) - 1


def _cfg(**kw) -> TrainerConfig:
    return TrainerConfig(device="cpu", micro_batch_size=2, optimizer=OptimizerConfig(lr=1e-3, eps=1e-6),
                         loss=LossConfig(name="ppo", aggregation="seq_mean_token_mean", kl_coef=0.05,
                                         entropy_coef=0.01),
                         advantage=AdvantageConfig(estimator="grpo"), **kw)


@pytest.mark.timeout(1500)
def test_two_fsdp_ranks_in_the_tree_layout_equal_one_flat_trainer(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two FSDP2 ranks (gloo) in the tree layout, sharded by tree, take the updates of one flat trainer: a step
    over three groups, then a step over one group, which leaves one rank with no sequence at all (it joins its
    peer's all-gathers with empty micro-batches). A rank stuck in a collective fails the test (the subprocesses'
    wait and the collectives' timeout), it does not hang it."""
    steps = []
    for sizes in ([(10, 3), (8, 4), (12, 3)], [(30, 3)]):
        groups = _groups(sizes, seed=len(sizes))
        cfg = _cfg()
        steps.append(([t for g in groups for t in g.trajectories], compute_advantages(groups, cfg.advantage)))
    single = Trainer(_cfg(), tiny_model_dir)
    flat = [single.train_step(trajs, advs) for trajs, advs in steps]
    expected = single.state_dict_for_inference(torch.float32)

    cfg = _cfg(world_size=2, sharding="fsdp", prefix_tree=True)
    (tmp_path / "job.pkl").write_bytes(pickle.dumps({"config": cfg, "steps": steps, "timeout_s": 600.0}))
    _, port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, str(RANK_MAIN), str(r), "2", str(port), str(tiny_model_dir),
                               str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=1200)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    out = torch.load(tmp_path / "out.pt")
    assert out["shards"][1] in ([[0, 1, 2], []], [[], [0, 1, 2]])  # step 2: one rank has no tree
    for k, w in expected.items():
        assert float((out["weights"][k] - w).abs().max()) <= 1e-5, k
    for m_tree, m_flat in zip(out["metrics"], flat):
        for key in ("loss", "grad_norm", "batch/loss_tokens", "kl/ref"):
            assert m_tree[key] == pytest.approx(m_flat[key], rel=1e-4, abs=1e-6), key
        assert m_tree["batch/flat_tokens"] == m_flat["batch/num_tokens"]
        assert m_tree["batch/tree_tokens"] < m_tree["batch/flat_tokens"]
