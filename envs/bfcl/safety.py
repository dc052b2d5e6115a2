"""Screens for the two places where ``bfcl_eval`` runs Python built from model text with ``eval``.

BFCL trusts the model it grades; an RL env must not. ``bfcl_eval`` evaluates model-controlled code in two places:

1. the prompt-mode decoder (``model_handler.utils.resolve_ast_by_type``) ``eval``\\ s every binary operation it
   finds in an argument (``f(a=__import__('os').system('id') + 1)`` runs the command while *decoding*);
2. the multi-turn executor (``multi_turn_utils.execute_multi_turn_func_call``) ``eval``\\ s each decoded call
   string in a module whose globals hold ``importlib``; a name-only blacklist (``kill``, ``exit``, ...) is all
   that stands between ``importlib.import_module('os').system(...)`` and the host. FC answers reach it too: the
   Qwen handler pastes the JSON ``name`` and argument keys into the call string unquoted.

So, before the official code sees it:

- :func:`check_python_answer` rejects a prompt-mode answer with a binary operation that is not arithmetic on
  number literals of bounded size (or ``str + str``); the official decoder is then not called and the answer
  counts as undecodable, like any other syntax it cannot decode;
- :func:`screen_calls` replaces a decoded call that is not ``method(literal, key=literal, ...)`` (a public method
  of the episode's backend classes, literal arguments, nested calls of such methods) by a call of an undefined
  name, which the official executor turns into ``"Error during execution: ..."`` without running anything (text
  that is no Python expression is left alone: ``eval`` cannot compile it either).

Answers a well-behaved model gives are untouched, so verdicts do not change (the differential test checks it).
Not covered: a legitimate backend method called with huge numbers (``MathAPI.power(base=10, exponent=10**12)``)
burns CPU in the official checker and here alike.
"""

from __future__ import annotations

import ast
from typing import Iterable

#: What a blocked call is replaced with: evaluating it raises NameError, nothing else happens.
BLOCKED_CALL = "agentrl_blocked_call()"

_MAX_EXPONENT = 1024
_MAX_BASE = 10**6
_MAX_SHIFT = 4096


class UnsafeAnswer(ValueError):
    """The answer holds code the official decoder would run; raised before it runs."""


def _number(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _number(node.operand)
    return False


def _bounded(node: ast.AST, limit: float) -> bool:
    value = node
    while isinstance(value, ast.UnaryOp):
        value = value.operand
    return isinstance(value, ast.Constant) and abs(value.value) <= limit


def safe_binop(node: ast.BinOp) -> bool:
    """True for arithmetic whose evaluation is cheap and side-effect free: number literals (and such arithmetic)
    combined by any operator, with ``**`` and shifts limited to a literal base/exponent of bounded size; or the
    concatenation of two string literals."""
    if isinstance(node.op, ast.Add) and all(isinstance(x, ast.Constant) and isinstance(x.value, str)
                                            for x in (node.left, node.right)):
        return True
    for side in (node.left, node.right):
        if not (_number(side) or (isinstance(side, ast.BinOp) and safe_binop(side))):
            return False
    if isinstance(node.op, ast.Pow):
        return _bounded(node.left, _MAX_BASE) and _bounded(node.right, _MAX_EXPONENT)
    if isinstance(node.op, (ast.LShift, ast.RShift)):
        return _bounded(node.right, _MAX_SHIFT)
    return True


def check_python_answer(text: str) -> None:
    """Raises :class:`UnsafeAnswer` if the prompt-mode answer ``text``, prepared as ``bfcl_eval``'s decoder
    prepares it, parses to Python holding a binary operation :func:`safe_binop` rejects. Text that does not parse
    is left to the official decoder, which fails on it without evaluating anything."""
    src = text.strip("`\n ")
    if not src.startswith("["):
        src = "[" + src
    if not src.endswith("]"):
        src = src + "]"
    try:
        tree = ast.parse(src.strip().strip("'"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and not safe_binop(node):
            raise UnsafeAnswer(f"refusing to evaluate the expression {ast.unparse(node)[:120]!r} in the answer")


def _literal(node: ast.AST, methods: frozenset[str]) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(x, methods) for x in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k, methods) for k in node.keys) and all(
            _literal(v, methods) for v in node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)):
        return _literal(node.operand, methods)
    if isinstance(node, ast.BinOp):
        return safe_binop(node)
    if isinstance(node, ast.Call):
        return _call(node, methods)
    return False


def _call(node: ast.AST, methods: frozenset[str]) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in methods
        and all(not isinstance(a, ast.Starred) and _literal(a, methods) for a in node.args)
        and all(k.arg is not None and _literal(k.value, methods) for k in node.keywords)
    )


def is_safe_call(call: str, methods: Iterable[str]) -> bool:
    """True if evaluating ``call`` can run nothing but ``methods``: it is one call of such a name with literal
    arguments (nested calls of such names allowed), or it is not a Python expression at all (``eval`` then fails
    to compile it, with the error message the official executor reports)."""
    if not isinstance(call, str):
        return False
    try:
        tree = ast.parse(call, mode="eval")
    except (SyntaxError, ValueError):
        return True
    except (RecursionError, MemoryError):
        return False
    return _call(tree.body, frozenset(methods))


def screen_calls(calls: list, methods: Iterable[str]) -> list:
    """Returns ``calls`` (decoded call strings) with every call :func:`is_safe_call` rejects replaced by
    :data:`BLOCKED_CALL`. Anything that is not a list is returned unchanged (the official code rejects it)."""
    if not isinstance(calls, list):
        return calls
    allowed = frozenset(methods)
    return [c if is_safe_call(c, allowed) else BLOCKED_CALL for c in calls]
