"""Anthropic's Messages dialect (``POST /v1/messages``, what Claude Code speaks) over the chat-completions path.

Flow: :func:`parse_messages_request` turns a Messages body into the gateway's internal :class:`ChatRequest` (the
same one ``/v1/chat/completions`` builds), so the request is served by the same :meth:`Session.chat`: same renderer,
same segments, same token record (exact ids, log-probs, versions, drifts, rewards). :func:`message_body` and
:class:`~agentrl.gateway.writers.MessagesWriter` write the :class:`Completion` back as a Messages reply or its
event stream (token by token).

Mapping (request -> chat messages):

- ``system`` (a string or text blocks) is the first system message; a ``role: "system"`` message inside
  ``messages`` (Claude Code sends one) stays a system message where it is.
- A user message's ``tool_result`` blocks become ``tool`` messages (``tool_call_id`` = ``tool_use_id``), in order,
  before the message's text; its text blocks become one user message.
- An assistant message's ``text`` blocks are its content, ``tool_use`` blocks its tool calls (``input`` as JSON
  arguments), ``thinking`` blocks its ``reasoning_content``; so a reply sent back as the gateway gave it is
  recognised as the gateway's own turn and rendered as recorded (no drift).
- ``tools`` (``name``, ``description``, ``input_schema``) become function tools; Anthropic's server tools (a
  ``type`` other than ``custom``, e.g. ``web_search_20250305``) cannot run here and are skipped, and the reply says
  so in the ``X-Agentrl-Note`` header. ``tool_choice`` ``auto``/``none`` only (``any``/``tool`` need constrained
  decoding).
- ``max_tokens`` above the gateway's cap is clamped to it, not refused (Claude Code asks for 32,000 by default);
  the ``X-Agentrl-Note`` header says so. ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` map to sampling;
  ``thinking``, ``metadata``, ``cache_control`` are accepted and ignored (whether the model reasons is its
  template's business).

Reply: ``thinking`` (when the template produced reasoning), ``text`` and ``tool_use`` blocks; ``stop_reason``
``tool_use`` / ``max_tokens`` / ``stop_sequence`` (with ``stop_sequence``) / ``end_turn``; ``usage`` in tokens.
Errors are Anthropic's ``{"type": "error", "error": {"type", "message"}}`` (:func:`error_body`).

Invariants: nothing here touches a session; every field is validated before the session is looked at, and a bad
field is named in the error (``messages[2].content[0].tool_use_id``).
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.gateway.choices import Choice, Completion
from agentrl.gateway.protocol import APIError, ChatRequest, Sampling, _num, assistant_message, bad, new_id, \
    parse_tools
from agentrl.tools import JSON_ERRORS

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 409: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}


def error_body(e: APIError) -> dict[str, Any]:
    """An :class:`APIError` in Anthropic's error form (the ``param`` is kept in the message)."""
    kind = _ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    where = f" ({e.param})" if e.param else ""
    return {"type": "error", "error": {"type": kind, "message": e.message + where}}


