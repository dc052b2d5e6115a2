"""Google's Gemini dialect (``POST /v1beta/models/MODEL:generateContent`` and ``:streamGenerateContent``, what the
``google-genai`` clients and Gemini CLI speak) over the chat-completions path.

Flow: :func:`parse_gemini_request` turns a ``GenerateContentRequest`` into the gateway's internal
:class:`ChatRequest`, so it is served by the same :meth:`Session.chat` as every other dialect (same renderer,
segments and token record). :func:`gemini_body` and :class:`~agentrl.gateway.writers.GeminiWriter` write the
:class:`Completion` back as a ``GenerateContentResponse`` or its server-sent chunks (token by token).

Mapping (request -> chat messages). Field names are read in the REST API's camelCase or the proto's snake_case
(Google's servers take both):

- ``systemInstruction`` (its text parts) is the first system message.
- ``contents``: a ``user`` turn's ``functionResponse`` parts become ``tool`` messages (in order, before its text;
  the response's ``output`` or ``result`` string alone, as the SDKs wrap a function's return value, else its
  JSON); its text parts one user message. A ``model`` turn's text parts are its content, parts marked ``thought`` its
  ``reasoning_content``, ``functionCall`` parts its tool calls (``args`` as JSON arguments). A call without an
  ``id`` gets one from its turn and position, and a response without one answers the first open call of its name,
  so older clients that send no ids still pair calls and results.
- ``tools``: ``functionDeclarations`` become function tools (``parametersJsonSchema``, else ``parameters`` with
  Gemini's upper-case type names lowered); Google's own tools (``googleSearch``, ``codeExecution``, ...) cannot
  run here and are skipped, named in the ``X-Agentrl-Note`` header. ``toolConfig.functionCallingConfig.mode``
  ``AUTO``/``NONE`` only (``ANY`` needs constrained decoding).
- ``generationConfig``: ``maxOutputTokens`` (clamped to the gateway's cap, with a note), ``temperature``,
  ``topP``, ``topK``, ``stopSequences``, ``seed``; ``candidateCount`` 1 only. ``thinkingConfig``,
  ``safetySettings``, ``cachedContent`` and response-format fields are accepted and ignored.

Reply: one candidate whose parts are the reasoning (``thought: true``), the text and one ``functionCall`` per call
(with the gateway's call id); ``finishReason`` ``MAX_TOKENS`` when cut by the length, else ``STOP``;
``usageMetadata`` in tokens. Errors are Google's ``{"error": {"code", "message", "status"}}`` (:func:`error_body`).

Invariants: nothing here touches a session; a bad field is named in the error (``contents[2].parts[0]``).
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.gateway.choices import Choice, Completion
from agentrl.gateway.protocol import APIError, ChatRequest, Sampling, assistant_message, bad, parse_tools
from agentrl.tools import JSON_ERRORS

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 421: "PERMISSION_DENIED",
           429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}
METHODS = ("generateContent", "streamGenerateContent", "countTokens")


def error_body(e: APIError) -> dict[str, Any]:
    """An :class:`APIError` in Google's error form (the ``param`` is kept in the message)."""
    where = f" ({e.param})" if e.param else ""
    return {"error": {"code": e.status, "message": e.message + where,
                      "status": _STATUS.get(e.status, "INTERNAL" if e.status >= 500 else "INVALID_ARGUMENT")}}


def _get(d: dict[str, Any], camel: str) -> Any:
    """``d[camel]``, or its snake_case spelling."""
    if camel in d:
        return d[camel]
    return d.get("".join("_" + c.lower() if c.isupper() else c for c in camel))


def _parts(content: Any, p: str) -> list[dict[str, Any]]:
    if not isinstance(content, dict):
        raise bad(p, f"each content must be an object {{role, parts}}, got {type(content).__name__}")
    parts = content.get("parts")
    if not isinstance(parts, list) or not all(isinstance(x, dict) for x in parts):
        raise bad(f"{p}.parts", "parts must be a list of part objects")
    return parts


def _system(body: dict[str, Any]) -> list[dict[str, Any]]:
    inst = _get(body, "systemInstruction")
    if inst is None:
        return []
    if isinstance(inst, str):
        return [{"role": "system", "content": inst}] if inst else []
    texts = []
    for j, part in enumerate(_parts(inst, "systemInstruction")):
        if not isinstance(part.get("text"), str):
            raise bad(f"systemInstruction.parts[{j}]", "the system instruction takes text parts only")
        texts.append(part["text"])
    text = "\n".join(texts)
    return [{"role": "system", "content": text}] if text else []


