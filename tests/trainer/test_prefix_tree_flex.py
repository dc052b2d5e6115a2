"""The prefix-tree layout's GPU attention path (issue 27), run on the CPU: the ``flex_attention`` block mask built
from a tree is exactly the dense ancestor mask (element by element, and block by block: the blocks it lets the
kernel skip hold no ancestor pair), and a tiny Qwen2 loaded with ``flex_attention`` gives the tree layout the same
log-probs and entropy as SDPA with the dense mask (fp32, 1e-5; forward only: torch's flex_attention has no backward
on the CPU). No GPU was available where these were written: on CUDA the same code runs compiled
(``attention_impl_for``), and its gradients are not tested here."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agentrl.trainer.batching import collate, prepare_sequences
from agentrl.trainer.model import load_causal_lm, micro_batch_logprobs
from agentrl.trainer.prefix_tree import ancestor_mask, build_tree, tree_attention_mask, tree_block_mask
from agentrl.trajectory import Trajectory

TOL = 1e-5


def _tries(rng: random.Random, n: int) -> list[list[torch.Tensor]]:
    out = []
    for _ in range(n):
        base = [rng.randrange(4) for _ in range(rng.randrange(10, 150))]
        out.append([torch.tensor(base[:rng.randrange(0, len(base))] + [rng.randrange(4) for _ in range(
            rng.randrange(2, 60))]) for _ in range(rng.randrange(1, 7))])
    return out


def test_block_mask_is_the_dense_ancestor_mask() -> None:
    for seqs in _tries(random.Random(11), 4):
        t = build_tree(seqs)
        u = t.num_nodes
        bm = tree_block_mask(t.end)
        dense = ancestor_mask(t.end)
        q, kv = torch.meshgrid(torch.arange(u), torch.arange(u), indexing="ij")
        zero = torch.zeros((), dtype=torch.long)
        assert torch.equal(bm.mask_mod(zero, zero, q, kv), dense)
        # block level: a block is visited iff it holds at least one ancestor pair
        size = bm.BLOCK_SIZE[0]
        nb = -(-u // size)
        padded = torch.zeros(nb * size, nb * size, dtype=torch.bool)
        padded[:u, :u] = dense
        want = padded.view(nb, size, nb, size).any(dim=3).any(dim=1)
        assert torch.equal(bm.to_dense()[0, 0].bool()[:nb, :nb], want)


def _trajs(rng: random.Random) -> list[Trajectory]:
    prompt = [rng.randrange(1, 64) for _ in range(40)]
    out = []
    for j in range(4):
        gen = [rng.randrange(1, 64) for _ in range(rng.randrange(5, 30))]
        lm = [0] * len(prompt) + [1] * len(gen)
        out.append(Trajectory(id=f"f{j}", group_id="g", env_id="test", token_ids=prompt + gen, loss_mask=lm,
                              logprobs=[-4.0 if m else 0.0 for m in lm], versions=[0 if m else -1 for m in lm],
                              prompt_len=len(prompt), reward=float(j)))
    return out


def test_flex_attention_tree_equals_sdpa_tree(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.integrations.flex_attention as hf_flex
    from torch.nn.attention.flex_attention import flex_attention

    # transformers compiles flex_attention on first use (minutes of inductor on a busy CPU); the uncompiled
    # operator computes the same function from the same block mask, which is what this test is about
    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention",
                        lambda q, k, v, training=False, **kw: flex_attention(q, k, v, **kw))
    seqs, _ = prepare_sequences(_trajs(random.Random(4)), [1.0, -1.0, 0.5, 0.0], vocab_size=64, max_seq_len=None)
    mb = collate(seqs, torch.device("cpu"), tree=True)
    out = {}
    for impl in ("sdpa", "flex_attention"):
        model = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"), disable_dropout=True,
                               attn_implementation=impl)
        assert model.config._attn_implementation == impl
        kind = type(tree_attention_mask(model, mb.tree_end, torch.float32)).__name__
        assert kind == ("BlockMask" if impl == "flex_attention" else "Tensor")
        with torch.no_grad():  # torch's flex_attention has no backward on the CPU (CUDA only)
            out[impl] = micro_batch_logprobs(model, mb, impl="torch", compute_dtype=torch.float32, temperature=1.0,
                                             entropy=True)
    for i in range(2):
        torch.testing.assert_close(out["flex_attention"][i], out["sdpa"][i], atol=TOL, rtol=TOL)
