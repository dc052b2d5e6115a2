"""A request's :class:`~agentrl.gateway.choices.Completion` in OpenAI's response formats: the chat and text
completion bodies, and the server-sent-event stream.

**Streaming.** ``stream: true`` answers with server-sent events in OpenAI's chunk format (role, content /
reasoning / tool-call deltas, finish reason, optional usage chunk, ``[DONE]``). The engine interface returns whole
completions, so the deltas are sent once the completion is done; SSE comments keep the connection alive meanwhile.
An error before the first byte is a normal error response; a later one is an error event before ``[DONE]``. A
client that hangs up cancels its request and is reported to ``on_hang_up`` (not an error of the server).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from agentrl.gateway.choices import Choice, Completion
from agentrl.gateway.protocol import APIError, new_id, now, sse, usage

log = logging.getLogger("agentrl.gateway")


def _chat_logprobs(c: Choice) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(c.token_texts, c.logprobs)]}


def _text_logprobs(c: Choice) -> dict[str, Any]:
    offsets, at = [], 0
    for t in c.token_texts:
        offsets.append(at)
        at += len(t)
    return {"tokens": c.token_texts, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": offsets}


def _chat_choice(c: Choice, logprobs: bool) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.reasoning is not None:
        msg["reasoning_content"] = c.reasoning
    if c.tool_calls:
        msg["tool_calls"] = c.tool_calls
    return {"index": c.index, "message": msg, "finish_reason": c.finish_reason,
            "logprobs": _chat_logprobs(c) if logprobs else None}


def chat_body(done: Completion, model: str, logprobs: bool) -> dict[str, Any]:
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": now(), "model": model,
            "choices": [_chat_choice(c, logprobs) for c in done.choices],
            "usage": usage(done.prompt_tokens, done.completion_tokens)}


def completion_body(done: Completion, model: str, logprobs: bool) -> dict[str, Any]:
    return {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model,
            "choices": [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                         "logprobs": _text_logprobs(c) if logprobs else None} for c in done.choices],
            "usage": usage(done.prompt_tokens, done.completion_tokens)}


def _chat_deltas(c: Choice) -> list[tuple[dict[str, Any], str | None]]:
    out: list[tuple[dict[str, Any], str | None]] = [({"role": "assistant", "content": ""}, None)]
    if c.reasoning:
        out.append(({"reasoning_content": c.reasoning}, None))
    if c.content:
        out.append(({"content": c.content}, None))
    for k, call in enumerate(c.tool_calls):
        out.append(({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"],
                                                  "arguments": call["function"]["arguments"]}}]}, None))
    out.append(({}, c.finish_reason))
    return out


def stream_chunks(done: Completion, model: str, include_usage: bool, *, chat: bool) -> list[dict[str, Any]]:
    """The stream's chunks for a finished completion (``[DONE]`` not included)."""
    cid, created = new_id("chatcmpl" if chat else "cmpl"), now()
    obj = "chat.completion.chunk" if chat else "text_completion"
    out = []
    for c in done.choices:
        for delta, finish in (_chat_deltas(c) if chat else [({"text": c.text}, None), ({"text": ""}, c.finish_reason)]):
            choice: dict[str, Any] = {"index": c.index, "finish_reason": finish}
            if chat:
                choice["delta"] = delta
            else:
                choice.update(delta)
            choice["logprobs"] = None
            out.append({"id": cid, "object": obj, "created": created, "model": model, "choices": [choice]})
    if include_usage:
        out.append({"id": cid, "object": obj, "created": created, "model": model, "choices": [],
                    "usage": usage(done.prompt_tokens, done.completion_tokens)})
    return out


def sse_chunks(done: Completion, model: str, include_usage: bool, *, chat: bool) -> list[bytes]:
    """OpenAI's stream for a finished completion, as SSE frames ending with ``[DONE]``."""
    return [sse(c) for c in stream_chunks(done, model, include_usage, chat=chat)] + [b"data: [DONE]\n\n"]


def openai_error_frame(e: APIError) -> bytes:
    return sse(e.body()) + b"data: [DONE]\n\n"


async def stream_response(request: web.Request, work: Awaitable[Completion], frames: Callable[[Completion], list[bytes]],
                          *, keepalive_s: float, on_hang_up: Callable[[web.Request], None],
                          error_frame: Callable[[APIError], bytes] = openai_error_frame,
                          keepalive: bytes = b": keep-alive\n\n", headers: dict[str, str] | None = None,
                          ) -> web.StreamResponse:
    """Runs ``work`` (a session request) and answers with the SSE ``frames`` of its result (see the module
    docstring); each dialect brings its own frames, error frame and keep-alive."""
    task = asyncio.ensure_future(work)
    try:  # fail fast: validation errors raised before the engine is called still get a plain error response
        done: Completion | None = await asyncio.wait_for(asyncio.shield(task), 0.05)
    except asyncio.TimeoutError:
        done = None
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       **(headers or {})})
    await resp.prepare(request)
    try:
        try:
            while done is None:
                try:
                    done = await asyncio.wait_for(asyncio.shield(task), keepalive_s)
                except asyncio.TimeoutError:
                    await resp.write(keepalive)
        except APIError as e:
            await resp.write(error_frame(e))
            return resp
        except (ConnectionResetError, asyncio.CancelledError):
            task.cancel()
            raise
        except Exception as e:
            log.exception("gateway: streamed request failed")
            await resp.write(error_frame(APIError(500, f"internal error: {e!r:.500}", "server_error")))
            return resp
        for frame in frames(done):
            await resp.write(frame)
        await resp.write_eof()
    except ConnectionResetError:
        on_hang_up(request)
    return resp
