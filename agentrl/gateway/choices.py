"""Sampled generations as the client sees them (step 3's output in :mod:`agentrl.gateway.sessions`): a
:class:`Choice` per completion, with its exact tokens, and the :class:`Completion` of a request.

Chat: the closing the model did not generate is added after the sampled tokens (:meth:`ChatRenderer.end_turn`, mask
0 when recorded); the turn is read with the family's parser into content, reasoning and OpenAI tool calls (a
malformed call stays content and is counted); a matched stop string is cut from the text, as OpenAI and vLLM do.
The assistant message the template should see when the client sends this turn back is returned with the choice,
under :func:`assistant_key` (what OpenAI clients send back: content, calls and call ids), so a client that drops
fields it does not know causes no drift.

Invariants: nothing here touches a session; a choice's ``token_ids``/``logprobs``/``versions`` are the engine's,
unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.inference.base import Generation
from agentrl.tools import JSON_ERRORS


@dataclass
class Choice:
    """One sampled completion as the client gets it, with its tokens. ``finish_reason`` is OpenAI's (``stop``,
    ``length``, ``tool_calls``)."""

    index: int
    text: str
    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    parse_errors: list[str] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)  # filled when the client asked for logprobs
    stream_ids: list[int] = field(default_factory=list)  # closing appended after the sampled tokens (mask 0)
    stream_text: str = ""
    stop_sequence: str | None = None  # the client's stop string that ended the completion (Anthropic reports it)


@dataclass
class Completion:
    """A request's result: its choices, prompt size, and how it was assembled (``appended`` to a segment or a
    ``drift`` that started a new one; ``reason`` says why)."""

    session_id: str
    request: int
    choices: list[Choice]
    prompt_tokens: int
    appended: bool
    drift: bool
    reason: str = ""

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)


def assistant_key(content: str | None, calls: list[dict[str, Any]]) -> str:
    """The identity of an assistant message as OpenAI clients send it back (content, calls, call ids)."""
    norm = []
    for c in calls:
        fn = c.get("function") or {}
        args = fn.get("arguments", "")
        try:
            args = json.dumps(json.loads(args), sort_keys=True, ensure_ascii=False)
        except (TypeError, *JSON_ERRORS):
            pass
        norm.append([fn.get("name"), args, c.get("id") or ""])
    return json.dumps([(content or "").strip(), norm], ensure_ascii=False)


def cut_stop(text: str, stop_reason: Any) -> str:
    """OpenAI (and vLLM) leave a matched stop string out of the returned text."""
    if isinstance(stop_reason, str) and stop_reason:
        at = text.find(stop_reason)
        if at >= 0:
            return text[:at]
    return text


def lead_trimmed(r: ChatRenderer, content: str) -> str:
    """The tiny model's parser strips the content of a turn with tool calls: its content is sent without leading
    whitespace either way, so that a streamed reply (which cannot know whether a call follows) and the whole reply
    agree (:mod:`~agentrl.gateway.live`). Other families' parsers keep it."""
    return content.lstrip() if r.family.tool_parser == "agentrl" else content


def token_texts(r: ChatRenderer, ids: list[int], want: bool) -> list[str]:
    return [r.decode([t]) for t in ids] if want else []


def read_chat(r: ChatRenderer, prompt_ids: list[int], prompt_text: str, g: Generation, tools: list[dict] | None,
              tool_choice: str, i: int, logprobs: bool, seed: str) -> tuple[Choice, dict[str, Any]]:
    """Returns choice ``i`` of a chat request and the assistant message the template should see for it."""
    end = r.end_turn(prompt_ids[-4:], g.token_ids, tools)
    native = r.family.tool_parser != "agentrl"
    if tool_choice == "none":
        content, reasoning, calls, errors = cut_stop(end.text, g.stop_reason), None, [], []
        msg: dict[str, Any] = {"role": "assistant", "content": end.text}
    else:
        prefix = r.generation_prefix(prompt_text) if native else ""
        turn, msg = r.read_turn(prefix + end.text, end.text_ids, tools, seed=seed)
        if not native:
            msg = {"role": "assistant", "content": end.text}  # the tiny model's template reads calls from text
        content, reasoning, calls, errors = turn.content, turn.reasoning, turn.openai_tool_calls(), turn.errors
        if not calls:
            content = lead_trimmed(r, cut_stop(content, g.stop_reason))
    finish = "tool_calls" if calls else "length" if g.finish_reason == "length" else "stop"
    choice = Choice(i, end.text, content if content or not calls else None, reasoning, calls, finish,
                    list(g.token_ids), list(g.logprobs), list(g.versions), list(errors),
                    token_texts(r, g.token_ids, logprobs), list(end.append_ids), end.stream_text,
                    g.stop_reason if isinstance(g.stop_reason, str) and g.stop_reason else None)
    return choice, msg


def read_completion(r: ChatRenderer, prompt_ids: list[int], g: Generation, i: int, logprobs: bool) -> Choice:
    """Returns choice ``i`` of a completions request (its text without the end-of-sequence tokens)."""
    ids = list(g.token_ids)
    while ids and ids[-1] in r.eos_ids:
        ids.pop()
    text = cut_stop(r.decode_after(prompt_ids, ids), g.stop_reason)
    return Choice(i, text, text, None, [], "length" if g.finish_reason == "length" else "stop",
                  list(g.token_ids), list(g.logprobs), list(g.versions),
                  token_texts=token_texts(r, g.token_ids, logprobs),
                  stream_text=r.decode_after(prompt_ids, g.token_ids))
