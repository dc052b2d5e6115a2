"""Ground-truth answers, written in either answer format (for tests, ``agentrl eval --policy oracle`` and
warm-start demonstrations). Not part of grading: every answer here is judged by the official checker like any
other.

Single-turn: each expected call with, per parameter, its first allowed value (parameters that may be left out,
whose allowed values include ``""``, are left out unless the doc requires them); Java/JavaScript values are
written as the source text the official type converters read back. Relevance items get a call of the first
function; irrelevance items a plain sentence. Multi-turn: the ground-truth call strings of each turn, positional
arguments bound to their names through the backend method's signature (the official decoders keep keyword
arguments only).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
from typing import Any

from agentrl.envs.bfcl.formats import AnswerFormat
from agentrl.envs.bfcl.official import load

NO_CALL_TEXT = "None of the provided functions can do this."
#: What the multi-turn oracle says after its calls of a turn ran (no call: the turn ends).
TURN_DONE_TEXT = "Done."

Call = tuple[str, dict[str, Any]]


# ---------------------------------------------------------------------------------------------------------------
# Values


def _pick(allowed: Any) -> tuple[bool, Any]:
    """(present, value): the first allowed value, or absent when only ``""`` (omit) is allowed. The checker
    iterates over whatever the answer holds: a bare string allows each of its characters."""
    if not isinstance(allowed, (list, str)):
        return True, allowed
    for a in allowed:
        if a != "":
            return True, _build(a)
    return False, None


def _build(value: Any) -> Any:
    # Dicts inside answers map each key to its allowed values; lists of such dicts likewise.
    if isinstance(value, dict):
        out = {}
        for k, vals in value.items():
            present, v = _pick(vals)
            if present:
                out[k] = v
        return out
    if isinstance(value, list):
        return [_build(v) if isinstance(v, dict) else v for v in value]
    return value


_JAVA_ELEM = {"String": "String", "integer": "int", "long": "long", "double": "double", "float": "float",
              "boolean": "boolean", "char": "char", "any": "Object"}


def _java_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def _java(v: Any, typ: str, nested: str | None) -> str:
    """Java source for ``v`` that ``java_type_converter(src, typ, nested)`` reads back as ``v``."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if typ == "long":
        return f"{v}L"
    if typ == "float":
        return f"{float(v)}f"
    if typ == "double":
        return repr(float(v))
    if typ == "Array":
        return f"new {_JAVA_ELEM.get(nested or 'any', nested)}[]{{" + ", ".join(_java(x, nested or "any", None)
                                                                           for x in v) + "}"
    if typ == "ArrayList":
        items = ", ".join(_java_value(x) if nested in ("String", "any", None) else _java(x, nested, None) for x in v)
        return f"new ArrayList<>(Arrays.asList({items}))"
    if typ == "HashMap":
        puts = " ".join(f"put({json.dumps(str(k))}, {_java_value(x)});" for k, x in v.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return str(v)


def _js_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"'{v}'"
    if isinstance(v, list):
        return "[" + ", ".join(_js_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_js_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _js(v: Any, typ: str, nested: str | None) -> str:
    """JavaScript source for ``v`` that ``js_type_converter(src, typ, nested)`` reads back as ``v``."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if typ in ("array", "dict"):
        return _js_value(v)
    return repr(v)


# ---------------------------------------------------------------------------------------------------------------
# Single turn


def language_name(category: str) -> str:
    """``"java"``, ``"js"`` or ``"python"``: the language of a single-turn category's answers."""
    utils = load().utils
    return "java" if utils.is_java(category) else "js" if utils.is_js(category) else "python"


def _doc(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((f for f in functions if f.get("name") == name), {})


def single_turn_calls(category: str, checker_entry: dict[str, Any], answer: Any) -> list[Call]:
    """Returns the ground-truth calls of one single-turn item (``[]`` for irrelevance items). Java/JavaScript
    argument values are source strings."""
    bfcl = load()
    functions = checker_entry["function"]
    if bfcl.utils.is_relevance_or_irrelevance(category):
        if "irrelevance" in category or not functions:
            return []
        return [(functions[0]["name"], {})]
    lang = language_name(category)
    calls = []
    for expected in answer:
        ((name, params),) = expected.items()
        doc = _doc(functions, name).get("parameters", {})
        props, required = doc.get("properties", {}), set(doc.get("required", []))
        args = {}
        for p, allowed in params.items():
            if isinstance(allowed, list) and "" in allowed and p not in required:
                continue
            present, v = _pick(allowed)
            typ = props.get(p, {}).get("type", "any")
            if not present:
                # Required, yet only "" allowed: the checker accepts "" for a string and [] for an array (its
                # list check reads "" as the empty list of allowed items).
                v = [] if typ in ("array", "tuple") else ""
            if lang != "python":
                nested = props.get(p, {}).get("items", {}).get("type")
                v = _java(v, typ, nested) if lang == "java" else _js(v, typ, nested)
            args[p] = v
        calls.append((name, args))
    return calls


# ---------------------------------------------------------------------------------------------------------------
# Multi turn


@functools.lru_cache(maxsize=None)
def _signature(class_name: str, method: str) -> inspect.Signature | None:
    module = load().multi_turn_utils.CLASS_FILE_PATH_MAPPING[class_name]
    fn = getattr(importlib.import_module(module), class_name).__dict__.get(method)
    return inspect.signature(fn) if callable(fn) else None


def multi_turn_call(call: str, involved_classes: list[str]) -> Call:
    """Returns ``(name, keyword arguments)`` of one ground-truth call string such as ``"sort('a.txt')"``."""
    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain call: {call!r}")
    name = node.func.id
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    if args:
        sig = next((s for c in involved_classes if (s := _signature(c, name)) is not None), None)
        if sig is None:
            raise ValueError(f"{call!r}: no backend method {name!r} in {involved_classes}")
        bound = sig.bind(None, *args, **kwargs)  # None stands for self
        kwargs = {k: v for k, v in list(bound.arguments.items())[1:]}
    return name, kwargs


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def render(fmt: AnswerFormat, calls: list[Call], language: str = "python") -> str:
    """Returns an assistant message making ``calls`` in ``fmt`` (a plain sentence when there are none).
    ``language`` (``python``, ``java``, ``js``) matters in prompt mode only: Java/JavaScript values are source
    strings, written unquoted."""
    if not calls:
        return NO_CALL_TEXT
    if fmt.tools_in_template:
        return "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in calls)
    if language == "python":
        parts = [f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")" for n, a in calls]
    else:
        parts = [f"{n}(" + ", ".join(f"{k}={_source_arg(v, language)}" for k, v in a.items()) + ")"
                 for n, a in calls]
    return "[" + ", ".join(parts) + "]"


def _source_arg(v: Any, language: str) -> str:
    # The Java/JS call parsers return a string literal's text without its quotes (escapes not undone) and any
    # other expression as its source text, which the type converters then read. The first spelling that the
    # official parser reads back as exactly ``v`` wins: a string literal, the bare expression; else Java text goes
    # into a text block (the parser keeps the block's inner quotes and the converters search the text) and
    # JavaScript text into single quotes.
    if not isinstance(v, str):  # not a source string (perturbed answers): its JSON text is Java/JS source too
        v = json.dumps(v)
    utils = load().handler_utils
    parse = utils.parse_java_function_call if language == "java" else utils.parse_javascript_function_call
    candidates = [f'"{v}"'] if '"' not in v and "\\" not in v else []
    candidates.append(v)
    for c in candidates:
        try:
            if parse(f"probe.call(value={c})")[0]["probe.call"]["value"] == v:
                return c
        except Exception:  # noqa: BLE001 - not parseable: try the next spelling
            pass
    if language == "java" and '"""' not in v:
        return f'"""\n{v}"""'
    if language == "js" and "'" not in v:
        return f"'{v}'"
    return v