class _Calls:
    """Call ids: the client's, or made from the turn and position; open calls by name, for responses sent
    without an id."""

    def __init__(self) -> None:
        self.open: list[tuple[str, str]] = []  # (name, id), in call order

    def call(self, fc: dict[str, Any], turn: int, k: int) -> str:
        cid = fc.get("id") if isinstance(fc.get("id"), str) and fc["id"] else f"call_{turn}_{k}"
        self.open.append((fc["name"], cid))
        return cid

    def answer(self, fr: dict[str, Any]) -> str:
        cid = fr.get("id") if isinstance(fr.get("id"), str) and fr["id"] else None
        for k, (name, open_id) in enumerate(self.open):
            if (cid is None and name == fr.get("name")) or open_id == cid:
                del self.open[k]
                return open_id
        return cid or f"call_{fr.get('name')}"


def _response_text(response: Any) -> str:
    """A ``functionResponse.response`` as the tool message's text: the string under Google's ``output`` /
    ``result`` key alone, ``Error: ...`` for ``error``, else the object as JSON."""
    if isinstance(response, dict) and len(response) == 1:
        (key, value), = response.items()
        if isinstance(value, str) and key in ("output", "result"):
            return value
        if isinstance(value, str) and key == "error":
            return value if value.startswith("Error") else f"Error: {value}"
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)


def _user(parts: list[dict[str, Any]], p: str, calls: _Calls) -> list[dict[str, Any]]:
    tools, texts = [], []
    for j, part in enumerate(parts):
        q = f"{p}.parts[{j}]"
        fr = _get(part, "functionResponse")
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(fr, dict):
            if not isinstance(fr.get("name"), str) or not fr["name"]:
                raise bad(f"{q}.functionResponse.name", "a functionResponse needs the function's name")
            text = _response_text(fr.get("response", {}))
            tools.append({"role": "tool", "tool_call_id": calls.answer(fr), "content": text})
        else:
            raise bad(q, f"a user part with {sorted(part)[:3]} is not supported (text and functionResponse only)")
    return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts or not tools else [])


