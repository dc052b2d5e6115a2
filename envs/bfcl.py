"""Function calling over the Berkeley Function-Calling Leaderboard (BFCL v4) data, graded by AST match.

The questions and the possible answers come from the ``bfcl-eval`` package, read as plain JSON-lines files from its
installed ``data/`` directory (offline; nothing of ``bfcl_eval`` is imported, so none of its many dependencies is
needed: ``pip install --no-deps bfcl-eval==2026.3.23`` is enough).

One episode is one BFCL item: ``reset`` returns a system message and the user's question, and offers the item's
functions as OpenAI-style schemas in ``info["tools"]``, which the agent loop renders with the chat template (the
manager copies them to ``EpisodeMeta.tools``). With ``tools_in_prompt=True`` the system message itself lists the
schemas and the ``<tool_call>`` format of :mod:`agentrl.tools` (for policies whose template renders no tools; do not
combine with template tools, or the model sees them twice). The model answers once; ``step``
parses its tool calls with :func:`agentrl.tools.parse_tool_calls` and grades them against the possible answers.
Reward 1.0 if the calls match, else 0.0; the episode always terminates after that one step. ``info`` carries
``correct``, ``error_type`` and ``error`` (why it did not match), the parsed ``calls`` and the item ``id``.

Matching rules (the BFCL AST checker's, for Python items):

- the number of calls equals the number of expected calls; ``parallel*`` categories match the calls to the expected
  calls as a multiset (any order, a perfect bipartite matching), the others in the one expected call;
- a call matches an expected call when the function name is the same, every required parameter is present, no
  parameter is unknown to the function or absent from the answer, every value has the declared type (an ``int`` is
  accepted for a ``float`` parameter; a value of the answer's own type is accepted as a "variable"), and each value
  is one of the allowed values: strings compared after removing spaces and ``,./-_*^``, lower-cased, ``'`` read
  as ``"``; lists element-wise with the same string rule; dicts key by key; and every answer parameter the call
  omits is optional there (its allowed values include ``""``);
- ``irrelevance``: correct iff the model calls no function.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.core import Env, Message
from agentrl.tools import ToolCall, format_tool_call, parse_tool_calls

BFCL_PACKAGE = "bfcl-eval"
BFCL_VERSION = "2026.3.23"

#: Category name used by agentrl -> BFCL v4 file stem. All Python items (Java/JS items need BFCL's own type
#: converters and are not covered).
CATEGORIES: dict[str, str] = {
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
    "live_simple": "live_simple",
    "live_multiple": "live_multiple",
    "live_parallel": "live_parallel",
    "live_parallel_multiple": "live_parallel_multiple",
    "irrelevance": "irrelevance",
}

#: Registered env ids -> category (the lead adds the ``register`` lines to ``envs/__init__.py``).
ENV_IDS: dict[str, str] = {
    "agentrl/BFCL-simple-v0": "simple",
    "agentrl/BFCL-multiple-v0": "multiple",
    "agentrl/BFCL-parallel-v0": "parallel",
    "agentrl/BFCL-parallel-multiple-v0": "parallel_multiple",
    "agentrl/BFCL-live-simple-v0": "live_simple",
    "agentrl/BFCL-live-multiple-v0": "live_multiple",
    "agentrl/BFCL-live-parallel-v0": "live_parallel",
    "agentrl/BFCL-live-parallel-multiple-v0": "live_parallel_multiple",
    "agentrl/BFCL-irrelevance-v0": "irrelevance",
}

# BFCL's Python type names -> the Python type a decoded JSON value must have.
_PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
# BFCL's type names -> JSON-schema names offered to the model (BFCL does the same conversion for FC models).
_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}

_STRIP_RE = re.compile(r"[ ,./\-_*^]")

SYSTEM_PROMPT = (
    "You are an expert in composing function calls. You are given a question and a set of possible functions. "
    "Based on the question, make one or more function calls to achieve the purpose. If none of the functions can "
    "be used, say so and call nothing. If the question lacks parameters the function requires, say so too."
)
# Added when the env itself lists the tools (tools_in_prompt=True); otherwise the chat template does, with the same
# <tool_call> format (Qwen/Hermes templates, agentrl's tiny model).
TOOLS_PROMPT = (
    "Call a function by writing a JSON object with its name and arguments inside <tool_call></tool_call> tags, "
    "one block per call:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>\n\n'
    "Available functions:\n<tools>\n{schemas}\n</tools>"
)


class BFCLDataError(RuntimeError):
    """The BFCL data is missing (package not installed) or a file does not have the expected shape."""


@dataclass(frozen=True)
class BFCLItem:
    """One BFCL question. ``answers`` is a list of ``{function_name: {param: [allowed values]}}`` (one per expected
    call, empty for ``irrelevance``); ``functions`` are BFCL function docs (``name``, ``description``,
    ``parameters`` with BFCL type names)."""

    id: str
    category: str
    messages: tuple[Message, ...]
    functions: tuple[dict[str, Any], ...]
    answers: tuple[dict[str, dict[str, list[Any]]], ...]


@dataclass
class Mismatch:
    """Why a set of calls did not match: a BFCL-style ``error_type`` (``kind:detail``) and a readable message."""

    error_type: str
    error: str


def data_dir() -> Path:
    """Returns the ``data`` directory of the installed ``bfcl_eval`` package, without importing it.

    Raises :class:`BFCLDataError` with the install command if the package is absent.
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BFCLDataError(
            f"the BFCL data needs the {BFCL_PACKAGE} package: pip install --no-deps {BFCL_PACKAGE}=={BFCL_VERSION}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data"
    if not path.is_dir():
        raise BFCLDataError(f"{path} does not exist: the installed {BFCL_PACKAGE} has no data directory")
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BFCLDataError(f"missing BFCL file {path}")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise BFCLDataError(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


@functools.lru_cache(maxsize=None)
def load_category(category: str) -> tuple[BFCLItem, ...]:
    """Returns every item of ``category`` (a key of :data:`CATEGORIES`), in the file's order (cached).

    Invariants: items of answer categories have at least one answer; single-turn questions only.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; known: {', '.join(CATEGORIES)}")
    stem = f"BFCL_v4_{CATEGORIES[category]}.json"
    root = data_dir()
    questions = _read_jsonl(root / stem)
    answers: dict[str, list] = {}
    if category != "irrelevance":
        answers = {row["id"]: row["ground_truth"] for row in _read_jsonl(root / "possible_answer" / stem)}
    items = []
    for q in questions:
        turns = q.get("question")
        if not isinstance(turns, list) or len(turns) != 1:
            raise BFCLDataError(f"{stem}: item {q.get('id')}: expected one turn of messages")
        gt = answers.get(q["id"], [])
        if category != "irrelevance" and not gt:
            raise BFCLDataError(f"{stem}: item {q['id']} has no possible answer")
        items.append(
            BFCLItem(
                id=q["id"],
                category=category,
                messages=tuple(dict(m) for m in turns[0]),
                functions=tuple(q["function"]),
                answers=tuple(gt),
            )
        )
    return tuple(items)


# ---------------------------------------------------------------------------------------------------------------
# Tools offered to the model


def _schema_of(node: Any) -> Any:
    """Converts one BFCL parameter schema (recursively) to JSON-schema type names."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "type" and isinstance(v, str):
                out[k] = _SCHEMA_TYPES.get(v, v)
            elif k in ("properties",) and isinstance(v, dict):
                out[k] = {name: _schema_of(sub) for name, sub in v.items()}
            elif k in ("items", "additionalProperties") and isinstance(v, dict):
                out[k] = _schema_of(v)
            else:
                out[k] = v
        return out
    return node


def tool_schema(function: dict[str, Any]) -> dict[str, Any]:
    """Returns the OpenAI-style ``{"type": "function", "function": {...}}`` schema of a BFCL function doc (what
    chat templates take as ``tools``); BFCL type names become JSON-schema ones (dict->object, float->number,
    tuple->array)."""
    params = _schema_of(function.get("parameters", {"type": "dict", "properties": {}}))
    return {
        "type": "function",
        "function": {"name": function["name"], "description": function.get("description", ""), "parameters": params},
    }


def prompt_messages(item: BFCLItem, tools_in_prompt: bool = False) -> list[Message]:
    """Returns the opening messages: one system message (instructions; with ``tools_in_prompt`` also the call
    format and the tool schemas; the item's own system text appended), then the item's other messages."""
    system = SYSTEM_PROMPT
    if tools_in_prompt:
        schemas = "\n".join(json.dumps(tool_schema(f)) for f in item.functions)
        system += "\n\n" + TOOLS_PROMPT.format(schemas=schemas)
    rest = []
    for m in item.messages:
        if m.get("role") == "system":
            system += "\n\n" + str(m.get("content", ""))
        else:
            rest.append({"role": m["role"], "content": m.get("content", "")})
    return [{"role": "system", "content": system}, *rest]


# ---------------------------------------------------------------------------------------------------------------
# Grading


def _norm(s: str) -> str:
    return _STRIP_RE.sub("", s).lower().replace("'", '"')


def _norm_list(values: list[Any]) -> list[Any]:
    return [_norm(v) if isinstance(v, str) else v for v in values]


def _answer_type(allowed: list[Any]) -> type | None:
    for a in allowed:
        if a != "":
            return type(a)
    return None


def _fmt(v: Any) -> str:
    return json.dumps(v, default=str) if not isinstance(v, str) else repr(v)


def _check_dict(param: str, value: dict, allowed: list[Any]) -> Mismatch | None:
    last = Mismatch("value_error:dict", f"parameter {param!r}: no allowed dict for {_fmt(value)}")
    for option in allowed:
        if option == "" or not isinstance(option, dict):
            continue
        bad = None
        for k, v in value.items():
            if k not in option:
                bad = Mismatch("value_error:dict_key", f"parameter {param!r}: unexpected key {k!r}")
                break
            vv = _norm(v) if isinstance(v, str) else v
            if vv not in _norm_list(option[k]):
                bad = Mismatch(
                    "value_error:dict_value", f"parameter {param!r}, key {k!r}: {_fmt(v)} not one of {_fmt(option[k])}"
                )
                break
        if bad is None:
            for k, vals in option.items():
                if k not in value and "" not in vals:
                    bad = Mismatch("value_error:dict_key", f"parameter {param!r}: missing key {k!r}")
                    break
        if bad is None:
            return None
        last = bad
    return last


def _check_list_of_dicts(param: str, value: list, allowed: list[Any]) -> Mismatch | None:
    last = Mismatch("value_error:list_dict", f"parameter {param!r}: no allowed list of dicts for {_fmt(value)}")
    for option in allowed:
        if not isinstance(option, list):
            continue
        if len(option) != len(value):
            last = Mismatch("value_error:list_dict_count", f"parameter {param!r}: {len(value)} dicts, expected {len(option)}")
            continue
        bad = None
        for i, (v, o) in enumerate(zip(value, option)):
            if not isinstance(v, dict):
                bad = Mismatch("type_error:nested", f"parameter {param!r}: item {i} is not a dict")
                break
            bad = _check_dict(f"{param}[{i}]", v, [o])
            if bad:
                break
        if bad is None:
            return None
        last = bad
    return last


def _type_ok(value: Any, want: type, item_type: type | None, allowed: list[Any]) -> bool:
    if type(value) is not want:
        return False
    if item_type is None:
        return True
    # BFCL checks the items of an array only when every allowed answer is itself a list; an item may also have the
    # type of that answer's own items (a "variable", as at the top level).
    if not allowed or any(not isinstance(a, list) for a in allowed):
        return True

    def items_ok(answer: list[Any]) -> bool:
        at = _answer_type(answer)
        return all(
            type(v) is item_type or (item_type is float and type(v) is int) or (at is not None and type(v) is at)
            for v in value
        )

    return any(items_ok(a) for a in allowed)


def check_call(function: dict[str, Any] | None, call: ToolCall, answer: dict[str, dict[str, list[Any]]]) -> Mismatch | None:
    """Returns None if ``call`` matches the one expected call ``answer`` (``{name: {param: [allowed]}}``), else the
    first reason it does not. ``function`` is the BFCL doc of the expected function (None if the item lacks it)."""
    (name, expected), = answer.items()
    if call.name != name:
        return Mismatch("wrong_func_name", f"called {call.name!r}, expected {name!r}")
    if function is None:
        return Mismatch("missing_function_doc", f"no function doc named {name!r} in the item")
    props = function.get("parameters", {}).get("properties", {})
    for req in function.get("parameters", {}).get("required", []):
        if req not in call.arguments:
            return Mismatch("missing_required", f"{name}: missing required parameter {req!r}")
    for param, value in call.arguments.items():
        if param not in props or param not in expected:
            return Mismatch("unexpected_param", f"{name}: unexpected parameter {param!r}")
        allowed = expected[param]
        type_name = props[param].get("type", "any")
        want = _PY_TYPES.get(type_name, str)
        item_type = None
        if type_name in ("array", "tuple"):
            item_type = _PY_TYPES.get(props[param].get("items", {}).get("type", ""), None)
        if type_name == "float" and type(value) is int:
            value = float(value)
        is_variable = False
        if not _type_ok(value, want, item_type, allowed):
            # A value of the answer's own type stands for a variable (BFCL writes those as strings).
            at = _answer_type(allowed)
            if at is not None and type(value) is at and at is not want:
                is_variable = True
            else:
                return Mismatch(
                    "type_error",
                    f"{name}: parameter {param!r} must be {type_name}, got {type(value).__name__} {_fmt(value)}",
                )
        elif _answer_type(allowed) not in (None, want):
            is_variable = True
        if not is_variable:
            if want is dict:
                bad = _check_dict(param, value, allowed)
                if bad:
                    return Mismatch(bad.error_type, f"{name}: {bad.error}")
                continue
            if want is list and item_type is dict:
                bad = _check_list_of_dicts(param, value, allowed)
                if bad:
                    return Mismatch(bad.error_type, f"{name}: {bad.error}")
                continue
            if want is str:
                if _norm(value) not in [_norm(a) for a in allowed if isinstance(a, str)]:
                    return Mismatch("value_error:string", f"{name}: parameter {param!r} = {_fmt(value)}, expected one of {_fmt(allowed)}")
                continue
            if want is list:
                if _norm_list(value) not in [_norm_list(a) for a in allowed if isinstance(a, list)]:
                    return Mismatch("value_error:list", f"{name}: parameter {param!r} = {_fmt(value)}, expected one of {_fmt(allowed)}")
                continue
        if value not in allowed:
            return Mismatch("value_error", f"{name}: parameter {param!r} = {_fmt(value)}, expected one of {_fmt(allowed)}")
    for param, allowed in expected.items():
        if param not in call.arguments and "" not in allowed:
            return Mismatch("missing_param", f"{name}: parameter {param!r} is not optional and was not given")
    return None


def _find_function(item: BFCLItem, name: str) -> dict[str, Any] | None:
    for f in item.functions:
        if f.get("name") == name:
            return f
    return None


def grade(item: BFCLItem, calls: list[ToolCall]) -> Mismatch | None:
    """Returns None if ``calls`` answer ``item`` correctly, else why not (see the module docstring for the rules)."""
    if item.category == "irrelevance":
        if calls:
            return Mismatch("irrelevance:called", f"called {', '.join(c.name for c in calls)} but no function fits")
        return None
    answers = list(item.answers)
    if len(calls) != len(answers):
        return Mismatch("wrong_count", f"{len(calls)} function call(s), expected {len(answers)}")
    # ok[i][j]: call j matches answer i. A perfect matching (Kuhn's augmenting paths) makes the multiset match
    # independent of order; for one expected call this is just the one check.
    reasons: dict[tuple[int, int], Mismatch] = {}
    ok = [[False] * len(calls) for _ in answers]
    for i, ans in enumerate(answers):
        fn = _find_function(item, next(iter(ans)))
        for j, call in enumerate(calls):
            bad = check_call(fn, call, ans)
            ok[i][j] = bad is None
            if bad:
                reasons[(i, j)] = bad
    match_of_call: list[int] = [-1] * len(calls)

    def augment(i: int, seen: set[int]) -> bool:
        for j in range(len(calls)):
            if ok[i][j] and j not in seen:
                seen.add(j)
                if match_of_call[j] < 0 or augment(match_of_call[j], seen):
                    match_of_call[j] = i
                    return True
        return False

    for i in range(len(answers)):
        if not augment(i, set()):
            name = next(iter(answers[i]))
            # The most telling reason: from a call of the same function if there is one.
            cand = [reasons[(i, j)] for j in range(len(calls)) if (i, j) in reasons]
            same = [r for r in cand if r.error_type != "wrong_func_name"]
            why = (same or cand or [Mismatch("no_match", "")])[0]
            if len(answers) == 1:
                return why
            return Mismatch(f"parallel:no_match:{why.error_type}", f"no call matches expected call {i} ({name}): {why.error}")
    return None


def answer_defects(item: BFCLItem) -> list[str]:
    """Returns why no tool call can match ``item`` under the rules above (empty for a sound item): a required
    parameter with no allowed value, or a non-optional answer parameter the function doc does not declare. A few
    BFCL v4 items have such defects; every model scores 0 on them in BFCL's own checker."""
    out = []
    for ans in item.answers:
        (name, params), = ans.items()
        fn = _find_function(item, name)
        if fn is None:
            out.append(f"{name}: not among the item's functions")
            continue
        doc = fn.get("parameters", {})
        props = doc.get("properties", {})
        for req in doc.get("required", []):
            if not [a for a in params.get(req, []) if a != ""]:
                out.append(f"{name}: required parameter {req!r} has no allowed value")
        for p, allowed in params.items():
            if p not in props and "" not in allowed:
                out.append(f"{name}: answer parameter {p!r} is not declared by the function")
    return out


@functools.lru_cache(maxsize=None)
def items_of(category: str, skip_defective: bool = True) -> tuple[BFCLItem, ...]:
    """Returns the items an env of ``category`` serves: all of them, or (default) those without
    :func:`answer_defects` (5 of the 2,590 covered BFCL v4 items are dropped that way, all in the live categories)."""
    items = load_category(category)
    return tuple(it for it in items if not answer_defects(it)) if skip_defective else items


# ---------------------------------------------------------------------------------------------------------------
# Oracle


def _pick(allowed: list[Any]) -> tuple[bool, Any]:
    """Returns (present, value): the first allowed value, or absent when the parameter may be omitted."""
    for a in allowed:
        if a != "":
            return True, _build(a)
    return False, None


def _build(value: Any) -> Any:
    # Dicts inside answers map each key to its allowed values; lists of such dicts likewise.
    if isinstance(value, dict):
        out = {}
        for k, vals in value.items():
            present, v = _pick(vals) if isinstance(vals, list) else (True, vals)
            if present:
                out[k] = v
        return out
    if isinstance(value, list):
        return [_build(v) if isinstance(v, dict) else v for v in value]
    return value


def oracle_calls(item: BFCLItem) -> list[ToolCall]:
    """Returns ground-truth calls for ``item``: for each expected call, every parameter that may not be omitted with
    its first allowed value (optional ones, whose allowed values include ``""``, are left out unless the function
    doc requires them). Empty for ``irrelevance``."""
    calls = []
    for ans in item.answers:
        (name, params), = ans.items()
        doc = (_find_function(item, name) or {}).get("parameters", {})
        required = set(doc.get("required", []))
        args = {}
        for p, allowed in params.items():
            # Omit what may be omitted (some answers list values for parameters the doc does not declare).
            if "" in allowed and p not in required:
                continue
            present, v = _pick(allowed)
            if present:
                args[p] = v
        calls.append(ToolCall(name=name, arguments=args))
    return calls


def oracle_text(item: BFCLItem) -> str:
    """Returns the assistant message that makes exactly :func:`oracle_calls` (a plain refusal for irrelevance)."""
    calls = oracle_calls(item)
    if not calls:
        return "None of the provided functions can answer this question."
    return "\n".join(format_tool_call(c.name, c.arguments) for c in calls)


# ---------------------------------------------------------------------------------------------------------------
# The env


class BFCLEnv(Env):
    """One BFCL item per episode, single turn (see the module docstring).

    ``reset(seed=, options=)`` picks the item: ``options["index"]`` (int) or ``options["id"]`` (a BFCL id) if
    given, else ``seed % len(items)`` if a seed is given, else a draw from ``self.np_random``. ``reset`` info:
    ``id``, ``index``, ``category``, ``tools`` (OpenAI-style schemas for a chat template). ``step`` returns
    ``([], reward, True, False, info)`` with ``info``: ``id``, ``correct``, ``error_type``, ``error``, ``calls``,
    ``parse_errors``. A malformed tool call scores 0 (``error_type`` ``"parse_error"``). Stepping before reset or
    after the episode ended gives reward 0 with ``error_type`` ``"not_running"``.
    """

    description = "Berkeley Function-Calling Leaderboard (BFCL v4) item, one tool-calling turn graded by AST match"

    def __init__(self, category: str = "simple", tools_in_prompt: bool = False, skip_defective: bool = True):
        super().__init__()
        self.category = category
        self.tools_in_prompt = tools_in_prompt
        self.items = items_of(category, skip_defective)
        self._index_of = {it.id: i for i, it in enumerate(self.items)}
        self.item: BFCLItem | None = None
        self.index: int | None = None
        self._done = True

    @property
    def num_tasks(self) -> int:
        """Number of items in the category (valid ``options["index"]`` are ``0..num_tasks-1``)."""
        return len(self.items)

    def task_ids(self) -> list[str]:
        """Returns the item ids, index-aligned (``task_ids()[i]`` is what ``options={"index": i}`` selects)."""
        return [it.id for it in self.items]

    @staticmethod
    def solve(conversation: list[Message]) -> str:
        """The scripted solver (``agentrl.envs.solver_for`` convention): the ground-truth answer of the item whose
        opening messages are ``conversation``, searched over every category. Exact with ``tools_in_prompt=True``
        (the prompt names the functions); without, 21 of the 2,586 items share their question with an item that
        has another answer and the first such item wins: use :meth:`oracle_policy`, which knows the task.
        Raises ``ValueError`` if no item matches."""
        key = _question_key(conversation)
        for category in CATEGORIES:
            found = _question_index(category).get(key)
            if found is not None:
                return oracle_text(found)
        raise ValueError("the conversation matches no BFCL item")

    def oracle_policy(self):
        """Returns a :class:`agentrl.policy.ScriptedPolicy` that answers each episode with its item's ground truth,
        found from ``meta.task`` (``{"instance_id": <BFCL id>}``, as ``agentrl eval`` passes it) or else from the
        conversation (see :meth:`solve`)."""
        from agentrl.policy import ScriptedPolicy

        category = self.category
        return ScriptedPolicy(lambda conversation, meta: oracle_text(_find_item(category, conversation, meta)))

    def _select(self, seed: int | None, options: dict[str, Any] | None) -> int:
        options = options or {}
        if "id" in options:
            if options["id"] not in self._index_of:
                raise ValueError(f"options['id']={options['id']!r} is not a BFCL {self.category} item")
            return self._index_of[options["id"]]
        if "index" in options:
            i = options["index"]
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.items):
                raise ValueError(f"options['index'] must be an int in [0, {len(self.items)}), got {i!r}")
            return i
        if seed is not None:
            return seed % len(self.items)
        return int(self.np_random.integers(len(self.items)))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.index = self._select(seed, options)
        self.item = self.items[self.index]
        self._done = False
        info = {
            "id": self.item.id,
            "index": self.index,
            "category": self.category,
            "tools": [tool_schema(f) for f in self.item.functions],
        }
        return prompt_messages(self.item, self.tools_in_prompt), info

    def step(self, action: str):
        if self._done or self.item is None:
            info = {"correct": False, "error_type": "not_running", "error": "step() called outside an episode; call reset()"}
            return [], 0.0, True, False, info
        self._done = True
        text = action if isinstance(action, str) else ""
        parsed = parse_tool_calls(text)
        info: dict[str, Any] = {
            "id": self.item.id,
            "category": self.category,
            "calls": [{"name": c.name, "arguments": c.arguments} for c in parsed.calls],
            "parse_errors": list(parsed.errors),
        }
        if not isinstance(action, str):
            bad: Mismatch | None = Mismatch("invalid_action", f"action must be a string, got {type(action).__name__}")
        elif parsed.errors:
            bad = Mismatch("parse_error", "; ".join(parsed.errors))
        else:
            bad = grade(self.item, parsed.calls)
        info["correct"] = bad is None
        info["error_type"] = bad.error_type if bad else None
        info["error"] = bad.error if bad else None
        return [], (1.0 if bad is None else 0.0), True, False, info


def _item_for(env_id: str, conversation: list[Message], meta: Any) -> BFCLItem:
    category = ENV_IDS.get(env_id)
    if category is None:
        raise ValueError(f"{env_id!r} is not a BFCL env id; known: {', '.join(ENV_IDS)}")
    return _find_item(category, conversation, meta)


def _find_item(category: str, conversation: list[Message], meta: Any) -> BFCLItem:
    task = getattr(meta, "task", None)
    wanted = None
    if isinstance(task, dict):
        wanted = task.get("id", task.get("instance_id"))
    if isinstance(wanted, str):
        for it in load_category(category):
            if it.id == wanted:
                return it
    # Otherwise recognise the item by its opening messages, which does not depend on how the runner chose the
    # task (an index depends on skip_defective).
    found = _question_index(category).get(_question_key(conversation))
    if found is None:
        raise ValueError(f"the conversation matches no BFCL {category} item")
    return found


def _question_key(conversation: list[Message]) -> str:
    # The user turns plus the offered function names identify an item (the system text depends on
    # tools_in_prompt, so only the names are taken from it, in the order the schemas list them).
    users = [m.get("content") for m in conversation if m.get("role") == "user"]
    system = next((m.get("content", "") for m in conversation if m.get("role") == "system"), "")
    names = re.findall(r'"function": \{"name": ("(?:[^"\\]|\\.)*")', system)
    return json.dumps([users, names])


@functools.lru_cache(maxsize=None)
def _question_index(category: str) -> dict[str, BFCLItem]:
    index: dict[str, BFCLItem] = {}
    for it in load_category(category):
        for tools_in_prompt in (True, False):
            index.setdefault(_question_key(prompt_messages(it, tools_in_prompt)), it)
    return index


def oracle_action(conversation: list[Message], meta: Any) -> str:
    """A :class:`agentrl.policy.ScriptedPolicy` function: the ground-truth answer of the episode's item, found from
    ``meta.task`` (a mapping with the BFCL ``id`` or ``instance_id``) or else from the opening messages in
    ``conversation``."""
    return oracle_text(_item_for(meta.env_id, conversation, meta))


def wrong_action(conversation: list[Message], meta: Any) -> str:
    """A :class:`agentrl.policy.ScriptedPolicy` function that is wrong on every item of every category: it makes
    one call more than expected (at least one), so the count never matches and irrelevance items see a call."""
    item = _item_for(meta.env_id, conversation, meta)
    name = item.functions[0]["name"]
    n = len(item.answers) + 1
    return "\n".join(format_tool_call(name, {}) for _ in range(n))


def register_all() -> None:
    """Registers every id in :data:`ENV_IDS` (idempotent; ``envs/__init__.py`` normally does this)."""
    from agentrl.registration import register, registered_ids

    have = set(registered_ids())
    for env_id, cat in ENV_IDS.items():
        if env_id not in have:
            register(env_id, entry_point="agentrl.envs.bfcl:BFCLEnv", kwargs={"category": cat}, max_episode_steps=1,
                     description=f"BFCL v4 {cat} (function calling, AST-graded, single turn)")
