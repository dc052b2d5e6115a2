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
    index_of: dict[str, int] = field(repr=False)

    def __len__(self) -> int:
        return len(self.prompt)

    @property
    def ids(self) -> list[str]:
        return [e["id"] for e in self.prompt]

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
    return Category(name, prompt, checker, answers, {e["id"]: i for i, e in enumerate(prompt)})
