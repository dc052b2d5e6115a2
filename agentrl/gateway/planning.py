"""Segments and request plans: where a request's prompt goes in its session's token record (steps 1-2 of
:mod:`agentrl.gateway.sessions`).

A :class:`Segment` is one training sample: a context the engine was given followed by what it sampled. Planning a
request renders it (chat requests: the model's chat template) and matches the rendering against the session's
segments: when it extends one (text prefix, and the renderer's token-boundary check holds) the :class:`Plan`
**appends** to the longest such segment, its prompt being that segment's tokens (never re-encoded) plus the new
tokens; otherwise it is a **drift** that starts a new segment whose prompt is the whole rendering.

Invariants: planning never changes a session. It reads a :func:`snapshot` of the segments taken on the event loop
(each segment with its text and length then) and runs in the store's worker thread while the loop may commit other
requests: segments only grow at their end and their text is replaced whole, so ``token_ids[:length]`` read in the
thread is the snapshot's prefix. The commit (on the loop) checks that the planned base still has ``base_len``
tokens before appending to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.gateway.protocol import bad
from agentrl.inference.base import Generation
from agentrl.trajectory import TokenTape

Snapshot = list[tuple["Segment", str, int]]  # (segment, its text, its length) when the request was planned


@dataclass
class Segment(TokenTape):
    """One training sample: the aligned token arrays (:class:`~agentrl.trajectory.TokenTape`) and the text the
    stream renders to (for matching)."""

    text: str = ""
    prompt_len: int = -1  # tokens before the segment's first sampled token

    def add_generation(self, gen: Generation) -> None:
        if self.prompt_len < 0:
            self.prompt_len = len(self.token_ids)
        self.add_generated(gen.token_ids, gen.logprobs, gen.versions)


@dataclass
class Plan:
    """Where one request's prompt goes: ``prompt_ids`` (what the engine is given), ``new_ids`` (the tokens after
    the base segment's first ``base_len``; the whole prompt for a new segment), the prompt's text, and whether it
    is a drift (``reason`` says why)."""

    prompt_ids: list[int]
    new_ids: list[int]
    text: str
    base: Segment | None
    base_len: int
    drift: bool
    reason: str = ""


def snapshot(segments: list[Segment]) -> Snapshot:
    """The segments as they are now (taken on the event loop, read by a planning thread)."""
    return [(s, s.text, len(s.token_ids)) for s in segments]


def plan_chat(r: ChatRenderer, msgs: list[dict[str, Any]], tools: list[dict] | None, snap: Snapshot) -> Plan:
    """Renders a chat request's messages (as the template reads them) and plans the result."""
    try:
        text = r.render(msgs, add_generation_prompt=True, tools=tools)
    except Exception as e:  # a template's own raise_exception() or a Jinja error: the client's input
        raise bad("messages", f"the model's chat template cannot render these messages: {e}",
                  "template_error") from None
    return plan_text(r, text, msgs[-1].get("role"), snap)


def plan_text(r: ChatRenderer, text: str, role: str | None, snap: Snapshot) -> Plan:
    best: tuple[Segment, str, int] | None = None
    for item in snap:
        if (best is None or len(item[1]) >= len(best[1])) and item[1] and text.startswith(item[1]):
            best = item
    if best is not None:
        seg, seg_text, n = best
        c = r.continue_text(seg_text, text, role)
        if c.kind == "append":
            return Plan(seg.token_ids[:n] + c.ids, list(c.ids), text, seg, n, False)
        reason = c.reason
    elif snap:
        last = snap[-1][1]
        i = next((k for k, (a, b) in enumerate(zip(last, text)) if a != b), min(len(last), len(text)))
        reason = (f"the prompt does not extend any of the session's {len(snap)} segments (vs. the last: "
                  f"first difference at character {i}: {last[i:i + 40]!r} became {text[i:i + 40]!r})")
    else:
        reason = ""
    ids = r.encode(text)
    return Plan(ids, ids, text, None, 0, bool(snap), reason)


def plan_prompt(r: ChatRenderer, prompt: str | list[int], snap: Snapshot) -> Plan:
    """Plans a completions prompt: text (as :func:`plan_text`) or token ids (matched by token prefix)."""
    if isinstance(prompt, str):
        return plan_text(r, prompt, None, snap)
    ids = prompt
    best: tuple[Segment, str, int] | None = None
    for item in snap:
        seg, _, n = item
        if (best is None or n >= best[2]) and n and ids[:n] == seg.token_ids[:n]:
            best = item
    if best is not None:
        seg, seg_text, n = best
        new = ids[n:]
        return Plan(list(ids), new, seg_text + r.decode_after(seg.token_ids[:n], new), seg, n, False)
    return Plan(list(ids), list(ids), r.decode(ids), None, 0, bool(snap),
                "the prompt's token ids do not extend any segment" if snap else "")
