"""Streamed accumulation (start_step / accumulate / finish_step) against one train_step, the proximal-pass reuse,
the log-prob records, and the data-parallel hooks driven by two trainers in two threads."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import torch

from agentrl.trainer.config import LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.trainer import Trainer
from agentrl.trajectory import Group, Trajectory


def _groups(n_groups: int = 3, size: int = 3, seed: int = 0) -> list[Group]:
    g = random.Random(seed)
    groups = []
    for gi in range(n_groups):
        prompt = [g.randrange(1, 64) for _ in range(3 + gi)]
        trajs = []
        for j in range(size):
            n = g.randrange(2, 12)
            ids = prompt + [g.randrange(1, 64) for _ in range(n)]
            trajs.append(Trajectory(
                id=f"t{gi}-{j}", group_id=f"g{gi}", env_id="test", token_ids=ids,
                loss_mask=[0] * len(prompt) + [1] * n,
                logprobs=[0.0] * len(prompt) + [-4.2 + g.gauss(0, 0.5) for _ in range(n)],
                versions=[-1] * len(prompt) + [0] * n, prompt_len=len(prompt), reward=g.choice([-1.0, 0.0, 1.0, 2.0]),
            ))
        groups.append(Group(id=f"g{gi}", trajectories=trajs))
    return groups


def _cfg(**kw) -> TrainerConfig:
    kw.setdefault("optimizer", OptimizerConfig(lr=1e-3))
    return TrainerConfig(device="cpu", micro_batch_size=2, **kw)


def _params(tr: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.model.named_parameters()}


@pytest.mark.parametrize("loss", [
    LossConfig(name="decoupled_ppo", kl_coef=0.05, entropy_coef=0.01),
    LossConfig(name="gspo"),  # sequence-mean aggregation by default
    LossConfig(name="cispo", aggregation="seq_mean_token_sum"),
    LossConfig(name="topr"),
])
def test_streamed_step_equals_one_train_step(tiny_model_dir: Path, loss: LossConfig) -> None:
    groups = _groups()
    whole = Trainer(_cfg(loss=loss), tiny_model_dir)
    m_whole = whole.train_step(groups)
    streamed = Trainer(_cfg(loss=loss), tiny_model_dir)
    initial = _params(streamed)
    streamed.start_step()
    assert streamed.step_in_progress
    a = streamed.accumulate(groups[:1])
    assert a["accumulate/seqs"] == 3 and a["accumulate/loss_tokens"] > 0
    streamed.accumulate(groups[1:])
    m_stream = streamed.finish_step()
    assert not streamed.step_in_progress
    assert streamed.version == 1 and streamed.optimizer_steps == 1
    pw, ps = _params(whole), _params(streamed)
    moved = max(float((pw[k] - v).abs().max()) for k, v in initial.items())
    assert moved > 1e-4  # the step did change the weights
    for k in pw:
        assert torch.allclose(ps[k], pw[k], atol=1e-5, rtol=0), k
    for key in ("loss", "grad_norm", "reward/mean", "reward/std", "adv/max", "batch/loss_tokens", "batch/num_seqs",
                "entropy", "lr"):
        assert m_stream[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-6), key


def test_streamed_step_refusals(tiny_model_dir: Path, tmp_path: Path) -> None:
    groups = _groups()
    for kw in (dict(num_mini_batches=2), dict(ppo_epochs=2)):
        with pytest.raises(ValueError, match="num_mini_batches: 1 and ppo_epochs: 1"):
            Trainer(_cfg(**kw), tiny_model_dir).start_step()
    tr = Trainer(_cfg(), tiny_model_dir)
    with pytest.raises(RuntimeError, match="start_step"):
        tr.accumulate(groups)
    with pytest.raises(RuntimeError, match="start_step"):
        tr.finish_step()
    tr.start_step()
    with pytest.raises(RuntimeError, match="streamed step is open"):
        tr.start_step()
    with pytest.raises(RuntimeError, match="streamed step is open"):
        tr.train_step(groups)
    with pytest.raises(RuntimeError, match="streamed step is open"):
        tr.save_checkpoint(tmp_path / "ck")
    trajs = groups[0].trajectories
    tr.accumulate(trajs[:2])
    with pytest.raises(ValueError, match="already accumulated"):
        tr.accumulate(trajs[2:])  # the rest of group g0: its advantages would be computed without the first two
    with pytest.raises(ValueError, match="empty"):
        tr.accumulate([])
    tr.accumulate(groups[1:])  # the step is still usable after refused calls
    assert tr.finish_step()["version"] == 1


def test_a_group_with_no_trainable_trajectory_is_dropped_in_both_paths(tiny_model_dir: Path) -> None:
    """A group whose every trajectory is invalid (here NaN behavior log-probs, as a remote server may return) is
    dropped and counted by a streamed step exactly as by the whole-batch step, which trains on the rest; a step
    with nothing trainable at all is refused by both, and leaves the trainer as it was."""
    groups = _groups()
    for t in groups[1].trajectories:
        t.logprobs = [float("nan") if m else 0.0 for m in t.loss_mask]
    whole = Trainer(_cfg(), tiny_model_dir)
    m_whole = whole.train_step(groups)
    streamed = Trainer(_cfg(), tiny_model_dir)
    streamed.start_step()
    for g in groups:
        streamed.accumulate([g])
    m_stream = streamed.finish_step()
    assert m_whole["batch/dropped_invalid"] == m_stream["batch/dropped_invalid"] == 3
    assert m_stream["batch/num_seqs"] == m_whole["batch/num_seqs"] == 6
    for k, v in _params(whole).items():
        assert torch.allclose(_params(streamed)[k], v, atol=1e-5, rtol=0), k

    with pytest.raises(ValueError, match="no trainable trajectory"):
        whole.train_step(groups[1:2])
    streamed.start_step()
    streamed.accumulate(groups[1:2])
    with pytest.raises(ValueError, match="no trainable trajectory"):
        streamed.finish_step()
    assert not streamed.step_in_progress and streamed.version == whole.version == 1


def test_abort_leaves_weights_and_version(tiny_model_dir: Path) -> None:
    groups = _groups()
    tr = Trainer(_cfg(), tiny_model_dir)
    before = _params(tr)
    tr.start_step()
    tr.accumulate(groups[:2])
    tr.abort_step()
    assert tr.version == 0 and not tr.step_in_progress
    assert all(torch.equal(before[k], v) for k, v in _params(tr).items())
    tr.train_step(groups)  # and a normal step afterwards is the same as on a fresh trainer
    fresh = Trainer(_cfg(), tiny_model_dir)
    fresh.train_step(groups)
    for k, v in _params(fresh).items():
        assert torch.allclose(_params(tr)[k], v, atol=1e-6), k


def test_proximal_pass_is_reused_when_it_equals_the_current_policy(tiny_model_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    groups = _groups()
    calls: list[str] = []
    orig = Trainer._fill_logprobs

    def spy(self, seqs, model, attr, sampler=None):
        calls.append(attr)
        return orig(self, seqs, model, attr, sampler)

    monkeypatch.setattr(Trainer, "_fill_logprobs", spy)
    reused = Trainer(_cfg(), tiny_model_dir)
    m1 = reused.train_step(groups)
    assert calls == []  # 1 mini-batch, 1 epoch: no separate no-grad pass
    separate = Trainer(_cfg(), tiny_model_dir)
    monkeypatch.setattr(separate, "_prox_reusable", lambda: False)
    m2 = separate.train_step(groups)
    assert calls == ["prox"]
    for k, v in _params(separate).items():
        assert torch.allclose(_params(reused)[k], v, atol=1e-6), k
    assert m1["mismatch/kl_k3"] == pytest.approx(m2["mismatch/kl_k3"], rel=1e-4)
    calls.clear()
    Trainer(_cfg(num_mini_batches=2), tiny_model_dir).train_step(groups)
    assert calls == ["prox"]  # several optimizer steps: the proximal policy must be frozen first


@pytest.mark.parametrize("kw", [dict(), dict(num_mini_batches=2), dict(stream=True)])
def test_logprob_records_are_the_step_start_logprobs(tiny_model_dir: Path, kw: dict) -> None:
    groups = _groups()
    trajs = {t.id: t for g in groups for t in g.trajectories}
    stream = kw.pop("stream", False)
    tr = Trainer(_cfg(record_logprobs=4, temperature=0.7, **kw), tiny_model_dir)
    assert tr.take_logprob_records() == []
    expected = tr.compute_logprobs(list(trajs.values()))  # weights of version 0, at temperature 0.7
    index = {tid: i for i, tid in enumerate(trajs)}
    if stream:
        tr.start_step()
        for g in groups:
            tr.accumulate([g])
        tr.finish_step()
    else:
        tr.train_step(groups)
    recs = tr.take_logprob_records()
    assert len(recs) == 4 and len({r["trajectory_id"] for r in recs}) == 4
    for r in recs:
        assert set(r) == {"trajectory_id", "version", "logprobs"}
        t = trajs[r["trajectory_id"]]
        assert r["version"] == 0 and len(r["logprobs"]) == len(t.token_ids) - 1
        ref = expected[index[t.id], : len(t.token_ids) - 1]
        assert torch.allclose(torch.tensor(r["logprobs"]), ref, atol=1e-5)
    assert tr.take_logprob_records() == []  # cleared on take
    tr.train_step(groups) if not stream else (tr.start_step(), tr.accumulate(groups), tr.finish_step())
    assert {r["version"] for r in tr.take_logprob_records()} == {1}


def test_no_records_unless_asked(tiny_model_dir: Path) -> None:
    tr = Trainer(_cfg(), tiny_model_dir)
    tr.train_step(_groups())
    assert tr.take_logprob_records() == []


# ------------------------------------------------------------------------ data parallelism through the hooks
class _Exchange:
    """An in-process stand-in for torch.distributed collectives between threads (tests only)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=120)
        self.slots: list = [None] * n

    def gather(self, rank: int, value):
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class _ThreadReducer:
    def __init__(self, ex: _Exchange, rank: int) -> None:
        self.ex, self.rank = ex, rank

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        parts = self.ex.gather(self.rank, values)
        return {k: sum(p.get(k, 0.0) for p in parts) for k in set().union(*parts)}

    def max(self, values: dict[str, float]) -> dict[str, float]:
        parts = self.ex.gather(self.rank, values)
        return {k: max(p.get(k, float("-inf")) for p in parts) for k in set().union(*parts)}


