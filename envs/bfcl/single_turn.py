"""Single-turn BFCL: one item per episode, one answer, the official verdict as the reward.

``reset`` returns the opening messages the format's official handler builds for the item (FC: the question;
prompt mode: BFCL's system prompt listing the functions, then the question) and, in FC formats, the item's
function docs as ``info["tools"]`` for the chat template. ``step(answer)`` records the answer as the handler
records a completion (:func:`formats.recorded_answer`), grades it with ``bfcl_eval``'s evaluator for the category
(:func:`grading.grade_single_turn`) and ends the episode: reward 1.0 if valid, else 0.0.

``info`` after the step: ``id``, ``category``, ``format``, ``correct``, ``error_type`` and ``error`` (the official
ones; None when correct), ``answer`` (the recorded answer). A non-string action is graded as the empty answer.
Stepping outside an episode returns reward 0 with ``error_type`` ``"not_running"``.
"""

from __future__ import annotations

from typing import Any

from agentrl.core import Env, Message
from agentrl.envs.bfcl import categories, oracle
from agentrl.envs.bfcl.data import ItemSelection, load_category
from agentrl.envs.bfcl.formats import DEFAULT_FORMAT, get_format, opening, recorded_answer
from agentrl.envs.bfcl.grading import grade_single_turn


def error_text(result: dict[str, Any]) -> str | None:
    """The official result's ``error`` as one string (it is a list of strings or dicts, or a dict)."""
    err = result.get("error")
    if err is None or result.get("valid"):
        return None
    if isinstance(err, list):
        return "; ".join(e if isinstance(e, str) else repr(e) for e in err)
    return err if isinstance(err, str) else repr(err)


class BFCLEnv(ItemSelection, Env):
    """One single-turn BFCL item per episode (see the module docstring).

    ``category``: one of :data:`categories.SINGLE_TURN`. ``format``: an answer format of :mod:`.formats`
    (``qwen_fc`` by default, or ``prompt``). ``reset(seed=, options=)`` picks the item: ``options["id"]`` (a BFCL
    id) or ``options["index"]`` (int), else ``seed % num_tasks``, else a draw from ``self.np_random``; its info
    holds ``id``, ``index``, ``category``, ``format`` and, for FC formats, ``tools``.
    """

    description = "Berkeley Function-Calling Leaderboard (BFCL v4) single-turn item, graded by bfcl-eval"

    def __init__(self, category: str = "simple_python", format: str = DEFAULT_FORMAT):
        super().__init__()
        if category not in categories.SINGLE_TURN:
            raise ValueError(f"BFCLEnv serves the single-turn categories {', '.join(categories.SINGLE_TURN)}; "
                             f"got {category!r} (multi-turn ones: BFCLMultiTurnEnv)")
        self.fmt = get_format(format)
        self.cat = load_category(category)
        self.category = category
        self.index: int | None = None
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.index = self._select(seed, options)
        entry = self.cat.prompt[self.index]
        messages, tools = opening(self.fmt, entry)
        self._done = False
        info: dict[str, Any] = {"id": entry["id"], "index": self.index, "category": self.category,
                                "format": self.fmt.name}
        if tools is not None:
            info["tools"] = tools
        return messages, info

    def step(self, action: str):
        if self._done or self.index is None:
            return [], 0.0, True, False, {"correct": False, "error_type": "not_running",
                                          "error": "step() called outside an episode; call reset()"}
        self._done = True
        answer = recorded_answer(self.fmt, action if isinstance(action, str) else "")
        result = grade_single_turn(self.cat, self.index, self.fmt, answer)
        ok = bool(result.get("valid"))
        info = {"id": self.cat.ids[self.index], "category": self.category, "format": self.fmt.name, "correct": ok,
                "error_type": None if ok else result.get("error_type"), "error": error_text(result),
                "answer": answer}
        return [], (1.0 if ok else 0.0), True, False, info

    # -- scripted answers -------------------------------------------------------------------------------------------
    def oracle_answer(self, index: int) -> str:
        """The ground-truth answer of item ``index`` in this env's format (:mod:`.oracle`)."""
        calls = oracle.single_turn_calls(self.category, self.cat.checker[index], self.cat.answer(index))
        return oracle.render(self.fmt, calls, oracle.language_name(self.category))

    def solve(self, conversation: list[Message]) -> str:
        """The ground-truth answer of the current item (``agentrl envs check``'s solver episode)."""
        return self.oracle_answer(self.index if self.index is not None else 0)

    def oracle_policy(self):
        """A :class:`agentrl.policy.ScriptedPolicy` answering each episode with its item's ground truth, found
        from ``meta.task`` (``{"instance_id": <BFCL id>}``, as ``agentrl eval`` passes it)."""
        from agentrl.policy import ScriptedPolicy

        def act(conversation: list[Message], meta: Any) -> str:
            i = self._item_of(meta)
            if i is None:
                raise ValueError(f"the BFCL oracle needs meta.task with the item id, got {getattr(meta, 'task', None)!r}")
            return self.oracle_answer(i)

        return ScriptedPolicy(act)
