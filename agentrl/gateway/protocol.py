"""The OpenAI wire format: request validation into typed requests, error bodies, response and stream chunks.

Every malformed request becomes an :class:`APIError` whose body is OpenAI's
``{"error": {"message", "type", "param", "code"}}``; ``param`` names the offending field (``messages[2].content``,
``tools[0].function.name``) and the message says what is accepted. Nothing here touches a session: a request is
fully validated before its session is looked at, so a bad request never changes one.

Accepted beyond OpenAI's fields: vLLM's ``top_k`` and ``ignore_eos``. Refused with a clear error (rather than
silently ignored, since the sampled distribution would not be what the client asked for): ``logit_bias``,
non-zero ``presence_penalty``/``frequency_penalty``, ``top_logprobs > 0``, ``tool_choice`` ``required`` or a named
function (both need constrained decoding), ``response_format`` other than text, non-text content parts, batched
completions prompts, ``echo`` and ``suffix``.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

_ROLES = ("system", "user", "assistant", "tool", "developer")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class APIError(Exception):
    """An OpenAI-style error: HTTP ``status`` and the body fields."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def engine_dead(why: str) -> APIError:
    """The 503 of every request once the engine can generate no more (``InferenceEngine.dead``)."""
    return APIError(503, f"the engine is dead: {why}", "server_error", None, "engine_dead")


@dataclass
class Sampling:
    """A request's sampling fields (before the gateway's ``sampling`` policy and bounds apply)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    n: int = 1
    ignore_eos: bool = False
    logprobs: bool = False


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: str  # "auto" | "none"
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    body_bytes: int | None = None  # the HTTP body's size when known: small requests are rendered on the event loop


@dataclass
class CompletionRequest:
    model: str
    prompt: str | list[int]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    body_bytes: int | None = None  # the HTTP body's size when known: small requests are rendered on the event loop


def parse_json(raw: bytes) -> dict[str, Any]:
    """Returns the request body as a JSON object; raises :class:`APIError` for anything else."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON, bad UTF-8, an integer of over 4,300 digits
        raise bad(None, f"request body is not valid JSON ({str(e)[:200] or 'nested too deeply'}); send a JSON object",
                  "invalid_json") from None
    if not isinstance(body, dict):
        raise bad(None, f"request body must be a JSON object, got {type(body).__name__}", "invalid_json")
    if _SURROGATE_ESCAPE.search(raw) and (where := _lone_surrogate(body)) is not None:
        raise bad(where, f"{where}: a string holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its "
                         f"pair), which is not Unicode text", "invalid_unicode")
    return body


# JSON may escape half of a surrogate pair alone ("\ud800"); json.loads keeps it, and the tokenizers (and any
# UTF-8 writer of the record) raise on it. Bodies without such an escape skip the walk.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _lone_surrogate(x: Any) -> str | None:
    """The path (``messages[0].content``) of a string in ``x`` that holds a lone surrogate, or of the object whose
    key does; None when there is none."""
    stack: list[tuple[Any, str]] = [(x, "")]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if not _is_text(v):
                return p or "(body)"
        elif isinstance(v, dict):
            for k, sub in v.items():
                if not _is_text(k):
                    return p or "(body)"
                stack.append((sub, f"{p}.{k}" if p else k))
        elif isinstance(v, list):
            stack += [(sub, f"{p}[{i}]") for i, sub in enumerate(v)]
    return None


MAX_ABS_REWARD = 1e9  # rewards beyond this are a bug or an attack, and would swamp any advantage estimate
MAX_INFO_DEPTH = 32
RESERVED_INFO = "gateway/"  # the session's own counters; a client's info cannot overwrite them