def _text(content: Any, param: str) -> str:
    """A string or a list of text blocks (other keys such as ``cache_control`` ignored) as text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(param, f"content must be a string or a list of content blocks, got {type(content).__name__}")
    out = []
    for j, b in enumerate(content):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise bad(f"{param}[{j}]", f"a block of type {kind!r} is not supported here (text blocks only)")
        out.append(b["text"])
    return "\n".join(out) if len(out) > 1 else "".join(out)


def _user(m: dict[str, Any], p: str) -> list[dict[str, Any]]:
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise bad(f"{p}.content", "content must be a string or a list of content blocks")
    tools, texts = [], []
    for j, b in enumerate(content):
        q = f"{p}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "tool_result":
            tid = b.get("tool_use_id")
            if not isinstance(tid, str) or not tid:
                raise bad(f"{q}.tool_use_id", "a tool_result needs tool_use_id (the tool_use block's id)")
            result = b.get("content")
            text = "" if result is None else _text(result, f"{q}.content")
            if b.get("is_error") is True and not text.startswith("Error"):
                text = f"Error: {text}"
            tools.append({"role": "tool", "tool_call_id": tid, "content": text})
        else:
            raise bad(q, f"a user content block of type {kind!r} is not supported (text and tool_result only)")
    return tools + ([{"role": "user", "content": "\n".join(texts) if len(texts) > 1 else "".join(texts)}]
                    if texts or not tools else [])


def _assistant(m: dict[str, Any], p: str) -> dict[str, Any]:
    content = m.get("content")
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise bad(f"{p}.content", "content must be a string or a list of content blocks")
    texts, calls, thinking = [], [], []
    for j, b in enumerate(content):
        q = f"{p}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            thinking.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue  # opaque to this model
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or not b["name"]:
                raise bad(q, "a tool_use block needs an id and a name (strings)")
            args = b.get("input", {})
            if not isinstance(args, dict):
                raise bad(f"{q}.input", "a tool_use block's input must be an object")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
        else:
            raise bad(q, f"an assistant content block of type {kind!r} is not supported (text, thinking, tool_use)")
    return assistant_message("".join(texts), calls, "\n".join(thinking) if thinking else None)


def parse_chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``system`` and ``messages`` as chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _text(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "messages must be a non-empty list of {role, content} messages")
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(p, f"each message must be an object, got {type(m).__name__}")
        role = m.get("role")
        if role == "user":
            out += _user(m, p)
        elif role == "assistant":
            out.append(_assistant(m, p))
        elif role == "system":
            out.append({"role": "system", "content": _text(m.get("content", ""), f"{p}.content")})
        else:
            raise bad(f"{p}.role", f"role must be user, assistant or system, got {role!r}")
    return out


def _tools(tools: Any) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """Function tools and the names of the skipped server tools."""
    if tools is None:
        return None, []
    if not isinstance(tools, list):
        raise bad("tools", "tools must be a list")
    out, skipped = [], []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise bad(f"tools[{i}]", "each tool must be an object")
        if t.get("type") not in (None, "custom"):
            skipped.append(str(t.get("name") or t.get("type"))[:64])
            continue
        schema = t.get("input_schema", {"type": "object", "properties": {}})
        out.append({"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                                      "parameters": schema}})
    try:
        return parse_tools(out), skipped
    except APIError as e:  # name the field as the client sent it
        raise bad((e.param or "tools").replace(".function.parameters", ".input_schema").replace(".function", ""),
                  e.message, e.code) from None


def parse_messages_request(body: dict[str, Any], cap: int) -> tuple[ChatRequest, list[str]]:
    """Returns the Messages request as the internal chat request (``max_tokens`` clamped to ``cap``) and the notes
    for the reply's ``X-Agentrl-Note`` header (clamping, skipped tools); raises :class:`APIError`."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "model is required (GET /v1/models lists the served model)")
    messages = parse_chat_messages(body)
    tools, skipped = _tools(body.get("tools"))
    notes = [f"server tools skipped (they cannot run here): {', '.join(skipped)}"] if skipped else []
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "none"):
        raise bad("tool_choice", f"tool_choice {choice!r:.80} is not supported (it needs constrained decoding); use "
                                 f"{{'type': 'auto'}} or {{'type': 'none'}}")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad("max_tokens", f"max_tokens must be a positive integer, got {max_tokens!r:.40}")
    if max_tokens is not None and max_tokens > cap:
        notes.append(f"max_tokens {max_tokens} clamped to this gateway's limit of {cap}")
        max_tokens = cap
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list) or len(stop) > 16 or any(not isinstance(s, str) or not s for s in stop):
        raise bad("stop_sequences", "stop_sequences must be a list of at most 16 non-empty strings")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"stream must be a boolean, got {stream!r:.40}")
    top_k = _num(body, "top_k", 0, 1 << 30, integer=True)
    sampling = Sampling(temperature=_num(body, "temperature", 0.0, 2.0), top_p=_num(body, "top_p", 1e-9, 1.0),
                        top_k=-1 if top_k == 0 else top_k, max_tokens=max_tokens, stop=list(stop))
    return ChatRequest(model, messages, tools, kind, sampling, stream), notes


# --------------------------------------------------------------------------------------------------------- replies
def _blocks(c: Choice) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if c.reasoning and c.reasoning.strip():  # an empty <think></think> is no thinking block
        out.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
    if c.content or not c.tool_calls:
        out.append({"type": "text", "text": c.content or ""})
    for call in c.tool_calls:
        try:
            args = json.loads(call["function"]["arguments"] or "{}")
        except JSON_ERRORS:
            args = {}
        out.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                    "input": args if isinstance(args, dict) else {"value": args}})
    return out


def _stop(c: Choice) -> tuple[str, str | None]:
    if c.tool_calls:
        return "tool_use", None
    if c.finish_reason == "length":
        return "max_tokens", None
    if c.stop_sequence is not None:
        return "stop_sequence", c.stop_sequence
    return "end_turn", None


def message_body(done: Completion, model: str, mid: str | None = None) -> dict[str, Any]:
    """The Messages reply for a request's (single) choice."""
    c = done.choices[0]
    reason, seq = _stop(c)
    return {"id": mid or new_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": _blocks(c), "stop_reason": reason, "stop_sequence": seq,
            "usage": {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens}}


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


def error_event(e: APIError) -> bytes:
    return event("error", {"error": error_body(e)["error"]})


PING = event("ping", {})
