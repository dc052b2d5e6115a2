"""The prefix-tree (shared-prefix) layout of a micro-batch: every token prefix that several sequences share is
computed once.

Flow. :func:`build_tree` inserts the input tokens of each sequence (``ids[:-1]``: the last token predicts nothing,
so its hidden state is never read) into a trie over token ids. A trie node is one distinct prefix; its token is the
prefix's last token and its depth (0-based) the prefix's length minus one. The micro-batch then holds one row of
the ``U`` nodes (``input_ids [1, U]``), ``position_ids`` = each node's depth (so positions restart on each branch
exactly as in the sequence's own row), and a ``[1, 1, U, U]`` boolean attention mask that lets node ``i`` attend
to node ``j`` iff ``j`` is ``i`` or one of its ancestors. A node's hidden state therefore depends on exactly the
tokens and positions of its own prefix, as in the flat layout, and the log-prob of sequence ``k``'s target ``t`` is
read at the node of its prefix ``ids[: t + 1]`` (``src``). Shared nodes receive the sum of the gradients of every
sequence that reads them, which is the flat layout's gradient, so log-probs, entropy, loss and gradients agree up
to float rounding.

Prefixes are found wherever they occur: the prompt of a group's samples, the history that every later segment of a
split-mode trajectory repeats, a gateway session that forked, identical prompts across groups. Only sequences of
one micro-batch share nodes, so :func:`tree_micro_batches` orders trajectories by their token ids (sharers become
neighbours) and budgets a micro-batch by its distinct prefixes, the tokens it computes.

Invariants: nodes are numbered in depth-first preorder (sequences inserted in lexicographic order), so a parent
precedes its children, every subtree is a contiguous range ``j .. end[j] - 1``, and the whole ancestor relation is
``O(U)`` data (``j <= i < end[j]``); every sequence's path is a chain of parent links from a root. The attention runs
through transformers' own 4-D custom-mask support (:func:`tree_attention_mask`, built from ``end`` when the forward
runs): on the CPU with the dense mask (``U * U`` bytes), SDPA with a boolean mask or eager attention with an
additive one, exact; on CUDA the models load with ``flex_attention`` (:func:`attention_impl_for`) and take a block
mask built from the same ranges (:func:`tree_block_mask`), which skips the blocks with no ancestor pair and never
holds the dense mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # batching imports this module
    from torch.nn.attention.flex_attention import BlockMask

    from agentrl.trainer.batching import Seq


@dataclass
class Tree:
    """The trie of a micro-batch's sequences (see module docstring). Nodes are numbered in depth-first preorder, so
    node ``j``'s subtree is the range ``j .. end[j] - 1`` and ``j`` is ``i`` or an ancestor of ``i`` iff
    ``j <= i < end[j]``."""

    tokens: Tensor  # [U] long: each node's token
    depth: Tensor  # [U] long: each node's position id
    end: Tensor  # [U] long: one past the last node of each node's subtree
    paths: list[Tensor]  # per sequence, [n_i - 1] long: the node of each input prefix ids[: t + 1]

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    @property
    def mask(self) -> Tensor:
        """``[U, U]`` bool: ``mask[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i`` (``U * U`` bytes)."""
        return ancestor_mask(self.end)


def build_tree(seqs: list[Tensor]) -> Tree:
    """The trie of the input prefixes of ``seqs`` (1-D token-id tensors of length >= 2)."""
    inputs = [ids[:-1].tolist() for ids in seqs]
    # Inserted in lexicographic order, a sequence branches off below its predecessor's path and every node created
    # since that branch point lies below it too, so creation order is a depth-first preorder.
    order = sorted(range(len(seqs)), key=inputs.__getitem__)
    child: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    paths: list[Tensor] = [torch.empty(0)] * len(seqs)
    for k in order:
        node, path = -1, []
        for d, tok in enumerate(inputs[k]):
            nxt = child.get((node, tok))
            if nxt is None:
                nxt = child[(node, tok)] = len(tokens)
                tokens.append(tok)
                depth.append(d)
                parent.append(node)
            node = nxt
            path.append(node)
        paths[k] = torch.tensor(path, dtype=torch.long)
    size = [1] * len(tokens)
    for i in range(len(tokens) - 1, 0, -1):  # children follow their parent
        if parent[i] >= 0:
            size[parent[i]] += size[i]
    end = torch.arange(len(tokens)) + torch.tensor(size, dtype=torch.long)
    return Tree(tokens=torch.tensor(tokens, dtype=torch.long), depth=torch.tensor(depth, dtype=torch.long),
                end=end, paths=paths)


def ancestor_mask(end: Tensor) -> Tensor:
    """``[U, U]`` bool from a tree's ``end``: ``mask[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``."""
    ar = torch.arange(end.numel(), device=end.device)
    return (ar[None, :] <= ar[:, None]) & (ar[:, None] < end[None, :])


def tree_block_mask(end: Tensor) -> BlockMask:
    """The tree's ancestor relation as a ``flex_attention`` block mask: ``kv <= q < end[kv]``, evaluated per block
    (on CUDA compiled, so the dense ``U * U`` mask is never materialised; blocks with no ancestor pair are
    skipped by the kernel, which is what makes wide trees cheap)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def ancestor(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (kv <= q) & (q < end[kv])

    u = int(end.numel())
    return create_block_mask(ancestor, B=None, H=None, Q_LEN=u, KV_LEN=u, device=end.device,
                             _compile=end.device.type == "cuda")


def attention_impl_for(device: torch.device, tree: bool) -> str | None:
    """The attention implementation to load models with: ``flex_attention`` for the tree layout on CUDA (block
    sparse, no dense mask), else ``None`` (the library's default, SDPA, with the dense mask on the CPU)."""
    return "flex_attention" if tree and device.type == "cuda" else None


def tree_attention_mask(model: torch.nn.Module, end: Tensor, dtype: torch.dtype) -> Tensor | BlockMask:
    """The tree's ancestor mask (from its ``end``) in the form the model's attention implementation takes as a
    custom 4-D mask: a block mask for ``flex_attention``, a ``[1, 1, U, U]`` boolean (``True`` = attend) for SDPA,
    an additive one (0 / dtype minimum) for eager attention. Raises ``ValueError`` for an implementation that
    takes no custom mask (flash attention)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
    if impl == "flex_attention":
        return tree_block_mask(end)
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"prefix_tree: the model's attention implementation {impl!r} takes no custom 4-D "
                         "attention mask; load it with attn_implementation sdpa, eager or flex_attention, or set "
                         "prefix_tree: false")
    mask = ancestor_mask(end)[None, None]
    if impl == "sdpa":
        return mask
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


class _PrefixCount:
    """Distinct input prefixes of the sequences added so far (a trie without tensors), with a tentative add."""

    def __init__(self) -> None:
        self.child: dict[tuple[int, int], int] = {}

    def add(self, seqs: Sequence[Tensor | Sequence[int]]) -> list[tuple[int, int]]:
        """Inserts the input prefixes of ``seqs`` (token-id tensors or lists); returns the trie edges this created
        (for :meth:`undo`)."""
        made = []
        for ids in seqs:
            node = -1
            for tok in (ids[:-1].tolist() if isinstance(ids, Tensor) else ids[:-1]):
                nxt = self.child.get((node, tok))
                if nxt is None:
                    nxt = self.child[(node, tok)] = len(self.child)
                    made.append((node, tok))
                node = nxt
        return made

    def undo(self, made: list[tuple[int, int]]) -> None:
        for key in made:
            del self.child[key]

    def __len__(self) -> int:
        return len(self.child)


def tree_micro_batches(units: list[list[Seq]], max_seqs: int, max_tokens: int | None) -> list[list[Seq]]:
    """Micro-batches for the tree layout: trajectories (``units``, each the list of its segments, which stay
    together) in the lexicographic order of their token ids, so those that share a prefix are neighbours and land in
    one micro-batch, then filled greedily up to ``max_seqs`` sequences and ``max_tokens`` *distinct* input prefixes
    (the tokens the tree layout computes). A single unit past the limits stays alone; every sequence lands in
    exactly one micro-batch."""
    order = sorted(range(len(units)), key=lambda i: units[i][0].ids.tolist())
    out: list[list[Seq]] = []
    cur: list[Seq] = []
    count = _PrefixCount()
    for i in order:
        u = units[i]
        made = count.add([s.ids for s in u])
        if cur and (len(cur) + len(u) > max_seqs or (max_tokens is not None and len(count) > max_tokens)):
            count.undo(made)
            out.append(cur)
            cur, count = [], _PrefixCount()
            count.add([s.ids for s in u])
        cur.extend(u)
    if cur:
        out.append(cur)
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _balanced_runs(own: list[int], gain: list[int], n: int) -> list[int]:
    """Starts of at most ``n`` consecutive runs of items that minimise the largest run cost, where a run
    ``a .. b - 1`` costs ``own[a] + sum(own[k] - gain[k] for k in a + 1 .. b - 1)``. Greedy runs (each as long as it
    fits a limit) are optimal for that limit, since a run's suffix never costs more than the run; the smallest
    feasible limit is found by bisection."""
    def runs(limit: int) -> list[int]:
        starts, load = [0], own[0]
        for k in range(1, len(own)):
            if load + own[k] - gain[k] <= limit:
                load += own[k] - gain[k]
            else:
                starts.append(k)
                load = own[k]
        return starts

    lo, hi = max(own), own[0] + sum(o - g for o, g in zip(own[1:], gain[1:]))
    while lo < hi:
        mid = (lo + hi) // 2
        if len(runs(mid)) <= n:
            hi = mid
        else:
            lo = mid + 1
    return runs(lo)


def shard_by_tree(units: list[list[list[int]]], n: int) -> list[list[int]]:
    """Splits trajectories (``units``: each the token-id lists of its segments) into ``n`` shards of indices for
    data-parallel ranks, so that trajectories sharing a prefix land on one rank and the prefix is computed once
    across ranks. The trajectories are ordered by their first segment's token ids (sharers become neighbours, as
    in :func:`tree_micro_batches`) and the order is cut into ``n`` consecutive runs balanced by *computed* tokens:
    a run costs its distinct input prefixes, counted as each trajectory's own distinct prefixes less the prefix its
    first segment shares with its predecessor's, so a cut between neighbours that share ``g`` tokens computes them
    twice. Three plans compete: no cut, cuts only where neighbours share the least (the prefix the whole batch
    shares, usually group boundaries), and cuts anywhere; the smallest busiest-rank load plus duplicated tokens per
    rank wins, so a group is split only when that pays (a group larger than a rank's share, with a short prompt).
    Each shard keeps the batch's order; shards may be empty (fewer trajectories than ranks)."""
    if n < 1:
        raise ValueError(f"shard_by_tree: n must be >= 1, got {n}")
    order = sorted(range(len(units)), key=lambda i: units[i][0] if units[i] else [])
    if not order:
        return [[] for _ in range(n)]
    own, gain = [], []
    for k, i in enumerate(order):
        count = _PrefixCount()
        count.add(units[i])
        own.append(len(count))
        prev = units[order[k - 1]] if k else None
        gain.append(_common_prefix(prev[0][:-1], units[i][0][:-1]) if prev and units[i] else 0)

    def plan(cuttable: list[int]) -> tuple[float, list[int]]:
        # items = runs of trajectories between cuttable gaps; returns (objective, starts in trajectory order)
        starts = [0] + [k for k in cuttable if k > 0]
        bounds = starts + [len(order)]
        c_own = [own[a] + sum(own[k] - gain[k] for k in range(a + 1, b)) for a, b in zip(bounds, bounds[1:])]
        c_gain = [gain[a] for a in starts]
        runs = [starts[j] for j in _balanced_runs(c_own, c_gain, n)]
        loads = [own[a] + sum(own[k] - gain[k] for k in range(a + 1, b)) for a, b in zip(runs, runs[1:] + [len(order)])]
        return max(loads) + sum(gain[a] for a in runs[1:]) / n, runs

    least = min(gain[1:], default=0)
    candidates = [plan([k for k in range(1, len(order)) if gain[k] <= t]) for t in (-1, least, max(gain))]
    starts = min(candidates, key=lambda c: c[0])[1] + [len(order)]
    shards = [sorted(order[a:b]) for a, b in zip(starts, starts[1:])]
    return shards + [[] for _ in range(n - len(shards))]
