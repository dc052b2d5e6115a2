"""Per-turn advantages through the trainer: turn spans from the loss mask, per-token advantage tensors in the
batches, and updates that equal the trajectory-level path when every turn has the same value."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agentrl.trainer.advantages import token_advantages, turn_spans
from agentrl.trainer.batching import collate, prepare_sequences
from agentrl.trainer.config import LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.trainer import Trainer
from agentrl.trajectory import Trajectory

VOCAB = 64


def multi_turn(tid: str, group: str, parts: list[tuple[str, list[int]]], reward: float = 0.0,
               rewards: list[float] | None = None, segments: list[int] | None = None) -> Trajectory:
    """A trajectory from ``("fixed" | "gen", tokens)`` parts, in order."""
    t = Trajectory(id=tid, group_id=group, env_id="test", reward=reward, rewards=list(rewards or []),
                   segments=list(segments or []))
    for kind, ids in parts:
        gen = kind == "gen"
        t.token_ids += ids
        t.loss_mask += [int(gen)] * len(ids)
        t.logprobs += [-1.0 if gen else 0.0] * len(ids)
        t.versions += [0 if gen else -1] * len(ids)
    t.validate()
    return t


def _two_turns(tid: str = "a", group: str = "g") -> Trajectory:
    return multi_turn(tid, group, [("fixed", [1, 2, 3]), ("gen", [4, 5]), ("fixed", [6]), ("gen", [7, 8, 9])],
                      rewards=[0.0, 1.0])


def test_turn_spans_are_loss_mask_runs_cut_at_segments() -> None:
    t = _two_turns()
    assert turn_spans(t) == [(3, 5), (6, 9)]
    # two segments whose generated runs touch across the boundary are still two turns
    s = multi_turn("s", "g", [("fixed", [1]), ("gen", [2, 3]), ("gen", [4]), ("fixed", [5])], segments=[3, 2])
    assert turn_spans(s) == [(1, 3), (3, 4)]
    assert turn_spans(multi_turn("n", "g", [("fixed", [1, 2])])) == []


def test_token_advantages_place_each_turn_on_its_tokens_and_refuse_a_wrong_count() -> None:
    t = _two_turns()
    assert token_advantages(t, [0.5, -2.0]) == [0, 0, 0, 0.5, 0.5, 0, -2.0, -2.0, -2.0]
    with pytest.raises(ValueError, match="trajectory a: 3 turn advantages for 2 generated turns"):
        token_advantages(t, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"turn advantage \[1\] is not finite"):
        token_advantages(t, [1.0, float("nan")])


def test_batches_carry_per_target_advantages_and_keep_scalar_rows_scalar() -> None:
    a, b = _two_turns("a"), _two_turns("b")
    seqs, info = prepare_sequences([a, b], [[0.5, -2.0], 1.5], vocab_size=VOCAB, max_seq_len=None)
    assert info["batch/dropped_invalid"] == 0
    # targets are shifted by one: target j predicts token j + 1
    assert seqs[0].adv.tolist() == [0, 0, 0.5, 0.5, 0, -2.0, -2.0, -2.0]
    assert seqs[1].adv == 1.5
    mb = collate(seqs, torch.device("cpu"))
    assert mb.adv.shape == (2, 8)
    assert mb.adv[1].tolist() == [1.5] * 8
    scalar_only = collate(prepare_sequences([a, b], [0.5, 1.5], vocab_size=VOCAB, max_seq_len=None)[0],
                          torch.device("cpu"))
    assert scalar_only.adv.shape == (2,)  # the trajectory-level path is untouched
    # a list of the wrong length drops that trajectory only, counted
    seqs, info = prepare_sequences([a, b], [[1.0], 1.5], vocab_size=VOCAB, max_seq_len=None)
    assert info["batch/dropped_invalid"] == 1 and [s.traj_id for s in seqs] == ["b"]
    # per-turn values as an array are accepted; an advantage that is neither a number nor a list drops its trajectory
    seqs, info = prepare_sequences([a, b], [torch.tensor([0.5, -2.0]), "x"], vocab_size=VOCAB, max_seq_len=None)
    assert info["batch/dropped_invalid"] == 1 and seqs[0].adv.tolist()[2:4] == [0.5, 0.5]
    # segments: each segment gets its own slice of the per-token advantages
    s = multi_turn("s", "g", [("fixed", [1]), ("gen", [2, 3]), ("fixed", [10, 11]), ("gen", [4, 5])],
                   segments=[3, 4])
    seqs, _ = prepare_sequences([s], [[1.0, 3.0]], vocab_size=VOCAB, max_seq_len=None)
    assert [x.adv.tolist() for x in seqs] == [[1.0, 1.0], [0.0, 3.0, 3.0]]


def _cfg(loss: LossConfig) -> TrainerConfig:
    return TrainerConfig(device="cpu", optimizer=OptimizerConfig(lr=1e-3), loss=loss, micro_batch_size=2,
                         max_grad_norm=None)


def _capture_grads(tr: Trainer) -> dict[str, torch.Tensor]:
    grads: dict[str, torch.Tensor] = {}

    def fake_step(*a, **k):
        for n, p in tr.model.named_parameters():
            grads[n] = p.grad.detach().clone()

    tr.optimizer.step = fake_step  # type: ignore[method-assign]
    return grads


def _batch(tr: Trainer) -> list[Trajectory]:
    g = random.Random(3)
    trajs = []
    for i in range(3):
        parts = [("fixed", [g.randrange(1, 64) for _ in range(3)])]
        for _ in range(2 + i % 2):
            parts += [("gen", [g.randrange(1, 64) for _ in range(2 + i)]), ("fixed", [g.randrange(1, 64)])]
        trajs.append(multi_turn(f"t{i}", "g", parts, reward=float(i)))
    lp = tr.compute_logprobs(trajs)
    noise = random.Random(7)
    for i, t in enumerate(trajs):  # a behavior policy slightly off the trainer's
        t.logprobs = [float(lp[i, j - 1]) + 0.2 * noise.gauss(0, 1) if m else 0.0 for j, m in enumerate(t.loss_mask)]
    return trajs


LOSSES = [
    LossConfig(name="decoupled_ppo"),
    LossConfig(name="cispo", aggregation="seq_mean_token_sum"),
    LossConfig(name="gspo", ratio_base="behavior", clip_eps=0.5),
    LossConfig(name="topr", topr_signal="advantage", is_level="sequence"),
]


@pytest.mark.parametrize("loss", LOSSES, ids=lambda c: c.name)
def test_equal_turn_values_give_the_trajectory_level_update(tiny_model_dir: Path, loss: LossConfig) -> None:
    tr = Trainer(_cfg(loss), tiny_model_dir)
    grads = _capture_grads(tr)
    trajs = _batch(tr)
    scalar = [0.7, -1.3, 0.4]
    m_s = tr.train_step(trajs, scalar)
    g_s = dict(grads)
    m_t = tr.train_step(trajs, [[a] * len(turn_spans(t)) for a, t in zip(scalar, trajs)])
    g_t = dict(grads)
    assert m_t["loss"] == pytest.approx(m_s["loss"], rel=1e-6, abs=1e-7)
    assert m_t["adv/mean"] == pytest.approx(m_s["adv/mean"], rel=1e-6)
    assert sum(float(v.norm()) for v in g_s.values()) > 0
    for name in g_s:
        assert torch.allclose(g_t[name], g_s[name], rtol=1e-5, atol=1e-7), name


def test_each_turn_value_reaches_only_its_turn(tiny_model_dir: Path) -> None:
    """CISPO's loss is linear in the advantage (detached, clipped weight): the update for per-turn values
    ``[a, b, ...]`` is the sum of the updates with one turn's value each and the others 0, and differs from the
    update with the trajectory's scalar ``a``."""
    tr = Trainer(_cfg(LossConfig(name="cispo")), tiny_model_dir)
    grads = _capture_grads(tr)
    trajs = _batch(tr)
    full = [[0.9, -0.4, 1.1][: len(turn_spans(t))] for t in trajs]
    tr.train_step(trajs, full)
    g_full = dict(grads)
    total = {k: torch.zeros_like(v) for k, v in g_full.items()}
    for k in range(3):
        only = [[v if j == k else 0.0 for j, v in enumerate(row)] for row in full]
        if not any(any(r) for r in only):
            continue
        tr.train_step(trajs, only)
        for n in total:
            total[n] += grads[n]
    for n in g_full:
        assert torch.allclose(total[n], g_full[n], rtol=1e-4, atol=1e-6), n
    tr.train_step(trajs, [row[0] for row in full])
    assert any(not torch.allclose(grads[n], g_full[n], rtol=1e-3, atol=1e-5) for n in g_full)
