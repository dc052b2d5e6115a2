"""From trajectories to model inputs: validated sequences, length-sorted micro-batches, padded or packed layouts.

Data layout. A trajectory of ``n`` tokens gives ``n - 1`` target positions: position ``t`` predicts
``token_ids[t + 1]`` from ``token_ids[: t + 1]``, so every per-token field of the trajectory is shifted by one
(``loss_mask[1:]``, ``logprobs[1:]``, ``versions[1:]``).

A :class:`MicroBatch` holds ``b`` sequences in one of three layouts, which give the same log-probs:

- padded: ``input_ids [b, L]`` right-padded with token 0 and no attention mask. Causal attention makes every real
  position attend only to earlier positions of its own row, which are all real, so a 2-D padding mask would change
  nothing but the speed (it forces a materialised mask and, on GPUs, kernels that re-plan per shape).
- packed: ``input_ids [1, sum n]``, the sequences one after another, with ``position_ids`` restarting at 0 for each;
  transformers detects the restarts (when no attention mask and no cache is passed) and builds the block-diagonal
  causal mask, so no token attends across sequences.
- tree (``prefix_tree``): ``input_ids [1, U]``, one entry per distinct prefix of the micro-batch's sequences, with
  depth position ids and a tree attention mask (:mod:`agentrl.trainer.prefix_tree`); ``src`` points each target at
  the node of its prefix, so a prefix that several sequences share is computed once.

Either way the hidden states are flattened and only the ``N = sum (n_i - 1)`` positions that have a target are
kept (``src`` indexes them), which is all the log-prob head ever sees: padding costs no vocabulary projection.
Per-target tensors the loss reads (mask, behavior/proximal/reference log-probs) stay padded ``[b, T]`` with
``T = max n_i - 1``; :meth:`MicroBatch.scatter` places flat ``[N]`` values there.

Advantages. A trajectory's advantage is a scalar (``Seq.adv`` a float; ``MicroBatch.adv`` ``[b]``, broadcast by
the loss: exactly the trajectory-level path) or one value per turn, spread over the turn's generated tokens
(:func:`agentrl.trainer.advantages.token_advantages`; ``Seq.adv`` then a ``[n-1]`` per-target tensor). A micro-batch
with any per-token sequence carries ``adv [b, T]``, scalar rows filled with their value.

Segments. A trajectory recorded as several segments (template mode ``split``, a gateway session whose harness
rewrote history) gives one sequence per segment, each in its own context, all with the trajectory's ``unit``. The
segments of a trajectory always share a micro-batch (and so a mini-batch and a rank), and
``MicroBatch.seq_index`` tells the loss which rows form one trajectory: sequence-level terms are per trajectory,
never per segment.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.trainer.advantages import as_advantage, token_advantages
from agentrl.trainer.prefix_tree import build_tree
from agentrl.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass
class Seq:
    """One trajectory prepared for training. Token tensors have length ``n``; per-target tensors ``n - 1``."""

    ids: Tensor  # [n] long
    mask: Tensor  # [n-1] float, loss mask of the targets
    behav: Tensor  # [n-1] float, engine log-probs of the targets (0 where mask is 0)
    versions: Tensor  # [n-1] long, -1 on non-generated targets
    adv: float | Tensor  # scalar, or [n-1] per target (per-turn advantages; see module docstring)
    reward: float
    traj_id: str = ""
    # The trajectory this sequence is a segment of (its index in the batch): the segments of one trajectory share
    # it, and every sequence-level term (normaliser, sequence ratio, sequence IS weight) is taken over all of them.
    # None: a sequence of its own.
    unit: int | None = None
    prox: Tensor | None = None  # [n-1]
    ref: Tensor | None = None  # [n-1]

    @property
    def length(self) -> int:
        return int(self.ids.numel())

    @property
    def loss_tokens(self) -> int:
        return int(self.mask.sum().item())


def prepare_sequences(
    trajectories: Sequence[Trajectory], advantages: Sequence[float | Sequence[float]] | None, *, vocab_size: int,
    max_seq_len: int | None, positions: Sequence[int] | None = None,
) -> tuple[list[Seq], dict[str, float]]:
    """Validates and tensorises a batch. Invalid trajectories (misaligned fields, token ids outside the vocabulary,
    fewer than 2 tokens, non-finite advantage/reward/behavior log-prob, a per-turn advantage list whose length is
    not the number of generated turns) are dropped with a warning and counted in
    ``batch/dropped_invalid``; trajectories longer than ``max_seq_len`` lose their tail (``batch/truncated_seqs``).
    Each sequence's ``unit`` is its trajectory's index in the batch, or ``positions[i]`` when given (a shard's
    indices in the whole batch). Returns ``(seqs, info)``; raises ``ValueError`` if nothing trainable remains or
    ``advantages`` (or ``positions``) is misaligned."""
    if advantages is not None and len(advantages) != len(trajectories):
        raise ValueError(f"got {len(advantages)} advantages for {len(trajectories)} trajectories")
    if positions is not None and len(positions) != len(trajectories):
        raise ValueError(f"got {len(positions)} positions for {len(trajectories)} trajectories")
    seqs: list[Seq] = []
    dropped = truncated = 0
    for i, t in enumerate(trajectories):
        try:
            t.validate()
            if len(t.token_ids) < 2:
                raise ValueError(f"trajectory {t.id}: needs at least 2 tokens, has {len(t.token_ids)}")
            bad = [x for x in t.token_ids if not 0 <= x < vocab_size]
            if bad:
                raise ValueError(f"trajectory {t.id}: token id {bad[0]} outside vocabulary [0, {vocab_size})")
            raw = 0.0 if advantages is None else as_advantage(advantages[i])
            per_token = token_advantages(t, raw) if isinstance(raw, list) else None
            adv = 0.0 if isinstance(raw, list) else raw
            if not math.isfinite(adv) or not math.isfinite(float(t.reward)):
                raise ValueError(f"trajectory {t.id}: non-finite advantage {adv} or reward {t.reward}")
            behav = [float(x) for x in t.logprobs]
            if any(not math.isfinite(x) for x, m in zip(behav, t.loss_mask) if m):
                raise ValueError(f"trajectory {t.id}: non-finite behavior logprob on a generated token")
        except ValueError as e:
            log.warning("dropping trajectory from the batch: %s", e)
            dropped += 1
            continue
        # A segmented trajectory (template mode "split") is one sequence per segment, each with exactly its own
        # context and the trajectory's advantage.
        unit = i if positions is None else int(positions[i])
        for a, b in t.segment_slices():
            n = b - a
            if n < 2:
                continue
            if max_seq_len is not None and n > max_seq_len:
                n = max_seq_len
                truncated += 1
            lm = t.loss_mask[a + 1:a + n]
            seqs.append(Seq(
                ids=torch.tensor(t.token_ids[a:a + n], dtype=torch.long),
                mask=torch.tensor(lm, dtype=torch.float32),
                behav=torch.tensor([x if m else 0.0 for x, m in zip(behav[a + 1:a + n], lm)], dtype=torch.float32),
                versions=torch.tensor(t.versions[a + 1:a + n], dtype=torch.long),
                adv=adv if per_token is None else torch.tensor(per_token[a + 1:a + n], dtype=torch.float32),
                reward=float(t.reward), traj_id=str(t.id), unit=unit,
            ))
    if not seqs:
        raise ValueError(f"no trainable trajectory in a batch of {len(trajectories)} ({dropped} invalid)")
    return seqs, {"batch/dropped_invalid": float(dropped), "batch/truncated_seqs": float(truncated)}


def scoring_sequences(ids: Sequence[Sequence[int]], vocab_size: int) -> list[Seq]:
    """Plain token-id lists as sequences to score (every target position counts). Raises ``ValueError`` naming
    the first sequence that is too short or holds a token outside the vocabulary."""
    out = []
    for i, x in enumerate(ids):
        if len(x) < 2:
            raise ValueError(f"sequence {i}: needs at least 2 tokens, has {len(x)}")
        if any(not 0 <= v < vocab_size for v in x):
            raise ValueError(f"sequence {i}: token id outside vocabulary [0, {vocab_size})")
        n = len(x)
        out.append(Seq(ids=torch.tensor(list(x), dtype=torch.long), mask=torch.ones(n - 1), behav=torch.zeros(n - 1),
                       versions=torch.zeros(n - 1, dtype=torch.long), adv=0.0, reward=0.0, traj_id=str(i)))
    return out


def units(seqs: list[Seq]) -> list[list[Seq]]:
    """``seqs`` grouped by trajectory: runs of consecutive sequences with the same ``unit`` (the segments of one
    trajectory, which :func:`prepare_sequences` emits together), in order."""
    out: list[list[Seq]] = []
    for s in seqs:
        if out and s.unit is not None and out[-1][0].unit == s.unit:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def split_micro(seqs: list[Seq], max_seqs: int, max_tokens: int | None, *, packing: bool = False) -> list[list[Seq]]:
    """Groups ``seqs`` (sorted by length, longest first, so rows of similar length share a micro-batch) into
    micro-batches of at most ``max_seqs`` sequences and at most ``max_tokens`` tokens: padded tokens
    (``count x longest``) in the padded layout, the sum of lengths when packing. The segments of one trajectory
    stay in one micro-batch (its sequence-level terms need all of them in one forward); a single longer sequence,
    or a trajectory past the limits, stays alone. Every sequence lands in exactly one micro-batch."""
    us = units(seqs)
    longest = [max(s.length for s in u) for u in us]
    out: list[list[Seq]] = []
    cur: list[Seq] = []
    cur_max = cur_sum = 0
    for i in sorted(range(len(us)), key=lambda i: -longest[i]):
        u = us[i]
        size = sum(s.length for s in u)
        cost = (cur_sum + size) if packing else max(cur_max, longest[i]) * (len(cur) + len(u))
        if cur and (len(cur) + len(u) > max_seqs or (max_tokens is not None and cost > max_tokens)):
            out.append(cur)
            cur, cur_max, cur_sum = [], 0, 0
        cur.extend(u)
        cur_max = max(cur_max, longest[i])
        cur_sum += size
    if cur:
        out.append(cur)
    return out


def even_parts(items: list, k: int) -> list[list]:
    """Splits ``items`` into ``min(k, len(items))`` consecutive parts whose sizes differ by at most one."""
    if not items:
        return []
    k = min(k, len(items))
    size, rem = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < rem else 0)
        out.append(items[start:end])
        start = end
    return out


def mini_batches(seqs: list[Seq], k: int) -> list[list[Seq]]:
    """Splits ``seqs`` into ``min(k, trajectories)`` consecutive parts whose numbers of trajectories differ by at
    most one (a trajectory's segments stay together)."""
    return [[s for u in part for s in u] for part in even_parts(units(seqs), k)]


def pad_rows(rows: list[Tensor], length: int, value: float | int, dtype: torch.dtype) -> Tensor:
    """Stacks 1-D ``rows`` into ``[len(rows), length]``, right-padded with ``value``."""
    out = torch.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out


@dataclass
class MicroBatch:
    """``b`` sequences laid out for one forward pass (see module docstring)."""

    seqs: list[Seq]
    input_ids: Tensor  # [r, L]: r = b (padded) or 1 (packed)
    position_ids: Tensor | None  # [1, L] restarting per sequence when packed; None = 0..L-1 per row
    src: Tensor  # [N] long: rows of the flattened [r * L, H] hidden states that have a target
    targets: Tensor  # [N] long: the token each of those positions predicts
    rows: Tensor  # [N] long: sequence index in 0..b-1
    cols: Tensor  # [N] long: target position 0..n_i-2 in that sequence
    mask: Tensor  # [b, T]
    behav: Tensor  # [b, T]
    adv: Tensor  # [b]
    reward: Tensor  # [b]
    prox: Tensor | None  # [b, T]
    ref: Tensor | None  # [b, T]
    num_tokens: int  # real tokens, sum n_i
    # [b] long: the sequence (trajectory) each row belongs to, 0..S-1; None when every row is its own sequence
    seq_index: Tensor | None = None
    # tree layout only: [L] long, one past the last node of each node's subtree (Tree.end): node i attends to node
    # j iff j <= i < tree_end[j] (itself and its ancestors); the model's mask is built from it per forward
    tree_end: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.mask.shape[0]), int(self.mask.shape[1])

    def scatter(self, flat: Tensor) -> Tensor:
        """Places per-target values ``[N]`` into ``[b, T]`` (0 elsewhere); differentiable in ``flat``."""
        out = flat.new_zeros(self.shape)
        return out.index_put((self.rows, self.cols), flat)


