"""Each dialect's event stream, written as the completion is sampled (the deltas come from
:mod:`~agentrl.gateway.live`; the loop that drives a writer is :func:`agentrl.gateway.streaming.stream_live`).

A writer is told, in order: ``start(prompt_tokens)`` once the request is sampled, ``delta(choice, kind, text)`` for
each reasoning or content delta, then ``finish(done)`` with the committed :class:`Completion` (tool calls, finish
reasons, usage, the closing events); ``error(e)`` ends a stream that failed after its first byte. Each returns the
frames to send.

- OpenAI chat completions: a role chunk per choice, ``reasoning_content`` / ``content`` deltas, one ``tool_calls``
  delta per call (index, id, name, whole arguments), a finish chunk per choice, the usage chunk when asked,
  ``[DONE]``. Text completions: ``text`` chunks, a finish chunk, ``[DONE]``.
- Anthropic Messages: ``message_start``; a ``thinking`` block for reasoning and a ``text`` block for content, opened
  when their first delta comes (``content_block_start``, ``*_delta``, ``content_block_stop``); a ``tool_use`` block
  per call (``input_json_delta``); ``message_delta`` (stop reason, usage) and ``message_stop``.
- OpenAI Responses: ``response.created``, ``response.in_progress``; a reasoning item (summary text deltas) and a
  message item (``output_text.delta``) opened on their first delta; a ``function_call`` item per call (arguments
  delta); ``response.completed`` (or ``.incomplete``) with the whole Response.
- Gemini: a ``GenerateContentResponse`` chunk per delta (reasoning as ``thought`` parts), then one with the
  ``functionCall`` parts, ``finishReason`` and ``usageMetadata``.

Whitespace-only reasoning opens no thinking block or reasoning item (the whole replies have none for it either), so
the streamed blocks and items are the whole reply's, in its order.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from agentrl.gateway.anthropic import PING, error_event, event, message_body
from agentrl.gateway.choices import Completion
from agentrl.gateway.gemini import call_parts, finish_reason, usage_metadata
from agentrl.gateway.gemini import error_body as gemini_error
from agentrl.gateway.protocol import APIError, new_id, now, sse, usage


class OpenAIWriter:
    """Chat-completions chunks (``chat``) or text-completions chunks."""

    keepalive = b": keep-alive\n\n"

    def __init__(self, model: str, n: int, include_usage: bool, chat: bool):
        self.model, self.n, self.include_usage, self.chat = model, n, include_usage, chat
        self.id, self.created = new_id("chatcmpl" if chat else "cmpl"), now()
        self.obj = "chat.completion.chunk" if chat else "text_completion"

    def _chunk(self, i: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": i, "finish_reason": finish}
        if self.chat:
            choice["delta"] = delta
        else:
            choice.update(delta)
        choice["logprobs"] = None
        return sse({"id": self.id, "object": self.obj, "created": self.created, "model": self.model,
                    "choices": [choice]})

    def start(self, prompt_tokens: int) -> list[bytes]:
        return [self._chunk(i, {"role": "assistant", "content": ""}) for i in range(self.n)] if self.chat else []

    def delta(self, i: int, kind: str, text: str) -> list[bytes]:
        if not self.chat:
            return [self._chunk(i, {"text": text})]
        return [self._chunk(i, {"reasoning_content" if kind == "reasoning" else "content": text})]

    def finish(self, done: Completion) -> list[bytes]:
        out = []
        for c in done.choices:
            for k, call in enumerate(c.tool_calls):
                out.append(self._chunk(c.index, {"tool_calls": [{
                    "index": k, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]}))
            out.append(self._chunk(c.index, {} if self.chat else {"text": ""}, c.finish_reason))
        if self.include_usage:
            out.append(sse({"id": self.id, "object": self.obj, "created": self.created, "model": self.model,
                            "choices": [], "usage": usage(done.prompt_tokens, done.completion_tokens)}))
        return out + [b"data: [DONE]\n\n"]

    def error(self, e: APIError) -> bytes:
        return sse(e.body()) + b"data: [DONE]\n\n"


class _Blocks:
    """The open block (thinking or text) of a one-choice stream, and reasoning whitespace not yet sent."""

    def __init__(self) -> None:
        self.count = 0
        self.open: str | None = None
        self.seen: set[str] = set()
        self.pending = ""  # reasoning whitespace: sent with the first non-whitespace reasoning

    def text_for(self, kind: str, text: str) -> str:
        if kind == "reasoning" and "reasoning" not in self.seen and not (self.pending + text).strip():
            self.pending += text
            return ""
        text, self.pending = (self.pending + text, "") if kind == "reasoning" else (text, self.pending)
        return text


class MessagesWriter:
    """Anthropic's Messages stream (one choice)."""

    keepalive = PING

    def __init__(self, model: str):
        self.model, self.id, self.b = model, new_id("msg"), _Blocks()

    def error(self, e: APIError) -> bytes:
        return error_event(e)

    def start(self, prompt_tokens: int) -> list[bytes]:
        return [event("message_start", {"message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})]

    def _open(self, kind: str) -> list[bytes]:
        if self.b.open == kind:
            return []
        out = self._close()
        self.b.open = kind
        self.b.seen.add(kind)
        block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "reasoning" else \
            {"type": "text", "text": ""}
        return out + [event("content_block_start", {"index": self.b.count, "content_block": block})]

    def _close(self) -> list[bytes]:
        if self.b.open is None:
            return []
        self.b.open = None
        self.b.count += 1
        return [event("content_block_stop", {"index": self.b.count - 1})]

    def delta(self, i: int, kind: str, text: str) -> list[bytes]:
        text = self.b.text_for(kind, text)
        if not text:
            return []
        d = {"type": "thinking_delta", "thinking": text} if kind == "reasoning" else {"type": "text_delta", "text": text}
        return self._open(kind) + [event("content_block_delta", {"index": self.b.count, "delta": d})]

    def finish(self, done: Completion) -> list[bytes]:
        body = message_body(done, self.model, self.id)
        out = []
        if "content" not in self.b.seen and any(b["type"] == "text" for b in body["content"]):
            out += self._open("content")  # an empty text block, as the whole reply has
        out += self._close()
        for b in body["content"]:
            if b["type"] != "tool_use":
                continue
            out += [event("content_block_start", {"index": self.b.count, "content_block": {
                        "type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}),
                    event("content_block_delta", {"index": self.b.count, "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(b["input"], ensure_ascii=False)}}),
                    event("content_block_stop", {"index": self.b.count})]
            self.b.count += 1
        return out + [event("message_delta", {"delta": {"stop_reason": body["stop_reason"],
                                                        "stop_sequence": body["stop_sequence"]},
                                              "usage": {"output_tokens": done.completion_tokens}}),
                      event("message_stop", {})]


class ResponsesWriter:
    """OpenAI Responses' stream (one choice). ``skeleton``: the Response before any output; ``body(done)``: the
    whole Response (it also remembers it for ``previous_response_id``)."""

    keepalive = b": keep-alive\n\n"

    def __init__(self, skeleton: dict[str, Any], body: Callable[[Completion], dict[str, Any]], rid: str):
        self.skeleton, self.body, self.rid = skeleton, body, rid.removeprefix("resp_")
        self.seq = 0
        self.b = _Blocks()
        self.streamed = {"reasoning": "", "content": ""}

    def _emit(self, kind: str, **data: Any) -> bytes:
        self.seq += 1
        payload = {"type": kind, "sequence_number": self.seq - 1, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def error(self, e: APIError) -> bytes:
        return sse(e.body())  # the openai client raises an error body's message mid-stream

    def start(self, prompt_tokens: int) -> list[bytes]:
        start = {**self.skeleton, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        return [self._emit("response.created", response=start), self._emit("response.in_progress", response=start)]

    def _item_id(self, kind: str) -> str:
        return f"rs_{self.rid}" if kind == "reasoning" else f"msg_{self.rid}"

    def _open(self, kind: str) -> list[bytes]:
        if self.b.open == kind:
            return []
        out = self._close(None)
        self.b.open = kind
        self.b.seen.add(kind)
        common = {"item_id": self._item_id(kind), "output_index": self.b.count}
        if kind == "reasoning":
            item = {"type": "reasoning", "id": self._item_id(kind), "summary": []}
            return out + [self._emit("response.output_item.added", output_index=self.b.count, item=item),
                          self._emit("response.reasoning_summary_part.added", **common, summary_index=0,
                                     part={"type": "summary_text", "text": ""})]
        item = {"type": "message", "id": self._item_id(kind), "status": "in_progress", "role": "assistant",
                "content": []}
        return out + [self._emit("response.output_item.added", output_index=self.b.count, item=item),
                      self._emit("response.content_part.added", **common, content_index=0,
                                 part={"type": "output_text", "text": "", "annotations": []})]

    def _close(self, output: list[dict[str, Any]] | None) -> list[bytes]:
        """Closes the open item with its final form from ``output`` (None: mid-stream, the item as streamed)."""
        kind = self.b.open
        if kind is None:
            return []
        self.b.open = None
        i = self.b.count
        self.b.count += 1
        common = {"item_id": self._item_id(kind), "output_index": i}
        item = next((it for it in output or [] if it["id"] == self._item_id(kind)), None)
        if kind == "reasoning":
            text = item["summary"][0]["text"] if item else self.streamed["reasoning"]
            item = item or {"type": "reasoning", "id": self._item_id(kind),
                            "summary": [{"type": "summary_text", "text": text}]}
            return [self._emit("response.reasoning_summary_text.done", **common, summary_index=0, text=text),
                    self._emit("response.reasoning_summary_part.done", **common, summary_index=0,
                               part={"type": "summary_text", "text": text}),
                    self._emit("response.output_item.done", output_index=i, item=item)]
        text = item["content"][0]["text"] if item else self.streamed["content"]
        part = {"type": "output_text", "text": text, "annotations": []}
        item = item or {"type": "message", "id": self._item_id(kind), "status": "completed", "role": "assistant",
                        "content": [part]}
        return [self._emit("response.output_text.done", **common, content_index=0, text=text, logprobs=[]),
                self._emit("response.content_part.done", **common, content_index=0, part=part),
                self._emit("response.output_item.done", output_index=i, item=item)]

    def delta(self, i: int, kind: str, text: str) -> list[bytes]:
        text = self.b.text_for(kind, text)
        if not text:
            return []
        out = self._open(kind)
        self.streamed[kind] += text
        common = {"item_id": self._item_id(kind), "output_index": self.b.count}
        if kind == "reasoning":
            return out + [self._emit("response.reasoning_summary_text.delta", **common, summary_index=0, delta=text)]
        return out + [self._emit("response.output_text.delta", **common, content_index=0, delta=text, logprobs=[])]

    def finish(self, done: Completion) -> list[bytes]:
        body = self.body(done)
        output = body["output"]
        out = []
        if "content" not in self.b.seen and any(it["type"] == "message" for it in output):
            out += self._open("content")  # an empty message, as the whole reply has
        out += self._close(output)
        for item in output:
            if item["type"] != "function_call":
                continue
            common = {"item_id": item["id"], "output_index": self.b.count}
            out += [self._emit("response.output_item.added", output_index=self.b.count,
                               item={**item, "status": "in_progress", "arguments": ""}),
                    self._emit("response.function_call_arguments.delta", **common, delta=item["arguments"]),
                    self._emit("response.function_call_arguments.done", **common, name=item["name"],
                               arguments=item["arguments"]),
                    self._emit("response.output_item.done", output_index=self.b.count, item=item)]
            self.b.count += 1
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return out + [self._emit(kind, response=body)]


class GeminiWriter:
    """Gemini's ``streamGenerateContent?alt=sse`` chunks (one choice): a chunk per reasoning (``thought``) or text
    delta, then one with the function calls, ``finishReason`` and ``usageMetadata``."""

    keepalive = b": keep-alive\n\n"

    def __init__(self, model: str):
        self.model, self.id, self.b = model, new_id("gemini"), _Blocks()

    def _chunk(self, parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0, **extra}],
                "modelVersion": self.model, "responseId": self.id}

    def error(self, e: APIError) -> bytes:
        return sse(gemini_error(e))

    def start(self, prompt_tokens: int) -> list[bytes]:
        return []

    def delta(self, i: int, kind: str, text: str) -> list[bytes]:
        text = self.b.text_for(kind, text)
        if not text:
            return []
        self.b.seen.add(kind)
        return [sse(self._chunk([{"text": text, "thought": True} if kind == "reasoning" else {"text": text}]))]

    def finish(self, done: Completion) -> list[bytes]:
        c = done.choices[0]
        parts = call_parts(c)
        if not parts and "content" not in self.b.seen:
            parts = [{"text": ""}]  # the whole reply's (empty) text part
        return [sse({**self._chunk(parts, finishReason=finish_reason(c)), "usageMetadata": usage_metadata(done)})]
