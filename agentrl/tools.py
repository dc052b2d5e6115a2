"""Tool calls: the one format tool-using envs accept, and a small typed tool registry.

Format (what Qwen2.5/Qwen3 and Hermes chat templates emit): each call is a JSON object with a ``name`` string and
an ``arguments`` object, inside ``<tool_call>...</tool_call>``::

    I will look it up.
    <tool_call>
    {"name": "lookup", "arguments": {"key": "alice"}}
    </tool_call>

Several calls in one message are allowed. Text outside the tags is kept as ``content``. ``arguments`` may also
be a JSON string that decodes to an object (some models emit that). Malformed calls never raise: they come back in
``ParsedToolCalls.errors`` with a message the env can show the model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedToolCalls:
    """``calls`` in order of appearance; ``errors`` one message per malformed call; ``content`` the text outside
    the tags, stripped."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""


# What json.loads raises on text nobody checked: JSONDecodeError, a plain ValueError (an integer of over 4,300
# digits) or RecursionError (nested too deeply).
JSON_ERRORS = (ValueError, RecursionError)


def json_error(e: BaseException) -> str:
    """What was wrong with JSON that :data:`JSON_ERRORS` reported, in a few words."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at position {e.pos}"
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)[:120]


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Parses every ``<tool_call>`` block in ``text``. Never raises."""
    out = ParsedToolCalls()
    pieces, last = [], 0
    for i, m in enumerate(TOOL_CALL_RE.finditer(text), 1):
        pieces.append(text[last : m.start()])
        last = m.end()
        if not m.group(2):
            out.errors.append(f"tool call {i}: missing closing </tool_call> tag")
            continue
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except JSON_ERRORS as e:
            out.errors.append(f"tool call {i}: invalid JSON ({json_error(e)})")
            continue
        if not isinstance(obj, dict):
            out.errors.append(f"tool call {i}: expected a JSON object with 'name' and 'arguments', got {type(obj).__name__}")
            continue
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            out.errors.append(f"tool call {i}: missing or non-string 'name'")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except JSON_ERRORS:
                out.errors.append(f"tool call {i} ({name}): 'arguments' is a string that is not valid JSON")
                continue
        if not isinstance(args, dict):
            out.errors.append(f"tool call {i} ({name}): 'arguments' must be an object, got {type(args).__name__}")
            continue
        out.calls.append(ToolCall(name=name, arguments=args))
    pieces.append(text[last:])
    out.content = "".join(pieces).strip()
    return out


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """Returns the text of one tool call in the documented format (for scripted policies and demos)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


@dataclass
class Tool:
    """A callable tool with a JSON-schema ``parameters`` object (``properties`` and ``required``)."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        """Returns the OpenAI-style function schema (what chat templates take as ``tools``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def validate(self, arguments: dict[str, Any]) -> str | None:
        """Returns None if ``arguments`` fit the schema, else a message naming the bad argument."""
        props = self.parameters.get("properties", {})
        for req in self.parameters.get("required", []):
            if req not in arguments:
                return f"{self.name}: missing required argument {req!r}"
        for k, v in arguments.items():
            if k not in props:
                return f"{self.name}: unknown argument {k!r} (expected one of {sorted(props)})"
            want = props[k].get("type")
            types = _JSON_TYPES.get(want)
            if types and (not isinstance(v, types) or (want in ("integer", "number") and isinstance(v, bool))):
                return f"{self.name}: argument {k!r} must be {want}, got {type(v).__name__}"
        return None


class ToolSet:
    """Tools by name; :meth:`call` turns any bad call into an error string, never an exception."""

    def __init__(self, tools: list[Tool]):
        self.tools = {t.name: t for t in tools}

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    def call(self, call: ToolCall) -> tuple[bool, str]:
        """Runs ``call``; returns ``(ok, text)`` where ``text`` is the result or the error shown to the model."""
        tool = self.tools.get(call.name)
        if tool is None:
            return False, f"error: unknown tool {call.name!r}; available tools: {', '.join(sorted(self.tools))}"
        problem = tool.validate(call.arguments)
        if problem:
            return False, f"error: {problem}"
        try:
            return True, str(tool.fn(**call.arguments))
        except Exception as e:  # a tool's own failure is an observation, not a crash
            return False, f"error: {call.name} failed: {e}"
