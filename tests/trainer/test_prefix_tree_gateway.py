"""The prefix-tree layout on a gateway session with a fork (issue 27): a harness asks for ``n = 3`` choices, then
continues one of them and later compacts its history, through the real gateway (a scripted engine and the tiny
model's tokenizer and chat template). The session's trajectory holds one segment per branch, each repeating the
history before the fork, and a drifted segment; the tiny model trains on it: the tree layout's log-probs and update
equal the flat layout's (fp32, 1e-5), and the tree computes the shared history once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "gateway"))  # the tests run with --import-mode=importlib
from test_gateway import client, serve  # noqa: E402

from agentrl.trainer.batching import collate, prepare_sequences  # noqa: E402
from agentrl.trainer.config import LossConfig, OptimizerConfig, TrainerConfig  # noqa: E402
from agentrl.trainer.model import load_causal_lm, micro_batch_logprobs  # noqa: E402
from agentrl.trainer.prefix_tree import build_tree  # noqa: E402
from agentrl.trainer.trainer import Trainer  # noqa: E402
from agentrl.trajectory import Group  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    from agentrl.models import ensure_tiny_model

    return ensure_tiny_model()


async def _forked_session(tiny_dir: Path, name: str, seed: int) -> Group:
    from agentrl.chat import load_tokenizer

    tok = load_tokenizer(tiny_dir)
    gw, _eng = await serve(tok, [f"first {seed}<eos>", "a<eos>", "bb<eos>", "ccc<eos>", "go on<eos>",
                                 "short<eos>"])
    try:
        c = client(gw, name)
        msgs = [{"role": "system", "content": "You are a careful agent. " * 8}, {"role": "user", "content": "Q"}]
        r1 = await c.chat.completions.create(model="tiny", messages=msgs)
        msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "more"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs, n=3, seed=seed)  # the fork
        msgs += [{"role": "assistant", "content": r.choices[1].message.content}, {"role": "user", "content": "go"}]
        await c.chat.completions.create(model="tiny", messages=msgs)
        compact = [msgs[0], {"role": "user", "content": "summary so far; go"}]  # the harness compacts history
        await c.chat.completions.create(model="tiny", messages=compact)
        traj = gw.store.end(name)
    finally:
        await gw.stop()
    assert len(traj.segment_slices()) == 4  # three branches of the fork, one drift
    traj.group_id = "gw"
    return traj


async def test_gateway_session_with_a_fork_tree_equals_flat(tiny_dir: Path) -> None:
    trajs = [await _forked_session(tiny_dir, f"s{i}", i) for i in range(2)]
    for i, t in enumerate(trajs):
        t.reward = float(i)
        t.logprobs = [x - 0.3 if m else x for x, m in zip(t.logprobs, t.loss_mask)]
    vocab = 1024
    seqs, _ = prepare_sequences(trajs, [1.0, -1.0], vocab_size=vocab, max_seq_len=None)
    tree = build_tree([s.ids for s in seqs])
    assert tree.num_nodes < sum(s.length - 1 for s in seqs) * 0.6  # the branches share the system prompt & history
    model = load_causal_lm(tiny_dir, dtype=torch.float32, device=torch.device("cpu"), disable_dropout=True)
    out = {}
    for layout in (False, True):
        model.zero_grad(set_to_none=True)
        mb = collate(seqs, torch.device("cpu"), tree=layout)
        lp, ent = micro_batch_logprobs(model, mb, impl="torch", compute_dtype=torch.float32, temperature=1.0,
                                       entropy=True)
        (lp * mb.mask).sum().backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        out[layout] = (lp * mb.mask, ent * mb.mask, grads)
    torch.testing.assert_close(out[True][0], out[False][0], atol=TOL, rtol=TOL)
    torch.testing.assert_close(out[True][1], out[False][1], atol=TOL, rtol=TOL)
    for k, g in out[False][2].items():
        torch.testing.assert_close(out[True][2][k], g, atol=TOL, rtol=TOL)

    group = [Group(id="gw", trajectories=trajs)]
    cfg = dict(device="cpu", micro_batch_size=8, optimizer=OptimizerConfig(lr=1e-3),
               loss=LossConfig(name="decoupled_ppo", kl_coef=0.05, entropy_coef=0.01))
    flat, tr = Trainer(TrainerConfig(**cfg), tiny_dir), Trainer(TrainerConfig(prefix_tree=True, **cfg), tiny_dir)
    mf, mt = flat.train_step(group), tr.train_step(group)
    assert mt["batch/tree_tokens"] < 0.6 * mt["batch/flat_tokens"]
    assert mt["loss"] == pytest.approx(mf["loss"], rel=TOL, abs=TOL)
    pf = dict(flat.model.named_parameters())
    for k, p in tr.model.named_parameters():
        torch.testing.assert_close(p, pf[k], atol=TOL, rtol=TOL)
