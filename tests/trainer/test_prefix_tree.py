"""The prefix-tree layout against the flat one (fp32, tiny Qwen2): the trie itself, log-probs and gradients of one
micro-batch, and whole updates through ``train_step`` and the streamed step, on (a) a group sharing its prompt,
(b) split-mode segments each repeating the previous one, (c) a fork."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agentrl.trainer.batching import Seq, collate, prepare_sequences, split_micro, units
from agentrl.trainer.config import LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.model import ModelRunner, load_causal_lm, micro_batch_logprobs
from agentrl.trainer.prefix_tree import attention_impl_for, build_tree, tree_attention_mask, tree_micro_batches
from agentrl.trainer.trainer import Trainer
from agentrl.trajectory import Group, Trajectory

TOL = 1e-5


def _traj(tid: str, gid: str, ids: list[int], prompt_len: int, rng: random.Random, reward: float,
          segments: list[int] | None = None, mask: list[int] | None = None) -> Trajectory:
    lm = mask if mask is not None else [0] * prompt_len + [1] * (len(ids) - prompt_len)
    return Trajectory(id=tid, group_id=gid, env_id="test", token_ids=ids, loss_mask=lm,
                      logprobs=[-4.0 + rng.gauss(0, 0.3) if m else 0.0 for m in lm],
                      versions=[0 if m else -1 for m in lm], prompt_len=prompt_len, reward=reward,
                      segments=list(segments or []))


def shared_prompt(rng: random.Random) -> list[Group]:
    """(a) Two groups of four samples, each group sharing a 12-token prompt."""
    groups = []
    for gi in range(2):
        prompt = [rng.randrange(1, 64) for _ in range(12)]
        trajs = [_traj(f"a{gi}{j}", f"ga{gi}", prompt + [rng.randrange(1, 64) for _ in range(rng.randrange(2, 8))],
                       len(prompt), rng, reward=float(j % 3)) for j in range(4)]
        groups.append(Group(id=f"ga{gi}", trajectories=trajs))
    return groups


def split_segments(rng: random.Random) -> list[Group]:
    """(b) Split-mode trajectories: segment k is segment k-1 (observation appended) followed by a new turn, so
    every segment repeats the whole history before it; earlier turns are context (mask 0) in later segments. The
    group's samples share their prompt."""
    out = []
    prompt = [rng.randrange(1, 64) for _ in range(6)]
    for j in range(3):
        ids: list[int] = []
        mask: list[int] = []
        lengths: list[int] = []
        seg = list(prompt)
        for _turn in range(3):
            gen = [rng.randrange(1, 64) for _ in range(rng.randrange(2, 5))]
            ids += seg + gen
            mask += [0] * len(seg) + [1] * len(gen)
            lengths.append(len(seg) + len(gen))
            seg = seg + gen + [rng.randrange(1, 64) for _ in range(2)]
        out.append(_traj(f"b{j}", "gb", ids, 6, rng, reward=float(j), mask=mask, segments=lengths))
    return [Group(id="gb", trajectories=out)]


def fork(rng: random.Random) -> list[Group]:
    """(c) A session that forked: two sequences share 10 tokens (history) and then diverge, plus an unrelated one."""
    hist = [rng.randrange(1, 64) for _ in range(10)]
    a = hist + [rng.randrange(1, 64) for _ in range(7)]
    b = hist[:7] + [rng.randrange(1, 64) for _ in range(9)]
    c = [rng.randrange(1, 64) for _ in range(11)]
    ts = [_traj("c0", "gc", a, 4, rng, 1.0), _traj("c1", "gc", b, 4, rng, 0.0), _traj("c2", "gc", c, 4, rng, 2.0)]
    return [Group(id="gc", trajectories=ts)]


CASES = {"shared_prompt": shared_prompt, "split_segments": split_segments, "fork": fork}


def test_build_tree_shares_prefixes_and_masks_ancestors() -> None:
    a = torch.tensor([5, 6, 7, 8])
    b = torch.tensor([5, 6, 9, 10, 11])
    c = torch.tensor([5, 6, 7])  # its inputs [5, 6] are a prefix of a's: no new node
    t = build_tree([a, b, c])
    assert t.tokens.tolist() == [5, 6, 7, 9, 10]
    assert t.depth.tolist() == [0, 1, 2, 2, 3]
    assert [p.tolist() for p in t.paths] == [[0, 1, 2], [0, 1, 3, 4], [0, 1]]
    want = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]])
    assert torch.equal(t.mask, want.bool())


