"""A safe arithmetic evaluator (no ``eval``): the calculator tool, the Arithmetic env's checker and its solver.

Accepted: integer and decimal literals, ``+ - * / // % **``, unary ``+``/``-`` and parentheses. Everything else
(names, calls, attributes, strings, comparisons) is refused with a :class:`CalcError` that says what was wrong.
Sizes are bounded so that a model cannot make the process hang or run out of memory (``9**9**9``).
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Callable, Union

Number = Union[int, float]

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 64
MAX_ABS_VALUE = 10**15
MAX_EXPONENT = 64

_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ValueError):
    """The expression is not plain arithmetic, or its value is undefined or too large."""


def safe_eval(expression: str) -> Number:
    """Returns the value of the arithmetic ``expression``; an ``int`` whenever the value is integral.

    Raises :class:`CalcError` for anything that is not plain arithmetic, division by zero, or values beyond
    ``MAX_ABS_VALUE``.
    """
    if not isinstance(expression, str):
        raise CalcError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalcError(f"cannot parse {expression.strip()!r} as arithmetic") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError("expression too long")
    value = _eval(tree.body)
    return _tidy(value)


def _tidy(value: Number) -> Number:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _check(value: Number) -> Number:
    if isinstance(value, complex):
        raise CalcError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result is not a finite number")
    if abs(value) > MAX_ABS_VALUE:
        raise CalcError(f"result larger than {MAX_ABS_VALUE:.0e}")
    return value


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalcError(f"exponent larger than {MAX_EXPONENT}")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except (OverflowError, TypeError) as e:
            raise CalcError(f"invalid operation: {e}") from None
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"name {node.id!r}"
    elif isinstance(node, ast.Call):
        what = "function call"
    elif isinstance(node, ast.Constant):
        what = f"{type(node.value).__name__} literal"
    raise CalcError(f"only numbers, + - * / // % ** and parentheses are allowed (found {what})")


def format_number(value: Number) -> str:
    """Returns ``value`` as the calculator prints it: integers exactly, other floats rounded to 6 decimals."""
    value = _tidy(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.6f}".rstrip("0").rstrip(".")


def parse_number(text: str) -> Number | None:
    """Returns the number written in ``text`` (spaces, thousands commas, ``$`` and a trailing period ignored), or
    None if ``text`` is not a single number."""
    t = text.strip().replace(",", "").replace(" ", "").replace("$", "").rstrip(".")
    if not t:
        return None
    try:
        return _tidy(int(t))
    except ValueError:
        pass
    try:
        value = float(t)
    except ValueError:
        return None
    return _tidy(value) if math.isfinite(value) else None