def collate(seqs: list[Seq], device: torch.device, *, packing: bool = False, tree: bool = False) -> MicroBatch:
    """Lays ``seqs`` out as one :class:`MicroBatch` on ``device`` (padded, packed into one row, or, with ``tree``,
    one row of distinct prefixes, which overrides ``packing``)."""
    lengths = [s.length for s in seqs]
    T = max(lengths) - 1
    rows = torch.cat([torch.full((n - 1,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    cols = torch.cat([torch.arange(n - 1) for n in lengths])
    targets = torch.cat([s.ids[1:] for s in seqs])
    tree_end = None
    if tree:
        t = build_tree([s.ids for s in seqs])
        input_ids, position_ids = t.tokens[None], t.depth[None]
        src = torch.cat(t.paths)
        tree_end = t.end.to(device)
    elif packing:
        input_ids = torch.cat([s.ids for s in seqs])[None]
        position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
        starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
        src = starts[rows] + cols
    else:
        L = max(lengths)
        input_ids = pad_rows([s.ids for s in seqs], L, 0, torch.long)
        position_ids = None
        src = rows * L + cols

    def opt(name: str) -> Tensor | None:
        vals = [getattr(s, name) for s in seqs]
        if any(v is None for v in vals):
            return None
        return pad_rows(vals, T, 0.0, torch.float32).to(device)

    return MicroBatch(
        seqs=list(seqs),
        input_ids=input_ids.to(device),
        position_ids=None if position_ids is None else position_ids.to(device),
        src=src.to(device), targets=targets.to(device), rows=rows.to(device), cols=cols.to(device),
        mask=pad_rows([s.mask for s in seqs], T, 0.0, torch.float32).to(device),
        behav=pad_rows([s.behav for s in seqs], T, 0.0, torch.float32).to(device),
        adv=_adv(seqs, T).to(device),
        reward=torch.tensor([s.reward for s in seqs], dtype=torch.float32, device=device),
        prox=opt("prox"), ref=opt("ref"),
        num_tokens=sum(lengths), seq_index=_seq_index(seqs, device), tree_end=tree_end,
    )


def _adv(seqs: list[Seq], T: int) -> Tensor:
    """``[b]`` when every sequence has a scalar advantage (the trajectory-level path, unchanged), else ``[b, T]``."""
    if all(not isinstance(s.adv, Tensor) for s in seqs):
        return torch.tensor([float(s.adv) for s in seqs], dtype=torch.float32)
    rows = [s.adv if isinstance(s.adv, Tensor) else torch.full((s.length - 1,), float(s.adv)) for s in seqs]
    return pad_rows(rows, T, 0.0, torch.float32)


def _seq_index(seqs: list[Seq], device: torch.device) -> Tensor | None:
    keys = [("row", i) if s.unit is None else ("unit", s.unit) for i, s in enumerate(seqs)]
    ids: dict[tuple, int] = {}
    index = [ids.setdefault(k, len(ids)) for k in keys]
    if len(ids) == len(seqs):
        return None
    return torch.tensor(index, dtype=torch.long, device=device)
