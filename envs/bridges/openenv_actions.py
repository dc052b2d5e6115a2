"""The model's text as an OpenEnv action, per the action schema the server publishes at ``/schema``.

OpenEnv actions are pydantic models, so their schemas vary: one string (the echo template's ``message``, a coding
env's ``code``), one number (an Atari-style ``action_id``), or several fields (a tool call's ``tool_name`` and
``arguments``). :func:`action_shape` reads which; :func:`build_action` turns a model's turn into the step's data:

- one field that takes the text (``action_field``, else the one required field, else the one field there is):
  a string field gets the whole text unchanged; a number, boolean, list or object field gets the value parsed
  from the answer (the last ``<answer>...</answer>`` if any, else the whole text, read as every built-in env reads it:
  :func:`agentrl.envs.utils.answer_or_text`; JSON for lists and objects);
- otherwise the answer is the whole action as a JSON object (a fenced ```json block or the outermost ``{...}``
  are found in prose too), and every required field must be in it.

A turn that does not fit raises :class:`InvalidAction` naming the field and what it needed; the env makes that an
invalid-action observation (the episode goes on), never a failed episode: a model's malformed action is not the
server's fault. The base ``Action``'s optional ``metadata`` is never the field that takes the text.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from agentrl.envs.utils import answer_or_text
from agentrl.tools import JSON_ERRORS

_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)
_TYPES = ("string", "integer", "number", "boolean", "array", "object")


class InvalidAction(ValueError):
    """The model's turn does not fit the server's action schema (the message says how)."""


@dataclass(frozen=True)
class ActionShape:
    field: str | None
    """The field that takes the text; None: the text is the whole action as a JSON object."""
    type: str
    """That field's JSON type (``"object"`` for a whole action)."""
    required: tuple[str, ...]
    summary: str
    """The fields and their types, for the model's hint and for error messages."""

    def hint(self) -> str:
        """What the model must answer, for a system message (empty for a plain text field: any text does)."""
        if self.field is not None and self.type == "string":
            return ""
        if self.field is not None:
            return f"Act by answering <answer>VALUE</answer>, where VALUE is the action's {self.field!r} ({self.type})."
        return f"Act by answering <answer>JSON</answer>, where JSON is the action as an object: {self.summary}."


def _json_type(prop: Any) -> str:
    if not isinstance(prop, dict):
        return "string"
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None:
        for alt in prop.get("anyOf") or prop.get("oneOf") or []:
            alt_kind = _json_type(alt)
            if isinstance(alt, dict) and alt.get("type") != "null":
                return alt_kind
        if "$ref" in prop or "properties" in prop:
            return "object"
        if isinstance(prop.get("enum"), list) and prop["enum"] and all(isinstance(v, str) for v in prop["enum"]):
            return "string"
    return kind if kind in _TYPES else "string"


def action_shape(schema: Any, action_field: str | None = None) -> ActionShape:
    """The shape of an action schema (``/schema``'s ``action``); ``action_field`` names the field that takes the
    text. Raises ValueError for a schema that is not an object schema."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties", {}), dict):
        raise ValueError(f"the action schema is not a JSON object schema: {str(schema)[:120]!r}")
    props = {k: v for k, v in schema.get("properties", {}).items() if isinstance(k, str)}
    required = tuple(k for k in schema.get("required", []) or [] if isinstance(k, str))
    summary = "{" + ", ".join(f'"{k}": {_json_type(v)}{"" if k in required else " (optional)"}'
                              for k, v in props.items() if k != "metadata") + "}"
    if action_field is not None:
        return ActionShape(action_field, _json_type(props.get(action_field)), required, summary)
    candidates = [k for k in required] or [k for k in props if k != "metadata"]
    if len(candidates) == 1:
        return ActionShape(candidates[0], _json_type(props.get(candidates[0])), required, summary)
    return ActionShape(None, "object", required, summary)


def _json_object(text: str) -> Any:
    body = answer_or_text(text)
    for candidate in (body, *(m.group(1) for m in _FENCE.finditer(body)),
                      body[body.find("{"): body.rfind("}") + 1] if "{" in body else ""):
        if candidate:
            try:
                return json.loads(candidate)
            except (*JSON_ERRORS, RecursionError):
                continue
    raise InvalidAction("the answer holds no JSON object")


def _value(kind: str, text: str, field: str) -> Any:
    body = answer_or_text(text)
    try:
        if kind in ("integer", "number"):
            value = json.loads(body)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError
            if kind == "integer":
                if value != int(value):
                    raise ValueError
                value = int(value)
            return value
        if kind == "boolean":
            return {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}[body.lower()]
        value = json.loads(body)
        if not isinstance(value, list if kind == "array" else dict):
            raise ValueError
        return value
    except (ValueError, KeyError, RecursionError):
        raise InvalidAction(f"{field!r} must be {'an' if kind[0] in 'aeio' else 'a'} {kind}, got {body[:60]!r}") from None


def build_action(shape: ActionShape, text: str) -> dict[str, Any]:
    """The step's action data for the model's ``text``; raises :class:`InvalidAction`."""
    if shape.field is not None:
        return {shape.field: text if shape.type == "string" else _value(shape.type, text, shape.field)}
    action = _json_object(text)
    if not isinstance(action, dict):
        raise InvalidAction(f"the action must be a JSON object {shape.summary}, got {type(action).__name__}")
    missing = [k for k in shape.required if k not in action]
    if missing:
        raise InvalidAction(f"the action misses {', '.join(map(repr, missing))} (the action is {shape.summary})")
    return action