def _model(parts: list[dict[str, Any]], p: str, turn: int, calls: _Calls) -> dict[str, Any]:
    texts, thoughts, tool_calls = [], [], []
    for j, part in enumerate(parts):
        q = f"{p}.parts[{j}]"
        fc = _get(part, "functionCall")
        if isinstance(part.get("text"), str):
            (thoughts if part.get("thought") is True else texts).append(part["text"])
        elif isinstance(fc, dict):
            if not isinstance(fc.get("name"), str) or not fc["name"]:
                raise bad(f"{q}.functionCall.name", "a functionCall needs a name")
            args = fc.get("args", {})
            if not isinstance(args, dict):
                raise bad(f"{q}.functionCall.args", "a functionCall's args must be an object")
            tool_calls.append({"id": calls.call(fc, turn, len(tool_calls)), "type": "function",
                               "function": {"name": fc["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
        elif "thoughtSignature" in part or "thought_signature" in part:
            continue  # an opaque signature of a hosted model's reasoning
        else:
            raise bad(q, f"a model part with {sorted(part)[:3]} is not supported (text, thought, functionCall)")
    return assistant_message("".join(texts), tool_calls, "".join(thoughts) if thoughts else None)


def parse_chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``systemInstruction`` and ``contents`` as chat messages (see the module docstring)."""
    contents = body.get("contents")
    if isinstance(contents, dict):  # a single content is accepted as a list of one
        contents = [contents]
    if not isinstance(contents, list) or not contents:
        raise bad("contents", "contents must be a non-empty list of {role, parts} contents")
    out, calls = _system(body), _Calls()
    for i, c in enumerate(contents):
        p = f"contents[{i}]"
        parts = _parts(c, p)
        role = c.get("role", "user")
        if role in ("user", "function"):  # "function": the older API's role of function responses
            out += _user(parts, p, calls)
        elif role == "model":
            out.append(_model(parts, p, i, calls))
        else:
            raise bad(f"{p}.role", f"role must be user, model or function, got {role!r:.40}")
    return out


def _lower_types(schema: Any) -> Any:
    """Gemini's OpenAPI-style schema (``"type": "OBJECT"``) as JSON Schema (``"object"``), ``type`` first (the SDK
    sends its keys sorted; the chat template prints them in order, and ``type`` first is how schemas are written)."""
    if isinstance(schema, list):
        return [_lower_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {"type": schema["type"].lower()} if isinstance(schema.get("type"), str) else {}
    return {**out, **{k: _lower_types(v) for k, v in schema.items() if k not in out}}


def _tools(tools: Any) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """Function tools and the names of the skipped Google tools."""
    if tools is None:
        return None, []
    if not isinstance(tools, list):
        raise bad("tools", "tools must be a list of {functionDeclarations: [...]} objects")
    out, skipped = [], []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise bad(f"tools[{i}]", "each tool must be an object")
        for key in t:
            if key not in ("functionDeclarations", "function_declarations"):
                skipped.append(str(key)[:64])
        decls = _get(t, "functionDeclarations") or []
        if not isinstance(decls, list):
            raise bad(f"tools[{i}].functionDeclarations", "functionDeclarations must be a list")
        for j, d in enumerate(decls):
            if not isinstance(d, dict):
                raise bad(f"tools[{i}].functionDeclarations[{j}]", "each function declaration must be an object")
            schema = _get(d, "parametersJsonSchema")
            if schema is None:
                schema = _lower_types(d.get("parameters", {"type": "object", "properties": {}}))
            out.append({"type": "function", "function": {"name": d.get("name"), "description": d.get("description"),
                                                          "parameters": schema}})
    try:
        return parse_tools(out), skipped
    except APIError as e:  # the position in the flattened list; name the declaration's field
        raise bad(f"tools: {e.param or ''}".replace(".function", ""), e.message, e.code) from None


def _choice(body: dict[str, Any]) -> str:
    config = _get(body, "toolConfig")
    fcc = _get(config, "functionCallingConfig") if isinstance(config, dict) else None
    mode = _get(fcc, "mode") if isinstance(fcc, dict) else None
    mode = str(mode or "AUTO").upper()
    if mode not in ("AUTO", "NONE", "MODE_UNSPECIFIED"):
        raise bad("toolConfig.functionCallingConfig.mode",
                  f"mode {mode!r:.40} is not supported (it needs constrained decoding); use AUTO or NONE")
    return "none" if mode == "NONE" else "auto"


def _config_num(cfg: dict[str, Any], key: str, lo: float, hi: float, integer: bool = False) -> Any:
    v = _get(cfg, key)
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if v is None:
        return None
    if isinstance(v, bool) or not ok or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise bad(f"generationConfig.{key}", f"{key} must be {kind} in [{lo}, {hi}], got {v!r:.40}")
    return v


def parse_gemini_request(body: dict[str, Any], model: str, stream: bool, cap: int) -> tuple[ChatRequest, list[str]]:
    """Returns the request as the internal chat request (``maxOutputTokens`` clamped to ``cap``) and the notes for
    the reply's ``X-Agentrl-Note`` header; raises :class:`APIError`. ``model`` and ``stream`` come from the path."""
    messages = parse_chat_messages(body)
    tools, skipped = _tools(body.get("tools"))
    notes = [f"Google tools skipped (they cannot run here): {', '.join(skipped)}"] if skipped else []
    cfg = _get(body, "generationConfig") or {}
    if not isinstance(cfg, dict):
        raise bad("generationConfig", "generationConfig must be an object")
    if _config_num(cfg, "candidateCount", 1, 1, integer=True) not in (None, 1):
        raise bad("generationConfig.candidateCount", "candidateCount must be 1")
    max_tokens = _config_num(cfg, "maxOutputTokens", 1, 1 << 31, integer=True)
    if max_tokens is not None and max_tokens > cap:
        notes.append(f"maxOutputTokens {max_tokens} clamped to this gateway's limit of {cap}")
        max_tokens = cap
    stop = _get(cfg, "stopSequences") or []
    if not isinstance(stop, list) or len(stop) > 16 or any(not isinstance(s, str) or not s for s in stop):
        raise bad("generationConfig.stopSequences", "stopSequences must be a list of at most 16 non-empty strings")
    top_k = _config_num(cfg, "topK", 0, 1 << 30, integer=True)
    sampling = Sampling(temperature=_config_num(cfg, "temperature", 0.0, 2.0),
                        top_p=_config_num(cfg, "topP", 1e-9, 1.0), top_k=-1 if top_k == 0 else top_k,
                        max_tokens=max_tokens, stop=list(stop), seed=_config_num(cfg, "seed", -(1 << 63), 1 << 63,
                                                                                 integer=True))
    return ChatRequest(model, messages, tools, _choice(body), sampling, stream), notes


# --------------------------------------------------------------------------------------------------------- replies
def call_parts(c: Choice) -> list[dict[str, Any]]:
    out = []
    for call in c.tool_calls:
        try:
            args = json.loads(call["function"]["arguments"] or "{}")
        except JSON_ERRORS:
            args = {}
        out.append({"functionCall": {"id": call["id"], "name": call["function"]["name"],
                                     "args": args if isinstance(args, dict) else {"value": args}}})
    return out


def finish_reason(c: Choice) -> str:
    return "MAX_TOKENS" if c.finish_reason == "length" and not c.tool_calls else "STOP"


def usage_metadata(done: Completion) -> dict[str, int]:
    return {"promptTokenCount": done.prompt_tokens, "candidatesTokenCount": done.completion_tokens,
            "totalTokenCount": done.prompt_tokens + done.completion_tokens}


def gemini_body(done: Completion, model: str, rid: str) -> dict[str, Any]:
    """The ``GenerateContentResponse`` for a request's (single) choice."""
    c = done.choices[0]
    parts: list[dict[str, Any]] = []
    if c.reasoning and c.reasoning.strip():
        parts.append({"text": c.reasoning, "thought": True})
    if c.content or not c.tool_calls:
        parts.append({"text": c.content or ""})
    return {"candidates": [{"content": {"role": "model", "parts": parts + call_parts(c)},
                            "finishReason": finish_reason(c), "index": 0}],
            "usageMetadata": usage_metadata(done), "modelVersion": model, "responseId": rid}
