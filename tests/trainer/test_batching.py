"""Micro-batch construction on its own: token budgets, every sequence exactly once, and the index maps of the
padded and packed layouts."""

from __future__ import annotations

import torch

from agentrl.trainer.batching import Seq, collate, mini_batches, split_micro


def _seq(n: int, tag: int = 0) -> Seq:
    ids = torch.arange(n) + 100 * tag
    return Seq(ids=ids, mask=torch.ones(n - 1), behav=torch.zeros(n - 1), versions=torch.zeros(n - 1, dtype=torch.long),
               adv=float(tag), reward=0.0, traj_id=f"s{tag}")


def test_split_respects_budgets_and_keeps_every_sequence_once() -> None:
    seqs = [_seq(n, i) for i, n in enumerate([5, 30, 12, 7, 30, 2, 19])]
    for packing in (False, True):
        for max_seqs, max_tokens in ((3, None), (8, 40), (8, 10), (1, None)):
            parts = split_micro(seqs, max_seqs, max_tokens, packing=packing)
            assert sorted(s.traj_id for p in parts for s in p) == sorted(s.traj_id for s in seqs)
            for p in parts:
                assert len(p) <= max_seqs
                cost = sum(s.length for s in p) if packing else max(s.length for s in p) * len(p)
                assert max_tokens is None or cost <= max_tokens or len(p) == 1  # a longer sequence stays alone
            lengths = [s.length for p in parts for s in p]
            assert lengths == sorted(lengths, reverse=True)  # length-sorted: similar lengths share a micro-batch
    assert [len(m) for m in mini_batches(seqs, 3)] == [3, 2, 2]


def test_padded_and_packed_layouts_index_the_same_targets() -> None:
    seqs = [_seq(4, 1), _seq(6, 2), _seq(2, 3)]
    pad = collate(seqs, torch.device("cpu"))
    pack = collate(seqs, torch.device("cpu"), packing=True)
    assert pad.input_ids.shape == (3, 6) and pad.position_ids is None
    assert pack.input_ids.shape == (1, 12)
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1]]
    for mb in (pad, pack):
        flat_ids = mb.input_ids.reshape(-1)
        # each kept position's input token is the one before its target
        expected_inputs = torch.cat([s.ids[:-1] for s in seqs])
        assert torch.equal(flat_ids[mb.src], expected_inputs)
        assert torch.equal(mb.targets, torch.cat([s.ids[1:] for s in seqs]))
        assert mb.shape == (3, 5) and mb.num_tokens == 12
    vals = torch.arange(9, dtype=torch.float32, requires_grad=True)
    placed = pad.scatter(vals)
    assert placed.tolist() == [[0, 1, 2, 0, 0], [3, 4, 5, 6, 7], [8, 0, 0, 0, 0]]
    placed.sum().backward()
    assert torch.equal(vals.grad, torch.ones(9))
