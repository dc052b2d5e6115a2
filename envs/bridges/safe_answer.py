"""What a model's answer may be before a library evaluates it as code.

Several reasoning-gym scorers run the model's answer through ``eval`` (binary_matrix, spiral_matrix, n_queens,
string_insertion) or sympy's ``parse_expr``, which ``eval``s too (countdown, puzzle24, the integration and
polynomial datasets). In a trainer's process that is code execution by the policy: ``__import__('os').system(...)``
as an answer runs, and a policy searching for reward can find it. A tame-looking answer can also stall the scorer
for minutes inside one C call that no time bound interrupts (``9**9**9**9`` as a Python integer, ``1e999999`` as a
sympy Float: 150-330 s each, measured).

:func:`refusal` accepts only the expressions those answers are made of: numbers, strings, lists and tuples, names
(sympy's symbols), arithmetic, and calls of a few mathematical functions; no attribute, subscript, keyword,
comprehension, lambda or dunder; small exponents; bounded size. Anything else is refused before the scorer sees
it (the bridge scores it 0 and says why). An allow-list over Python's own parse, not a filter of bad strings: what
it does not know, it refuses.
"""

from __future__ import annotations

import ast
import math

MAX_CHARS = 10_000
MAX_NODES = 2_000
MAX_EXPONENT = 1_000
MAX_POWER_DEPTH = 2
MAX_INT_DIGITS = 100
MAX_FLOAT = 1e100
# Functions an integration or polynomial answer uses (sympy names); plain eval scorers never need a call.
MATH_CALLS = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "sinh", "cosh",
                        "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln", "sqrt", "Abs", "abs", "Rational"})
_BIN_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitXor, ast.BitAnd, ast.BitOr)
_PLAIN = (ast.Expression, ast.List, ast.Tuple, ast.UnaryOp, ast.UAdd, ast.USub, ast.Not, ast.Load) + _BIN_OPS


def _number(node: ast.AST) -> float | None:
    """The value of an exponent made of numbers and + - * / alone (no powers), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _number(node.operand)
        return None if v is None else (v if isinstance(node.op, ast.UAdd) else -v)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _number(node.left), _number(node.right)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        return a / b if b else None
    return None


def _power_depth(node: ast.AST) -> int:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return 1 + _power_depth(node.left)
    return max((_power_depth(c) for c in ast.iter_child_nodes(node)), default=0)


def refusal(answer: str) -> str | None:
    """None when ``answer`` is a plain expression (see the module docstring), else why it is refused."""
    if len(answer) > MAX_CHARS:
        return f"over {MAX_CHARS} characters"
    try:
        tree = ast.parse(answer.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        return f"not a Python expression ({type(e).__name__})"
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        return f"over {MAX_NODES} expression nodes"
    for node in nodes:
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10 ** MAX_INT_DIGITS:
                return f"an integer of over {MAX_INT_DIGITS} digits"
            if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= MAX_FLOAT):
                return f"a number past {MAX_FLOAT:g}"
            if isinstance(v, complex) or v is Ellipsis or isinstance(v, bytes):
                return f"a {type(v).__name__} constant"
        elif isinstance(node, ast.Name):
            if node.id.startswith("_"):
                return f"the name {node.id!r}"
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in MATH_CALLS or node.keywords:
                what = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
                return f"a call of {what!r} (only {', '.join(sorted(MATH_CALLS))})"
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                e = _number(node.right)
                if e is None or abs(e) > MAX_EXPONENT:
                    return f"an exponent that is not a number of at most {MAX_EXPONENT}"
        elif not isinstance(node, _PLAIN):
            return f"a {type(node).__name__} expression"
    if _power_depth(tree) > MAX_POWER_DEPTH:
        return f"powers nested over {MAX_POWER_DEPTH} deep"
    return None