@pytest.mark.parametrize("loss,tree", [(LossConfig(name="decoupled_ppo"), False), (LossConfig(name="gspo"), False),
                                       (LossConfig(name="decoupled_ppo"), True)])
def test_two_workers_through_the_reducer_hook_equal_one_worker(tiny_model_dir: Path, loss: LossConfig,
                                                               tree: bool) -> None:
    """Two workers on uneven shards equal one worker; with ``tree`` the workers use the prefix-tree layout and the
    single worker the flat one (issue 27: the tree layout through two data-parallel ranks)."""
    groups = _groups(n_groups=3, size=3)
    from agentrl.trainer.advantages import compute_advantages

    flat = [t for g in groups for t in g.trajectories]
    adv = compute_advantages(groups, _cfg().advantage)
    single = Trainer(_cfg(loss=loss), tiny_model_dir)
    m_single = single.train_step(flat, adv)

    ex = _Exchange(2)
    workers = [Trainer(_cfg(loss=loss, prefix_tree=tree), tiny_model_dir) for _ in range(2)]
    shards = [(flat[:2], adv[:2]), (flat[2:], adv[2:])]  # uneven shards
    results: list = [None, None]
    for rank, w in enumerate(workers):
        w.reducer = _ThreadReducer(ex, rank)

        def reduce_grads(w=w, rank=rank) -> None:
            grads = [p.grad for p in w._params()]
            parts = ex.gather(rank, [g.clone() for g in grads])  # copies: the peer adds them in place
            for i, g in enumerate(grads):
                g.copy_(sum(p[i] for p in parts))

        w._reduce_gradients = reduce_grads  # type: ignore[method-assign]

    def run(rank: int) -> None:
        results[rank] = workers[rank].train_step(*shards[rank])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(r is not None for r in results)
    for w in workers:
        for k, v in _params(single).items():
            assert torch.allclose(_params(w)[k], v, atol=1e-5, rtol=0), k
    for key in ("loss", "grad_norm", "reward/mean", "batch/loss_tokens", "entropy", "staleness/mean"):
        assert results[0][key] == pytest.approx(m_single[key], rel=1e-4, abs=1e-6), key
        assert results[1][key] == pytest.approx(results[0][key], rel=1e-6, abs=1e-9), key
    if tree:  # the counts are summed over the ranks
        assert results[0]["batch/flat_tokens"] == m_single["batch/num_tokens"]
        assert results[0]["batch/tree_tokens"] < results[0]["batch/flat_tokens"]


