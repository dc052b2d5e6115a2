"""Verdicts, from ``bfcl_eval``'s own per-entry evaluators (the functions its file runners loop over).

- single turn: ``eval_runner._evaluate_single_ast_entry`` (what ``ast_file_runner`` calls, with the language and
  return format it picks from the category) or ``_evaluate_single_relevance_entry`` (``relevance_file_runner``);
- multi turn: ``eval_runner._evaluate_single_multi_turn_entry`` (``multi_turn_runner``), which decodes every
  step's answer, replays the whole episode on fresh backend instances next to the ground truth, and checks the
  backend state and the execution results after every turn.

Each returns the official result dict: ``{"valid": True}`` or ``valid: False`` with ``error``/``error_type``.
The handler handed over is the format's official handler behind :class:`formats.SafeHandler`. An exception
inside the official code (a malformed item; the official runner would abort the whole run) becomes
``valid: False`` with ``error_type`` ``"checker_exception"``.

The multi-turn executor keeps backend instances as module globals named after the model name and the item id;
each grading here uses a model name of its own and deletes its instances afterwards, so gradings can run
concurrently and repeatedly (the official runner grades each item once per process).
"""

from __future__ import annotations

import copy
import inspect
import importlib
import re
import uuid
from typing import Any

from agentrl.envs.bfcl.data import Category
from agentrl.envs.bfcl.formats import AnswerFormat, safe_handler
from agentrl.envs.bfcl.official import load


def _failed(kind: str, e: BaseException) -> dict[str, Any]:
    return {"valid": False, "error": [f"{type(e).__name__}: {e}"], "error_type": kind}


def language_of(category: str) -> tuple[Any, Any]:
    """``(Language, ReturnFormat)`` as ``ast_file_runner`` picks them for ``category``."""
    bfcl = load()
    Language, ReturnFormat = bfcl.enums.Language, bfcl.enums.ReturnFormat
    if bfcl.utils.is_java(category):
        return Language.JAVA, ReturnFormat.JAVA
    if bfcl.utils.is_js(category):
        return Language.JAVASCRIPT, ReturnFormat.JAVASCRIPT
    return Language.PYTHON, ReturnFormat.PYTHON


def grade_single_turn(cat: Category, i: int, fmt: AnswerFormat, answer: str) -> dict[str, Any]:
    """The official verdict on ``answer`` (the recorded answer, see :func:`formats.recorded_answer`) for item
    ``i`` of the single-turn category ``cat``."""
    bfcl = load()
    entry = cat.checker[i]
    handler = safe_handler(fmt)
    try:
        if bfcl.utils.is_relevance_or_irrelevance(cat.name):
            return bfcl.runner._evaluate_single_relevance_entry(handler, entry["id"], answer, entry,
                                                                fmt.registry_name, cat.name)
        language, return_format = language_of(cat.name)
        return bfcl.runner._evaluate_single_ast_entry(handler, entry["id"], answer, cat.answer(i), entry,
                                                      fmt.registry_name, cat.name, language=language,
                                                      return_format=return_format, has_tool_call_tag=False)
    except Exception as e:  # noqa: BLE001 - the official code raised on this item; the verdict is "not valid"
        return _failed("checker_exception", e)


def backend_methods(involved_classes: list[str]) -> frozenset[str]:
    """The public method names of the backend classes, as ``execute_multi_turn_func_call`` maps them."""
    mapping = load().multi_turn_utils.CLASS_FILE_PATH_MAPPING
    names = set()
    for cls_name in involved_classes:
        cls = getattr(importlib.import_module(mapping[cls_name]), cls_name)
        names |= {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}
    return frozenset(names)


def new_model_name(prefix: str = "agentrl") -> str:
    """A model name of its own for one grading or episode (it names the backend instances)."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def drop_instances(model_name: str) -> None:
    """Deletes the backend instances ``execute_multi_turn_func_call`` created under ``model_name``."""
    g = load().multi_turn_utils.__dict__
    prefix = re.sub(r"[-./:]", "_", model_name)
    for key in [k for k in list(g) if k.startswith(prefix)]:
        g.pop(key, None)


def grade_multi_turn(cat: Category, i: int, fmt: AnswerFormat, responses: list[list[str]],
                     turns: int | None = None) -> dict[str, Any]:
    """The official verdict on an episode of multi-turn item ``i``: ``responses[t]`` are the recorded answers of
    turn ``t``, one per step. With ``turns``, only the first ``turns`` turns are judged (the verdict the checker
    reaches after them); fewer recorded turns than judged ones is the official "force terminated"."""
    bfcl = load()
    entry = cat.checker[i]
    truth = cat.answer(i)
    if turns is not None:
        truth, responses = truth[:turns], responses[:turns]
    handler = safe_handler(fmt, backend_methods(entry["involved_classes"]))
    model_name = new_model_name()
    try:
        return bfcl.runner._evaluate_single_multi_turn_entry(handler, entry["id"], [list(r) for r in responses],
                                                             truth, copy.copy(entry), model_name, cat.name)
    except Exception as e:  # noqa: BLE001
        return _failed("checker_exception", e)
    finally:
        drop_instances(model_name)
