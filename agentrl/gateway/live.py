"""Token-by-token streaming: the text deltas of a completion while the engine samples it.

Flow: :meth:`Session.chat <agentrl.gateway.sessions.Session.chat>` (or ``complete``) is given a
:class:`LiveRequest`; once the prompt is planned and the request passes its checks it calls :meth:`LiveRequest.started`
(the stream's first frames go out then), then :meth:`LiveRequest.tokens` with each choice's new ids as the engine
produces them (:meth:`~agentrl.inference.base.InferenceEngine.generate_streaming`, across abort-and-resubmit). Each
choice's :class:`LiveTurn` turns its ids so far into ``reasoning`` / ``content`` deltas; when the completion is
committed, :meth:`LiveRequest.finish` gives what is left of each choice's final reading (tool calls are sent then,
in each dialect's delta form, by :mod:`~agentrl.gateway.writers`).

**Invariant: the deltas of a choice add up to its final reasoning and content**, the same text the non-streamed
reply has (the record is the same either way: only the session's commit writes it). A delta is only sent when it
cannot be taken back: the decoded text so far is cut at the first marker whose meaning depends on what follows (the
family's tool-call start, a stop string, an end-of-turn or other special token) and before any tail that may be the
start of one (or an incomplete UTF-8 character); that safe text is read with the family's own parser, as the final
text will be; trailing whitespace is held (a parser strips it before a tool call), and reasoning is completed before
content begins. Text after a tool call's start comes with the final reading. Should a parser still read the whole
text differently from its prefix, the rest cannot be sent as a delta: the mismatch is counted
(``gateway/errors/stream_mismatch``) and logged, never hidden.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from agentrl.chat import ChatRenderer
from agentrl.gateway.choices import Choice, Completion, lead_trimmed

log = logging.getLogger("agentrl.gateway")

Delta = tuple[int, str, str]  # (choice index, "reasoning" | "content", text)


class LiveTurn:
    """One choice's deltas so far (see the module docstring). ``chat``: read as an assistant turn (reasoning,
    content, tool calls); else as completions text."""

    def __init__(self, r: ChatRenderer, prompt_ids: list[int], prompt_text: str, tools: list[dict] | None,
                 tool_choice: str, stop: list[str], chat: bool):
        self.r, self.tools, self.chat = r, tools, chat
        self.parse = chat and tool_choice != "none"
        self.ctx = list(prompt_ids[-4:])
        self.prefix = r.generation_prefix(prompt_text) if self.parse and r.family.tool_parser != "agentrl" else ""
        specials = {r.decode([t]) for t in r.eos_ids}
        cut = set(stop) | {s for s in specials if s and "think" not in s}
        if chat:
            cut |= {r.closing(tools)[0].strip()}
        if self.parse:
            cut.add(r.family.tool_start)
        self.cut = [m for m in cut if m]
        self.hold = self.cut + (["<think>", "</think>"] if self.parse else [])
        self.ids: list[int] = []
        self._done_text, self._done = "", 0  # the decoded text of ids[:_done], every character of it complete
        self.sent = {"reasoning": "", "content": ""}
        self.broken = False  # a reading failed: the rest comes with the final reading

    def _safe(self, text: str) -> str:
        """The text before the first marker and before a tail that may begin one."""
        text = text.rstrip("\ufffd")
        for m in self.cut:
            at = text.find(m)
            if at >= 0:
                text = text[:at]
        # Hold back the longest tail that is a proper prefix of a marker: its earliest start among the last
        # len(m) - 1 characters. Found with str.find, not by slicing every prefix of every marker: this runs once
        # per streamed token, and the slicing was half of the live reading's CPU.
        end = len(text)
        for m in self.hold:
            i = text.find(m[0], max(0, len(text) - len(m) + 1))
            while 0 <= i < end:
                if m.startswith(text[i:]):
                    end = i
                    break
                i = text.find(m[0], i + 1)
        return text[:end]

    def _reading(self, text: str) -> tuple[str, str]:
        if not self.parse:
            return "", text
        turn = self.r.parser.parse(self.prefix + text, None, self.tools)
        content = turn.content or ""
        return turn.reasoning or "", lead_trimmed(self.r, content)

    def _decoded(self, ids: list[int]) -> str:
        """The text of ``ids`` after the prompt, decoding only what came since the last complete character: a whole
        decode per token would cost O(n) each, O(n^2) per turn (a 4k-token answer: ~1 s of CPU). Pieces decoded
        after a few tokens of context join exactly (the renderer decodes without clean-up); a piece that ends in
        an incomplete UTF-8 character is decoded again with the tokens that complete it."""
        k = self._done
        piece = self.r.decode_after((self.ctx + ids[:k])[-4:] if k < 4 else ids[k - 4:k], ids[k:])
        if piece and not piece.endswith("\ufffd"):
            self._done_text, self._done = self._done_text + piece, len(ids)
            return self._done_text
        return self._done_text + piece

    def feed(self, ids: list[int]) -> list[tuple[str, str]]:
        """The deltas the new ``ids`` make safe to send, as ``(kind, text)``."""
        self.ids += ids
        if self.broken:
            return []
        try:
            ids_text = self.ids
            if not self.chat:
                while ids_text and ids_text[-1] in self.r.eos_ids:
                    ids_text = ids_text[:-1]
            reasoning, content = self._reading(self._safe(self._decoded(ids_text)))
        except Exception:  # a parser failing on a partial turn: stream nothing more of it, the final reading decides
            log.debug("gateway: live reading failed; the rest of the turn comes at its end", exc_info=True)
            self.broken = True
            return []
        if not self.chat:
            return self._extend("content", content)
        content = content.rstrip()
        out: list[tuple[str, str]] = []
        if not self.sent["content"]:  # reasoning only before content; complete once content begins
            out += self._extend("reasoning", reasoning if content else reasoning.rstrip())
        return out + self._extend("content", content)

    def _extend(self, kind: str, now: str) -> list[tuple[str, str]]:
        sent = self.sent[kind]
        if len(now) > len(sent) and now.startswith(sent):
            self.sent[kind] = now
            return [(kind, now[len(sent):])]
        return []

    def finish(self, c: Choice) -> tuple[list[tuple[str, str]], bool]:
        """The deltas left of the final reading of choice ``c``, and whether what was sent is a prefix of it."""
        final = {"reasoning": c.reasoning or "", "content": (c.content or "") if self.chat else c.text}
        out: list[tuple[str, str]] = []
        ok = True
        for kind in ("reasoning", "content"):
            sent = self.sent[kind]
            if not final[kind].startswith(sent):
                ok = False
                continue
            if len(final[kind]) > len(sent):
                out.append((kind, final[kind][len(sent):]))
                self.sent[kind] = final[kind]
        return out, ok


class LiveRequest:
    """The session's listener for one streamed request: ``sink`` receives ``("start", prompt_tokens)`` once the
    request is sampled, then ``(choice, kind, text)`` deltas."""

    def __init__(self, r: ChatRenderer, chat: bool, tools: list[dict] | None = None, tool_choice: str = "auto",
                 on_mismatch: Callable[[str], None] = lambda why: None):
        self.r, self.chat, self.tools, self.tool_choice, self.on_mismatch = r, chat, tools, tool_choice, on_mismatch
        self.sink: Callable[[Any], None] = lambda item: None
        self.turns: list[LiveTurn] = []

    def started(self, prompt_ids: list[int], prompt_text: str, n: int, stop: list[str]) -> None:
        self.turns = [LiveTurn(self.r, prompt_ids, prompt_text, self.tools, self.tool_choice, stop, self.chat)
                      for _ in range(n)]
        self.sink(("start", len(prompt_ids)))

    def tokens(self, i: int, ids: list[int]) -> None:
        for kind, text in self.turns[i].feed(ids):
            self.sink((i, kind, text))

    def finish(self, done: Completion) -> list[Delta]:
        """The deltas left once ``done`` is committed (see :meth:`LiveTurn.finish`)."""
        out: list[Delta] = []
        for c in done.choices:
            if c.index >= len(self.turns):
                continue
            rest, ok = self.turns[c.index].finish(c)
            if not ok:
                why = f"session {done.session_id} request {done.request} choice {c.index}: the streamed text is not a " \
                      f"prefix of the final reading"
                log.warning("gateway: %s", why)
                self.on_mismatch(why)
            out += [(c.index, kind, text) for kind, text in rest]
        return out


