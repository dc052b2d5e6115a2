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
through transformers' own 4-D custom-mask support with the dense mask (``U * U`` bytes): SDPA with a boolean mask,
or eager attention with an additive one, exact on the CPU. A GPU path (``flex_attention`` with a block mask built
from the same ranges) is not built yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # batching imports this module
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
        ar = torch.arange(self.num_nodes)
        return (ar[None, :] <= ar[:, None]) & (ar[:, None] < self.end[None, :])


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


def attention_mask_for(model: torch.nn.Module, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The ``[1, 1, U, U]`` tree mask in the form the model's attention implementation takes as a custom 4-D mask:
    boolean (``True`` = attend) for SDPA, additive (0 / dtype minimum) for eager attention. Raises ``ValueError``
    for an implementation that takes no dense 4-D mask (flash attention, flex attention)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
    if impl == "sdpa":
        return mask
    if impl == "eager":
        out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return out.masked_fill_(~mask, torch.finfo(dtype).min)
    raise ValueError(f"prefix_tree: the model's attention implementation {impl!r} takes no dense 4-D attention "
                     "mask; load it with attn_implementation sdpa or eager, or set prefix_tree: false")


class _PrefixCount:
    """Distinct input prefixes of the sequences added so far (a trie without tensors), with a tentative add."""

    def __init__(self) -> None:
        self.child: dict[tuple[int, int], int] = {}

    def add(self, seqs: list[Tensor]) -> list[tuple[int, int]]:
        """Inserts the input prefixes of ``seqs``; returns the trie edges this created (for :meth:`undo`)."""
        made = []
        for ids in seqs:
            node = -1
            for tok in ids[:-1].tolist():
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