def test_two_workers_with_two_mini_batches_take_the_single_trainers_steps(tiny_model_dir: Path) -> None:
    """``num_mini_batches: 2`` over two workers holding interleaved shards (with their batch positions): both take
    the single trainer's two optimizer steps, on its two mini-batches, whatever the shards."""
    from agentrl.trainer.advantages import compute_advantages

    groups = _groups(n_groups=3, size=3)
    flat = [t for g in groups for t in g.trajectories]
    adv = compute_advantages(groups, _cfg().advantage)
    single = Trainer(_cfg(num_mini_batches=2), tiny_model_dir)
    m_single = single.train_step(flat, adv)
    assert m_single["optimizer_steps"] == 2

    ex = _Exchange(2)
    workers = [Trainer(_cfg(num_mini_batches=2), tiny_model_dir) for _ in range(2)]
    positions = [[0, 3, 4, 8], [1, 2, 5, 6, 7]]  # each mini-batch (0-4, 5-8) split unevenly between the workers
    results: list = [None, None]
    for rank, w in enumerate(workers):
        w.reducer = _ThreadReducer(ex, rank)

        def reduce_grads(w=w, rank=rank) -> None:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in w._params()]
            parts = ex.gather(rank, [g.clone() for g in grads])
            for p, i in zip(w._params(), range(len(grads))):
                p.grad = sum(q[i] for q in parts)

        w._reduce_gradients = reduce_grads  # type: ignore[method-assign]

    def run(rank: int) -> None:
        pos = positions[rank]
        results[rank] = workers[rank].train_step([flat[i] for i in pos], [adv[i] for i in pos], positions=pos)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(r is not None for r in results)
    for w in workers:
        for k, v in _params(single).items():
            assert torch.allclose(_params(w)[k], v, atol=1e-5, rtol=0), k
    for key in ("loss", "grad_norm", "optimizer_steps", "batch/loss_tokens"):
        assert results[0][key] == pytest.approx(m_single[key], rel=1e-4, abs=1e-6), key


def test_a_refused_accumulate_call_adds_nothing(tiny_model_dir: Path) -> None:
    groups = _groups()
    tr = Trainer(_cfg(), tiny_model_dir)
    tr.start_step()
    with pytest.raises(ValueError, match="advantages"):
        tr.accumulate(groups[:1], [1.0])  # misaligned: 3 trajectories
    assert tr.accumulate(groups[:1])["accumulate/seqs"] == 3  # the group was not registered by the refused call
    m = tr.finish_step()
    assert m["batch/num_seqs"] == 3
