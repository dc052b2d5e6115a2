"""The four API dialects a hosted policy speaks (:mod:`agentrl.eval.hosted`), as pure conversions.

The session keeps one conversation in OpenAI chat form (``system``/``user``/``tool`` messages, ``assistant``
messages with ``tool_calls``); each dialect turns it into its request and its answer back into a :class:`Reply`:

- ``chat``: OpenAI chat completions, ``POST {base}/chat/completions``;
- ``responses``: OpenAI Responses, ``POST {base}/responses``, stateless (the whole conversation as ``input``
  items: messages, ``function_call`` and ``function_call_output``), ``instructions`` from the system messages;
- ``messages``: Anthropic Messages, ``POST {base}/messages``, ``system`` apart, ``tool_use`` / ``tool_result``
  content blocks, ``x-api-key`` and ``anthropic-version`` headers;
- ``gemini``: Google's Gemini, ``POST {base}/models/{model}:generateContent``, ``systemInstruction`` apart,
  ``functionCall`` / ``functionResponse`` parts (a result named by the call it answers), ``x-goog-api-key``.

Every converter raises ``ValueError`` for an answer that is not of its dialect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools import JSON_ERRORS

ANTHROPIC_VERSION = "2023-06-01"
DIALECTS = ("chat", "responses", "messages", "gemini")


@dataclass
class Reply:
    """One answer: the text, OpenAI-style tool calls (``id``, ``function.name``, ``function.arguments`` as JSON
    text), the finish reason and the token usage the API reported."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _function(tool: Any) -> dict[str, Any]:
    """An env's tool schema as a bare function schema ``{"name", "description", "parameters"}``."""
    if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
        return tool["function"]
    return tool


