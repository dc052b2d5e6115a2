"""BFCL items, loaded by ``bfcl_eval``'s own loaders (nothing is filtered, reordered or rewritten).

Per category, three aligned lists, exactly as the leaderboard builds them:

- ``prompt``: ``load_dataset_entry(category)``, what generation gives the model (function docs with the
  language-specific hints; for multi-turn, the docs of the involved classes with the held-out functions removed);
- ``checker``: ``load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)``, what
  ``evaluate_task`` hands the checker (Java/JavaScript docs keep their own type names there); for multi-turn the
  same entries as ``prompt`` (the checker reads only ``id``, ``involved_classes`` and ``initial_config``);
- ``answers``: ``load_ground_truth_entry(category)``, aligned with the prompts by position as ``evaluate_task``
  aligns them (``None`` for the relevance categories, which have none).

Entries are ``bfcl_eval``'s dicts; they are shared and must not be mutated (copy before handing them to a function
that mutates, as the handlers' prompt builders do).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.bfcl import categories
from agentrl.envs.bfcl.official import load


@dataclass(frozen=True)
class Category:
    """One category's items (see the module docstring). ``index_of`` maps an item id to its position."""

    name: str
    prompt: tuple[dict[str, Any], ...]
    checker: tuple[dict[str, Any], ...]
    answers: tuple[Any, ...] | None
    ids: tuple[str, ...] = field(repr=False)
    index_of: dict[str, int] = field(repr=False)

    def __len__(self) -> int:
        return len(self.prompt)

    def answer(self, i: int) -> Any:
        """The ``ground_truth`` of item ``i`` (None for relevance categories)."""
        return None if self.answers is None else self.answers[i]["ground_truth"]


@functools.lru_cache(maxsize=None)
def load_category(name: str) -> Category:
    """Returns every item of a served category (cached per process).

    Raises ``ValueError`` for a category agentrl does not serve (the message lists them)."""
    if name not in categories.ALL:
        raise ValueError(f"unknown BFCL category {name!r}; served: {', '.join(categories.ALL)}")
    bfcl = load()
    prompt = tuple(bfcl.utils.load_dataset_entry(name))
    if bfcl.utils.is_multi_turn(name):
        # The multi-turn checker reads only id, involved_classes and initial_config, which the hints do not touch:
        # the second load (about 2 s per category) would change nothing.
        checker = prompt
    else:
        checker = tuple(bfcl.utils.load_dataset_entry(name, include_prereq=False, include_language_specific_hint=False))
    answers = None
    if not bfcl.utils.is_relevance_or_irrelevance(name):
        answers = tuple(bfcl.utils.load_ground_truth_entry(name))
        if len(answers) != len(prompt):
            raise RuntimeError(f"bfcl-eval {name}: {len(prompt)} questions but {len(answers)} ground-truth entries")
    if [e["id"] for e in checker] != [e["id"] for e in prompt]:
        raise RuntimeError(f"bfcl-eval {name}: the two loads of the questions disagree on ids/order")
    ids = tuple(e["id"] for e in prompt)
    return Category(name, prompt, checker, answers, ids, {i: k for k, i in enumerate(ids)})


class ItemSelection:
    """Item selection shared by the BFCL envs (a mixin over ``self.cat`` and gymnasium's ``np_random``):
    ``options["id"]``, ``options["index"]``, the seed, or a draw; and the item of a policy's ``meta.task``."""

    cat: Category
    np_random: Any

    @property
    def num_tasks(self) -> int:
        """Number of items (valid ``options["index"]`` are ``0..num_tasks-1``)."""
        return len(self.cat)

    def task_ids(self) -> list[str]:
        """The item ids, index-aligned (``task_ids()[i]`` is what ``options={"index": i}`` selects)."""
        return list(self.cat.ids)

    def task_key(self, seed: int) -> str:
        """The item ``reset(seed=seed)`` selects (``seed % num_tasks``: seeds collide)."""
        return f"{self.cat.name}/{self.cat.ids[self._select(seed, None)]}"

    def _select(self, seed: int | None, options: dict[str, Any] | None) -> int:
        options = options or {}
        if "id" in options:
            if options["id"] not in self.cat.index_of:
                raise ValueError(f"options['id']={options['id']!r} is not a BFCL {self.cat.name} item")
            return self.cat.index_of[options["id"]]
        if "index" in options:
            i = options["index"]
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.cat):
                raise ValueError(f"options['index'] must be an int in [0, {len(self.cat)}), got {i!r}")
            return i
        if seed is not None:
            return seed % len(self.cat)
        return int(self.np_random.integers(len(self.cat)))

    def _item_of(self, meta: Any) -> int | None:
        task = getattr(meta, "task", None)
        if isinstance(task, dict):
            wanted = task.get("id", task.get("instance_id"))
            if isinstance(wanted, str) and wanted in self.cat.index_of:
                return self.cat.index_of[wanted]
        return None