def _depth(x: Any, limit: int) -> int:
    """Nesting depth of a JSON value (iterative: a hostile value cannot exhaust the stack); stops past ``limit``."""
    deepest, stack = 0, [(x, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(v, dict):
            stack.extend((c, d + 1) for c in v.values())
        elif isinstance(v, list):
            stack.extend((c, d + 1) for c in v)
    return deepest


def check_end_body(body: dict[str, Any]) -> tuple[float, dict[str, Any], bool]:
    """Validates ``POST /v1/sessions/<id>/end``'s body: ``(reward, info, return_trajectory)``. ``reward`` is a
    finite number within ``MAX_ABS_REWARD``; ``info`` an object, at most ``MAX_INFO_DEPTH`` deep, strict JSON (no
    NaN/Infinity, which would make the JSONL unreadable for strict readers), without ``gateway/`` keys."""
    reward = body.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD:
        raise bad("reward", f"reward must be a finite number in [-{MAX_ABS_REWARD:g}, {MAX_ABS_REWARD:g}], got "
                            f"{str(reward)[:40]}")
    info = body.get("info")
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise bad("info", f"info must be an object, got {type(info).__name__}")
    if _depth(info, MAX_INFO_DEPTH) > MAX_INFO_DEPTH:
        raise bad("info", f"info is nested deeper than {MAX_INFO_DEPTH} levels")
    taken = [k for k in info if k.startswith(RESERVED_INFO)]
    if taken:
        raise bad("info", f"info keys starting with {RESERVED_INFO!r} are the gateway's own counters: {taken[:5]}")
    try:
        json.dumps(info, allow_nan=False)
    except ValueError as e:
        raise bad("info", f"info must be strict JSON (no NaN or Infinity): {e}") from None
    want = body.get("return_trajectory", False)
    if not isinstance(want, bool):
        raise bad("return_trajectory", "return_trajectory must be a boolean")
    return float(reward), info, want


def _num(body: dict, key: str, lo: float, hi: float, integer: bool = False) -> Any:
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not math.isfinite(v) or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise bad(key, f"{key} must be {kind} in [{lo}, {hi}], got {v!r}")
    return v


def _sampling(body: dict, logprobs_key: str) -> Sampling:
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad(key, f"{key} is not supported by the agentrl gateway (it changes the sampled distribution "
                           f"the trainer corrects for); leave it unset or 0")
    if body.get("logit_bias"):
        raise bad("logit_bias", "logit_bias is not supported by the agentrl gateway; leave it unset")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs not in (None, 0):
        raise bad("top_logprobs", "top_logprobs > 0 is not supported (only the sampled token's log-prob is returned)")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 16 or any(not isinstance(s, str) or not s for s in stop):
        raise bad("stop", f"stop must be a non-empty string or a list of at most 16 of them, got {body.get('stop')!r:.100}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad("max_tokens", f"max_tokens must be a positive integer, got {max_tokens!r}")
    top_k = _num(body, "top_k", -1, 1 << 30, integer=True)
    if top_k == 0:
        top_k = -1
    lp = body.get(logprobs_key)
    if isinstance(lp, bool):
        want_lp = lp
    elif lp is None:
        want_lp = False
    elif isinstance(lp, int) and 0 <= lp <= 1:  # completions: logprobs=N asks for N alternatives; 0/1 is the sample
        want_lp = True
    else:
        raise bad(logprobs_key, f"{logprobs_key} must be true/false (chat) or 0/1 (completions), got {lp!r}")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad("ignore_eos", f"ignore_eos must be a boolean, got {ignore_eos!r}")
    return Sampling(
        temperature=_num(body, "temperature", 0.0, 2.0),
        top_p=_num(body, "top_p", 1e-9, 1.0),
        top_k=top_k,
        max_tokens=max_tokens,
        stop=stop,
        seed=_num(body, "seed", -(1 << 63), (1 << 63) - 1, integer=True),
        n=_num(body, "n", 1, 1 << 20, integer=True) or 1,
        ignore_eos=ignore_eos,
        logprobs=want_lp,
    )


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"stream must be a boolean, got {stream!r}")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad("stream_options", "stream_options must be an object")
    return stream, bool(opts.get("include_usage", False))


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "model is required: the served model's name (GET /v1/models lists it)")
    return model


def text_content(content: Any, param: str) -> str:
    """Returns a message's content as text: a string, null (empty) or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"{param}[{j}]", f"content part of type {kind!r} is not supported (text parts only)")
        return "".join(out)
    raise bad(param, f"content must be a string, null or a list of text parts, got {type(content).__name__}")


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad(param, "tool_calls must be a list")
    out = []
    for k, c in enumerate(calls):
        p = f"{param}[{k}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"{p}.function.name", "each tool call needs function.name (a non-empty string)")
        args = fn.get("arguments", "{}")
        if isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        if not isinstance(args, str):
            raise bad(f"{p}.function.arguments", "function.arguments must be a JSON string")
        cid = c.get("id")
        if cid is not None and not isinstance(cid, str):
            raise bad(f"{p}.id", "a tool call's id must be a string")
        out.append({"id": cid, "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """Returns the chat messages normalised (text content, ``developer`` as ``system``, tool calls with string
    arguments); raises :class:`APIError` naming the first bad message field."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "messages must be a non-empty list of chat messages")
    out = []
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(p, f"each message must be an object, got {type(m).__name__}")
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{p}.role", f"role must be one of {', '.join(_ROLES)}, got {role!r}")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": text_content(m.get("content"), f"{p}.content")}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{p}.tool_calls")
        if role == "assistant":
            for key in ("reasoning_content", "reasoning"):
                if isinstance(m.get(key), str):
                    msg[key] = m[key]
        if role == "tool":
            if m.get("tool_call_id") is not None and not isinstance(m.get("tool_call_id"), str):
                raise bad(f"{p}.tool_call_id", "tool_call_id must be a string")
            if m.get("tool_call_id"):
                msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def parse_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Returns the tool schemas (OpenAI function tools); raises :class:`APIError` naming the bad field."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or len(tools) > 128:
        raise bad("tools", "tools must be a list of at most 128 function tools")
    out, names = [], set()
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise bad(p, 'each tool must be {"type": "function", "function": {"name", "description", "parameters"}}',
                      "invalid_tool_schema")
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise bad(f"{p}.function.name", f"a tool name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}",
                      "invalid_tool_schema")
        if name in names:
            raise bad(f"{p}.function.name", f"duplicate tool name {name!r}", "invalid_tool_schema")
        names.add(name)
        if "description" in fn and not isinstance(fn["description"], (str, type(None))):
            raise bad(f"{p}.function.description", "description must be a string", "invalid_tool_schema")
        params = fn.get("parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise bad(f"{p}.function.parameters", "parameters must be a JSON Schema object", "invalid_tool_schema")
            if params.get("type", "object") != "object":
                raise bad(f"{p}.function.parameters.type", f"parameters must describe an object, got type "
                          f"{params.get('type')!r}", "invalid_tool_schema")
            props = params.get("properties", {})
            if not isinstance(props, dict) or any(not isinstance(v, dict) for v in props.values()):
                raise bad(f"{p}.function.parameters.properties", "properties must map names to schema objects",
                          "invalid_tool_schema")
            req = params.get("required", [])
            if not isinstance(req, list) or any(not isinstance(r, str) for r in req):
                raise bad(f"{p}.function.parameters.required", "required must be a list of property names",
                          "invalid_tool_schema")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """Returns the validated chat-completions request (raises :class:`APIError`)."""
    model = _model(body)
    messages = parse_messages(body.get("messages"))
    tools = parse_tools(body.get("tools"))
    choice = body.get("tool_choice", "auto")
    if choice is None:
        choice = "auto"
    if choice not in ("auto", "none"):
        raise bad("tool_choice", f"tool_choice {choice!r:.80} is not supported (it needs constrained decoding); use "
                                 f"'auto' or 'none'")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise bad("response_format", "response_format other than {'type': 'text'} is not supported")
    stream, usage = _stream(body)
    return ChatRequest(model, messages, tools, choice, _sampling(body, "logprobs"), stream, usage)


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    """Returns the validated completions request (raises :class:`APIError`)."""
    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**31 for x in prompt):
            raise bad("prompt", "prompt must be a string or one list of token ids, each an integer in [0, 2^31) "
                                "(batched prompts are not supported)")
    elif not isinstance(prompt, str) or not prompt:
        raise bad("prompt", "prompt must be a non-empty string or one list of token ids")
    if body.get("echo"):
        raise bad("echo", "echo is not supported")
    if body.get("suffix"):
        raise bad("suffix", "suffix is not supported")
    stream, usage = _stream(body)
    return CompletionRequest(model, prompt, _sampling(body, "logprobs"), stream, usage)


# ---------------------------------------------------------------------------------------------------- responses
def assistant_message(content: str, tool_calls: list[dict[str, Any]], reasoning: str | None) -> dict[str, Any]:
    """A dialect's model turn as a chat assistant message: ``tool_calls`` only when there are some,
    ``reasoning_content`` only when the turn had reasoning (None: it had none)."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