def request(dialect: str, model: str, messages: list[dict[str, Any]], tools: list[Any] | None,
            temperature: float, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path (below the base URL) and body of one request."""
    fns = [_function(t) for t in tools or []]
    if dialect == "chat":
        body: dict[str, Any] = {"model": model, "messages": messages, "temperature": temperature,
                                "max_tokens": max_tokens}
        if fns:
            body["tools"] = [{"type": "function", "function": f} for f in fns]
        return "/chat/completions", body
    if dialect == "responses":
        system = [m.get("content") or "" for m in messages if m["role"] == "system"]
        items: list[dict[str, Any]] = []
        for m in messages:
            if m["role"] == "system":
                continue
            if m["role"] == "tool":
                items.append({"type": "function_call_output", "call_id": m.get("tool_call_id", ""),
                              "output": m.get("content") or ""})
                continue
            if m.get("content"):
                items.append({"type": "message", "role": m["role"], "content": m["content"]})
            for c in m.get("tool_calls") or []:
                items.append({"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                              "arguments": c["function"].get("arguments") or "{}"})
        body = {"model": model, "input": items, "temperature": temperature, "max_output_tokens": max_tokens}
        if system:
            body["instructions"] = "\n\n".join(system)
        if fns:
            body["tools"] = [{"type": "function", **f} for f in fns]
        return "/responses", body
    if dialect == "messages":
        system = [m.get("content") or "" for m in messages if m["role"] == "system"]
        out: list[dict[str, Any]] = []
        for m in messages:
            if m["role"] == "system":
                continue
            if m["role"] == "tool":
                block = {"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""), "content": m.get("content") or ""}
                if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                    out[-1]["content"].append(block)  # results of one turn's calls go in one user message
                else:
                    out.append({"role": "user", "content": [block]})
                continue
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for c in m.get("tool_calls") or []:
                blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                               "input": json_object(c["function"].get("arguments"))})
            out.append({"role": m["role"], "content": blocks or [{"type": "text", "text": ""}]})
        body = {"model": model, "messages": out, "temperature": temperature, "max_tokens": max_tokens}
        if system:
            body["system"] = "\n\n".join(system)
        if fns:
            body["tools"] = [{"name": f.get("name", ""), "description": f.get("description", ""),
                              "input_schema": f.get("parameters") or {"type": "object"}} for f in fns]
        return "/messages", body
    if dialect == "gemini":
        return f"/models/{model}:generateContent", _gemini_request(messages, fns, temperature, max_tokens)
    raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")


def _gemini_request(messages: list[dict[str, Any]], fns: list[dict[str, Any]], temperature: float,
                    max_tokens: int) -> dict[str, Any]:
    system = [m.get("content") or "" for m in messages if m["role"] == "system"]
    names: dict[str, str] = {}  # call id -> function name: a functionResponse names its function
    contents: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "tool":
            cid = m.get("tool_call_id", "")
            part = {"functionResponse": {"id": cid, "name": names.get(cid, m.get("name", "")),
                                         "response": {"output": m.get("content") or ""}}}
            if contents and contents[-1]["role"] == "user" and "functionResponse" in contents[-1]["parts"][-1]:
                contents[-1]["parts"].append(part)  # results of one turn's calls go in one user turn
            else:
                contents.append({"role": "user", "parts": [part]})
            continue
        parts: list[dict[str, Any]] = [{"text": m["content"]}] if m.get("content") else []
        for c in m.get("tool_calls") or []:
            names[c["id"]] = c["function"]["name"]
            parts.append({"functionCall": {"id": c["id"], "name": c["function"]["name"],
                                           "args": json_object(c["function"].get("arguments"))}})
        contents.append({"role": "model" if m["role"] == "assistant" else "user", "parts": parts or [{"text": ""}]})
    body: dict[str, Any] = {"contents": contents,
                            "generationConfig": {"temperature": temperature, "maxOutputTokens": max_tokens}}
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    if fns:
        body["tools"] = [{"functionDeclarations": [
            {"name": f.get("name", ""), "description": f.get("description", ""),
             "parametersJsonSchema": f.get("parameters") or {"type": "object"}} for f in fns]}]
    return body


def headers(dialect: str, key: str) -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if dialect == "messages":
        h["anthropic-version"] = ANTHROPIC_VERSION
        if key:
            h["x-api-key"] = key
    elif dialect == "gemini":
        if key:
            h["x-goog-api-key"] = key
    elif key:
        h["Authorization"] = f"Bearer {key}"
    return h


def reply(dialect: str, answer: Any) -> Reply:
    """The :class:`Reply` in ``answer`` (the parsed JSON body); ``ValueError`` if it is not of ``dialect``."""
    try:
        if dialect == "chat":
            choice = answer["choices"][0]
            msg = choice["message"]
            calls = [c for c in (msg.get("tool_calls") or []) if isinstance(c, dict) and c.get("function")]
            u = answer.get("usage") or {}
            return Reply(msg.get("content") or "", calls, choice.get("finish_reason"),
                         int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0))
        if dialect == "responses":
            text, calls = [], []
            for item in answer["output"]:
                if item.get("type") == "message":
                    text += [c.get("text", "") for c in item.get("content") or [] if c.get("type") == "output_text"]
                elif item.get("type") == "function_call":
                    calls.append({"id": item.get("call_id") or item.get("id"), "type": "function",
                                  "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}})
            u = answer.get("usage") or {}
            finish = "tool_calls" if calls else ("length" if answer.get("status") == "incomplete" else "stop")
            return Reply("".join(text), calls, finish, int(u.get("input_tokens") or 0),
                         int(u.get("output_tokens") or 0))
        if dialect == "messages":
            text, calls = [], []
            for b in answer["content"]:
                if b.get("type") == "text":
                    text.append(b.get("text", ""))
                elif b.get("type") == "tool_use":
                    calls.append({"id": b["id"], "type": "function",
                                  "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}})
            u = answer.get("usage") or {}
            finish = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                      "stop_sequence": "stop"}.get(answer.get("stop_reason"), answer.get("stop_reason"))
            return Reply("".join(text), calls, finish, int(u.get("input_tokens") or 0),
                         int(u.get("output_tokens") or 0))
        if dialect == "gemini":
            cand = answer["candidates"][0]
            text, calls = [], []
            for k, part in enumerate((cand.get("content") or {}).get("parts") or []):
                if isinstance(part.get("text"), str) and not part.get("thought"):
                    text.append(part["text"])
                elif isinstance(part.get("functionCall"), dict):
                    fc = part["functionCall"]
                    calls.append({"id": fc.get("id") or f"call_{k}", "type": "function",
                                  "function": {"name": fc["name"], "arguments": json.dumps(fc.get("args") or {})}})
            u = answer.get("usageMetadata") or {}
            finish = "tool_calls" if calls else ("length" if cand.get("finishReason") == "MAX_TOKENS" else "stop")
            return Reply("".join(text), calls, finish, int(u.get("promptTokenCount") or 0),
                         int(u.get("candidatesTokenCount") or 0))
    except (KeyError, IndexError, TypeError, AttributeError, OverflowError) as e:  # Overflow: a usage of Infinity
        raise ValueError(f"not a {dialect} answer ({type(e).__name__}: {e})") from None
    raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")


def json_object(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, *JSON_ERRORS):
        return {"_unparsed": str(raw)}
    return value if isinstance(value, dict) else {"_unparsed": value}