def test_tree_mask_is_the_ancestor_relation_on_random_tries() -> None:
    rng = random.Random(5)
    for _ in range(20):
        base = [rng.randrange(3) for _ in range(8)]
        seqs = [torch.tensor(base[:rng.randrange(0, 8)] + [rng.randrange(3) for _ in range(rng.randrange(2, 6))])
                for _ in range(rng.randrange(1, 7))]
        t = build_tree(seqs)
        want = torch.zeros(t.num_nodes, t.num_nodes, dtype=torch.bool)
        for ids, path in zip(seqs, t.paths):
            assert t.tokens[path].tolist() == ids[:-1].tolist()
            assert t.depth[path].tolist() == list(range(len(path)))
            for k in range(len(path)):
                want[path[k], path[: k + 1]] = True
        assert torch.equal(t.mask, want)
        assert t.num_nodes == len({tuple(ids[:k + 1].tolist()) for ids in seqs for k in range(len(ids) - 1)})


def _seqs(rows: list[list[int]], unit: list[int] | None = None) -> list[Seq]:
    return [Seq(ids=torch.tensor(r), mask=torch.ones(len(r) - 1), behav=torch.zeros(len(r) - 1),
                versions=torch.zeros(len(r) - 1, dtype=torch.long), adv=0.0, reward=0.0,
                unit=None if unit is None else unit[i]) for i, r in enumerate(rows)]


def test_tree_micro_batches_put_sharers_together_under_a_distinct_token_budget() -> None:
    p, q = [1] * 10, [2] * 10
    # lengths interleave the two prompts, so the length-sorted split mixes them
    rows = [p + [3] * 9, q + [4] * 8, p + [5] * 7, q + [6] * 6, p + [7] * 5, q + [8] * 4]
    seqs = _seqs(rows)
    mixed = split_micro(seqs, 3, None)
    assert any(len({int(s.ids[0]) for s in mb}) > 1 for mb in mixed)
    mbs = tree_micro_batches(units(seqs), 3, None)
    assert sorted(sorted(int(s.ids[0]) for s in mb) for mb in mbs) == [[1, 1, 1], [2, 2, 2]]
    distinct = build_tree([s.ids for s in seqs[0::2]]).num_nodes  # the p group: 10 + 8 + 6 + 4 = 28
    assert distinct == 28 < sum(len(r) - 1 for r in rows[0::2])
    assert [len(mb) for mb in tree_micro_batches(units(seqs[0::2]), 8, distinct)] == [3]
    assert [len(mb) for mb in tree_micro_batches(units(seqs[0::2]), 8, distinct - 1)] == [2, 1]
    # a trajectory's segments stay together, every sequence exactly once
    segs = _seqs(rows, unit=[0, 0, 1, 1, 2, 2])
    mbs = tree_micro_batches(units(segs), 3, 5)  # each trajectory alone is past the budget: alone, never cut
    assert sorted(id(s) for mb in mbs for s in mb) == sorted(id(s) for s in segs)
    assert sorted(sorted(s.unit for s in mb) for mb in mbs) == [[0, 0], [1, 1], [2, 2]]


