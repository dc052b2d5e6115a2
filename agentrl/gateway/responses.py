"""A request's :class:`~agentrl.gateway.choices.Completion` in OpenAI's response formats: the chat and text
completion bodies (streams: :mod:`~agentrl.gateway.streaming`, :mod:`~agentrl.gateway.writers`).
"""

from __future__ import annotations

from typing import Any

from agentrl.gateway.choices import Choice, Completion
from agentrl.gateway.protocol import new_id, now, usage


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
