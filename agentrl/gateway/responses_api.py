"""OpenAI's Responses dialect (``POST /v1/responses``, what Codex CLI speaks) over the chat-completions path.

Flow: :func:`parse_responses_request` turns a Responses body into the gateway's internal :class:`ChatRequest` (the
one ``/v1/chat/completions`` builds), so it is served by the same :meth:`Session.chat`: same renderer, segments and
token record. :func:`response_body` (and :class:`~agentrl.gateway.writers.ResponsesWriter`, streaming) write the :class:`Completion` back as a Response
object or its event stream; :class:`ResponseLog` keeps recent conversations for ``previous_response_id``.

Mapping (request -> chat messages):

- ``instructions`` is the first system message; ``input`` is a string (one user message) or a list of items:
  messages (``role`` user / assistant / system / developer; content a string or ``input_text`` / ``output_text``
  parts), ``function_call`` items (merged with the assistant message and ``reasoning`` item before them into one
  assistant turn with tool calls; ``call_id`` is the call's id), ``function_call_output`` items (``tool`` messages),
  ``reasoning`` items (their summary / content text is the next assistant turn's ``reasoning_content``).
- ``previous_response_id``: the conversation the gateway recorded for that response (its input and its reply) comes
  first; it must belong to the request's session (404 when the gateway does not hold it any more).
- ``tools``: function tools (flat form: ``name``, ``description``, ``parameters``); ``namespace`` tools are
  flattened into their function tools; hosted tools (``web_search``, ``file_search``, ``custom``, ...) cannot run
  here and are skipped, and the reply says so in the ``X-Agentrl-Note`` header.
- ``max_output_tokens``: none given means the gateway's cap; above it, clamped to it (noted in the header).

Reply: ``reasoning`` (when the template produced reasoning), ``message`` (``output_text``) and ``function_call``
items; ``status`` ``completed``, or ``incomplete`` with reason ``max_output_tokens``; ``usage`` in tokens.

Invariants: nothing here touches a session; every field is validated before the session is looked at, and a bad
field is named in the error (``input[3].call_id``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from agentrl.gateway.choices import Choice, Completion
from agentrl.gateway.protocol import APIError, ChatRequest, Sampling, _num, bad, new_id, now, parse_tools

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")


def _text(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(param, f"content must be a string or a list of text parts, got {type(content).__name__}")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(text, str):
            raise bad(f"{param}[{j}]", f"a content part of type {kind!r} is not supported (text parts only)")
        out.append(text)
    return "".join(out)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """The ``input`` items as chat messages (see the module docstring)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise bad("input", "input must be a string or a list of items")
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []

    def assistant() -> dict[str, Any]:
        """The assistant turn a function_call joins: the one just before it, else a new one."""
        if not (out and out[-1]["role"] == "assistant" and not out[-1].get("_closed")):
            out.append({"role": "assistant", "content": ""})
        if reasoning:
            out[-1]["reasoning_content"] = "\n".join(reasoning)
            reasoning.clear()
        return out[-1]

    for i, it in enumerate(items):
        p = f"input[{i}]"
        if not isinstance(it, dict):
            raise bad(p, f"each input item must be an object, got {type(it).__name__}")
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad(f"{p}.role", f"role must be user, assistant, system or developer, got {role!r}")
            text = _text(it.get("content"), f"{p}.content")
            if role == "assistant":
                assistant()["content"] += text
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            cid, name, args = it.get("call_id"), it.get("name"), it.get("arguments", "{}")
            if not isinstance(cid, str) or not cid or not isinstance(name, str) or not name:
                raise bad(p, "a function_call item needs call_id and name (non-empty strings)")
            if not isinstance(args, str):
                raise bad(f"{p}.arguments", "arguments must be a JSON string")
            assistant().setdefault("tool_calls", []).append(
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
        elif kind == "function_call_output":
            cid = it.get("call_id")
            if not isinstance(cid, str) or not cid:
                raise bad(f"{p}.call_id", "a function_call_output item needs call_id (the call's call_id)")
            if out and out[-1]["role"] == "assistant":
                out[-1]["_closed"] = True
            out.append({"role": "tool", "tool_call_id": cid, "content": _text(it.get("output"), f"{p}.output")})
        elif kind == "reasoning":
            text = _text(it.get("content"), f"{p}.content") or "\n".join(
                _text([s], f"{p}.summary") for s in _list(it.get("summary"), f"{p}.summary"))
            if text:
                reasoning.append(text)
        else:
            raise bad(f"{p}.type", f"input items of type {kind!r} are not supported (message, function_call, "
                                   f"function_call_output, reasoning)")
    for m in out:
        m.pop("_closed", None)
    return out


def _list(x: Any, param: str) -> list[Any]:
    """``x`` as a list (absent: empty); anything else a 400 naming ``param``."""
    if x is None:
        return []
    if not isinstance(x, list):
        raise bad(param, f"{param} must be a list, got {type(x).__name__}")
    return x


def _tools(tools: Any) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """Function tools (namespaces flattened) and the names of the skipped hosted tools."""
    if tools is None:
        return None, []
    if not isinstance(tools, list):
        raise bad("tools", "tools must be a list")
    out, skipped = [], []

    def add(t: Any, p: str) -> None:
        if not isinstance(t, dict):
            raise bad(p, "each tool must be an object")
        if t.get("type") == "namespace":
            for k, sub in enumerate(_list(t.get("tools"), f"{p}.tools")):
                add(sub, f"{p}.tools[{k}]")
        elif t.get("type") == "function":
            fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
            out.append({"type": "function", "function": fn})
        else:
            skipped.append(str(t.get("name") or t.get("type"))[:64])

    for i, t in enumerate(tools):
        add(t, f"tools[{i}]")
    return parse_tools(out), skipped


def parse_responses_request(body: dict[str, Any], cap: int, log: "ResponseLog") -> tuple[ChatRequest, list[str],
                                                                                          str | None]:
    """The Responses request as the internal chat request, the notes for the ``X-Agentrl-Note`` header, and the
    session that ``previous_response_id`` belongs to (None without one); raises :class:`APIError`."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "model is required (GET /v1/models lists the served model)")
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise bad("instructions", "instructions must be a string")
        messages.append({"role": "system", "content": body["instructions"]})
    prev, sid = body.get("previous_response_id"), None
    if prev is not None:
        if not isinstance(prev, str):
            raise bad("previous_response_id", "previous_response_id must be a string")
        sid, before = log.get(prev)
        # the recorded conversation already starts with the instructions given then
        messages = [m for m in before] + [m for m in messages if not before or before[0] != m]
    if body.get("input") is None:
        raise bad("input", "input is required (a string or a list of items)")
    messages += input_messages(body["input"])
    if not messages:
        raise bad("input", "input must hold at least one item")
    tools, skipped = _tools(body.get("tools"))
    notes = [f"hosted tools skipped (they cannot run here): {', '.join(skipped)}"] if skipped else []
    choice = body.get("tool_choice") or "auto"
    if choice not in ("auto", "none"):
        raise bad("tool_choice", f"tool_choice {choice!r:.80} is not supported (it needs constrained decoding); use "
                                 f"'auto' or 'none'")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt not in (None, {"type": "text"}):
        raise bad("text.format", "text.format other than {'type': 'text'} is not supported")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise bad("max_output_tokens", f"max_output_tokens must be a positive integer, got {limit!r:.40}")
    if limit is not None and limit > cap:
        notes.append(f"max_output_tokens {limit} clamped to this gateway's limit of {cap}")
        limit = cap
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"stream must be a boolean, got {stream!r:.40}")
    sampling = Sampling(temperature=_num(body, "temperature", 0.0, 2.0), top_p=_num(body, "top_p", 1e-9, 1.0),
                        max_tokens=limit)
    return ChatRequest(model, messages, tools, choice, sampling, stream), notes, sid


class ResponseLog:
    """The conversations of recent responses (their chat messages, reply included) and their sessions, for
    ``previous_response_id``; the oldest are forgotten past ``limit`` responses or ``max_chars`` characters of
    content in all (harness prompts run to 70k characters: the bound keeps the log's memory fixed)."""

    def __init__(self, limit: int = 256, max_chars: int = 64 << 20):
        self.limit, self.max_chars, self.chars = limit, max_chars, 0
        self._log: OrderedDict[str, tuple[str, list[dict[str, Any]], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._log)

    def get(self, rid: str) -> tuple[str, list[dict[str, Any]]]:
        if rid not in self._log:
            raise APIError(404, f"previous response {rid[:80]!r} is not held by this gateway (it keeps the last "
                                f"{self.limit}); send the whole conversation as input", "invalid_request_error",
                           "previous_response_id", "previous_response_not_found")
        sid, msgs, _ = self._log[rid]
        return sid, [dict(m) for m in msgs]

    def remember(self, rid: str, done: Completion, messages: list[dict[str, Any]]) -> None:
        c = done.choices[0]
        reply: dict[str, Any] = {"role": "assistant", "content": c.content or ""}
        if c.tool_calls:
            reply["tool_calls"] = c.tool_calls
        msgs = list(messages) + [reply]
        size = len(json.dumps(msgs, ensure_ascii=False))
        self._log[rid] = (done.session_id, msgs, size)
        self.chars += size
        while self._log and (len(self._log) > self.limit or self.chars > self.max_chars):
            self.chars -= self._log.popitem(last=False)[1][2]


# --------------------------------------------------------------------------------------------------------- replies
def _items(c: Choice, rid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if c.reasoning and c.reasoning.strip():
        out.append({"type": "reasoning", "id": f"rs_{rid}", "summary": [{"type": "summary_text", "text": c.reasoning}]})
    if c.content or not c.tool_calls:
        status = "incomplete" if c.finish_reason == "length" else "completed"  # as OpenAI marks a message cut short
        out.append({"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant",
                    "content": [{"type": "output_text", "text": c.content or "", "annotations": []}]})
    for k, call in enumerate(c.tool_calls):
        out.append({"type": "function_call", "id": f"fc_{rid}_{k}", "call_id": call["id"], "status": "completed",
                    "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    return out


def response_skeleton(req: ChatRequest, rid: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The Response's fields that do not depend on its output; ``raw``: the request body, whose
    ``previous_response_id``, ``instructions`` and ``metadata`` the Response echoes, as OpenAI's does."""
    instructions, metadata = raw.get("instructions"), raw.get("metadata")
    return {"id": rid, "object": "response", "created_at": now(), "model": req.model, "status": "in_progress",
            "incomplete_details": None, "error": None, "output": [],
            "previous_response_id": raw.get("previous_response_id"),
            "instructions": instructions if isinstance(instructions, (str, list)) else None,
            "tools": [{"type": "function", **t["function"]} for t in req.tools or []], "tool_choice": req.tool_choice,
            "parallel_tool_calls": True, "metadata": metadata if isinstance(metadata, dict) else {},
            "temperature": req.sampling.temperature, "top_p": req.sampling.top_p,
            "max_output_tokens": req.sampling.max_tokens, "usage": None}


def response_body(done: Completion, req: ChatRequest, rid: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The Response object for a request's (single) choice (``raw``: the request body)."""
    c = done.choices[0]
    cut = c.finish_reason == "length"
    return {**response_skeleton(req, rid, raw), "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": _items(c, rid.removeprefix("resp_")),
            "usage": {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens,
                      "total_tokens": done.prompt_tokens + done.completion_tokens,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def new_response_id() -> str:
    return "resp_" + new_id("x")[2:]