def test_split_case_really_repeats_history() -> None:
    g = split_segments(random.Random(0))[0]
    for t in g.trajectories:
        sl = t.segment_slices()
        assert len(sl) == 3
        for (a0, b0), (a1, b1) in zip(sl, sl[1:]):
            assert t.token_ids[a1:a1 + (b0 - a0)] == t.token_ids[a0:b0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_tree_logprobs_and_gradients_equal_flat(tiny_model_dir: Path, case: str, attn: str) -> None:
    groups = CASES[case](random.Random(1))
    trajs = [t for g in groups for t in g.trajectories]
    seqs, _ = prepare_sequences(trajs, [1.0] * len(trajs), vocab_size=64, max_seq_len=None)
    model = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"), disable_dropout=True)
    model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn
    out = {}
    for layout in ("padded", "packed", "tree"):
        mb = collate(seqs, torch.device("cpu"), packing=layout == "packed", tree=layout == "tree")
        model.zero_grad(set_to_none=True)
        for impl in ("torch", "full"):
            logp, ent = micro_batch_logprobs(model, mb, impl=impl, compute_dtype=torch.float32, temperature=0.9,
                                             entropy=True, entropy_grad=True)
            ((logp * mb.mask).sum() + 0.1 * (ent * mb.mask).sum()).backward()
            out[layout, impl] = (logp.detach(), ent.detach())
        out[layout] = {k: p.grad.clone() for k, p in model.named_parameters()}
        if layout == "tree":
            assert mb.input_ids.shape[1] < mb.num_tokens - len(seqs)  # shared prefixes were computed once
    for impl in ("torch", "full"):
        for i in range(2):
            torch.testing.assert_close(out["tree", impl][i], out["padded", impl][i], atol=TOL, rtol=TOL)
            torch.testing.assert_close(out["tree", impl][i], out["packed", impl][i], atol=TOL, rtol=TOL)
    for k, g in out["padded"].items():
        torch.testing.assert_close(out["tree"][k], g, atol=TOL, rtol=TOL)


def test_an_attention_without_custom_masks_is_refused_by_name(tiny_model_dir: Path) -> None:
    model = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"), disable_dropout=True)
    model.config._attn_implementation = "flash_attention_2"  # not installable here; only the name is read
    with pytest.raises(ValueError, match="prefix_tree"):
        tree_attention_mask(model, torch.tensor([2, 2]), torch.float32)
    with pytest.raises(ValueError, match="prefix_tree"):
        ModelRunner(_cfg(True), model, torch.device("cpu"), "torch", torch.float32)
    ModelRunner(_cfg(False), model, torch.device("cpu"), "torch", torch.float32)  # the flat layout needs no mask


def test_the_tree_attention_is_flex_attention_on_cuda_only() -> None:
    assert attention_impl_for(torch.device("cuda"), True) == "flex_attention"
    assert attention_impl_for(torch.device("cpu"), True) is None
    assert attention_impl_for(torch.device("cuda"), False) is None


def _cfg(tree: bool, **kw) -> TrainerConfig:
    # eps 1e-3, not AdamW's 1e-8: a first Adam step moves each weight by lr * g / (|g| + eps), so with a tiny eps a
    # gradient element near zero turns float noise between the layouts into a weight difference of up to lr (a
    # one-element 1.02e-5 miss in CI); with 1e-3 a weight moves by at most the gradient's own noise.
    return TrainerConfig(device="cpu", micro_batch_size=8, prefix_tree=tree,
                         optimizer=OptimizerConfig(lr=1e-3, eps=1e-3),
                         loss=LossConfig(name="decoupled_ppo", kl_coef=0.05, entropy_coef=0.01), **kw)


def _params(tr: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.model.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_train_step_tree_equals_flat(tiny_model_dir: Path, case: str) -> None:
    groups = CASES[case](random.Random(2))
    flat = Trainer(_cfg(False), tiny_model_dir)
    tree = Trainer(_cfg(True), tiny_model_dir)
    assert all(torch.equal(a, b) for a, b in zip(_params(flat).values(), _params(tree).values()))
    mf, mt = flat.train_step(groups), tree.train_step(groups)
    assert "batch/tree_ratio" not in mf
    assert mt["batch/flat_tokens"] == mf["batch/num_tokens"]
    assert 0 < mt["batch/tree_tokens"] < mt["batch/flat_tokens"]
    assert mt["batch/tree_ratio"] == pytest.approx(mt["batch/tree_tokens"] / mt["batch/flat_tokens"])
    for k in ("loss", "grad_norm", "entropy/mean"):
        if k in mf:
            assert mt[k] == pytest.approx(mf[k], rel=TOL, abs=TOL), k
    pf, pt = _params(flat), _params(tree)
    assert any(not torch.equal(pf[k], p) for k, p in _params(Trainer(_cfg(False), tiny_model_dir)).items())
    for k in pf:
        torch.testing.assert_close(pt[k], pf[k], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_step_tree_equals_flat(tiny_model_dir: Path, case: str) -> None:
    groups = CASES[case](random.Random(3))
    flat = Trainer(_cfg(False), tiny_model_dir)
    flat.train_step(groups)
    tree = Trainer(_cfg(True), tiny_model_dir)
    tree.start_step()
    for g in groups:
        tree.accumulate([g])
    m = tree.finish_step()
    assert m["batch/tree_tokens"] < m["batch/flat_tokens"]
    pf, pt = _params(flat), _params(tree)
    for k in pf:
        torch.testing.assert_close(pt[k], pf[k], atol=TOL, rtol=TOL)


def test_lora_adapters_train_the_same_in_the_tree_layout(tiny_model_dir: Path) -> None:
    """``configs/tooluse.yaml`` turns the tree on, and ``trainer.lora`` may be added to it: the adapters' update in
    the tree layout equals the flat layout's (PEFT's wrapped attention sees the tree mask as the base would)."""
    from agentrl.trainer.config import LoraConfig

    groups = CASES[sorted(CASES)[0]](random.Random(4))
    flat = Trainer(_cfg(False, lora=LoraConfig(rank=4, alpha=8.0)), tiny_model_dir)
    tree = Trainer(_cfg(True, lora=LoraConfig(rank=4, alpha=8.0)), tiny_model_dir)
    for _ in range(2):  # the first step moves B off zero; the second's gradients then reach A as well
        mf, mt = flat.train_step(groups), tree.train_step(groups)
    assert mt["batch/tree_tokens"] < mt["batch/flat_tokens"]
    assert mt["loss"] == pytest.approx(mf["loss"], rel=TOL, abs=TOL)
    pf, pt = _params(flat), _params(tree)
    assert any("lora_" in k for k in pf)
    for k in pf:
        torch.testing.assert_close(pt[k], pf[k], atol=TOL, rtol=TOL)
