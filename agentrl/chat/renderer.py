"""The renderer: a model's chat template as exact token ids, and the checks that keep training tokens = sampled tokens.

Text-level rendering (``apply_chat_template(tokenize=False)``) and tokenization without special tokens of its own
(the template writes any BOS it wants). Invariants the agent loop and the gateway rely on:

- **Continuation.** Given the text of the token stream so far (``prev_text``) and the conversation with new
  messages, :meth:`ChatRenderer.continue_from` renders the conversation (with the generation prompt) and answers
  ``append`` with the new tokens when the rendering starts with ``prev_text`` and the new text does not merge with
  the tokens before it, else ``drift`` with the whole new prompt (a new segment) and where the texts differ.
- **Keep mode.** :meth:`ChatRenderer.keep_suffix` returns what the template renders for new messages right after
  the model's own turn, whatever it would do to earlier history (the template's prefix-preserving variant: past
  reasoning, the system prompt's first place and the model's own tool-call text stay as the model saw them).
- **Handover.** :meth:`ChatRenderer.handover` re-renders the conversation with the model's turn and reports where
  it differs from the stream (the prompt it was given plus what it generated plus the closing).
- **Closing.** The text a template puts after an assistant message's content (Qwen ``<|im_end|>\\n``) is found
  once per tool set by rendering a marker message with the session's tools; the loop appends the part of it the
  model did not generate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.chat.families import ChatConfig, ChatFamily
from agentrl.chat.toolcalls import ParsedTurn, TurnParser, assistant_message, call_id, make_parser

_MARKER = "\u2063AGENTRL-CLOSING-MARKER\u2063"
_PROBE = "\u2063agentrl-probe\u2063"


class TemplateError(ValueError):
    """The chat template cannot be used token-in/token-out as configured (``strict`` mode and the template is not
    prefix-stable, a template that renders nothing recognisable, or no chat template at all)."""


@dataclass
class Continuation:
    """The next prompt given the previous stream. ``kind``: ``append`` (``ids``/``text`` are the new tokens/text
    after the stream), ``keep`` (the same, computed by :meth:`ChatRenderer.keep_suffix` after a drift) or ``drift``
    (``ids``/``text`` are the whole new prompt). ``at``: first differing character of the previous text, -1 if none.
    ``reason``: why it drifted. ``rendered``: the template's own rendering of the whole conversation."""

    kind: Literal["append", "keep", "drift"]
    ids: list[int]
    text: str
    at: int = -1
    reason: str = ""
    rendered: str = ""


@dataclass
class TurnEnd:
    """How a generated turn ends in the stream (:meth:`ChatRenderer.end_turn`). ``append_ids``: closing tokens the
    model did not generate (appended with loss mask 0). ``text_ids`` / ``text``: the generated ids that are the turn's
    text (without the closing it generated and without trailing stop tokens) and their text. ``stop_role``: a role
    token the model stopped on (GLM), which stays in the stream as the next message's start. ``end_text``: the turn's
    end as the template writes it (the closing, or a turn-ending token such as gpt-oss ``<|call|>``)."""

    append_ids: list[int]
    text_ids: list[int]
    text: str
    stop_role: str
    end_text: str

    @property
    def stream_text(self) -> str:
        """The text the turn adds to the stream after its prompt (what ``prev_text`` must grow by)."""
        return self.text + self.stop_role + self.end_text


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChatRenderer:
    """One model's chat template as token ids (see the module docstring).

    ``tokenizer``: a Hugging Face tokenizer with a chat template. ``config``: the family, template mode and options
    (default: detected). ``template_kwargs``: extra ``apply_chat_template`` kwargs (kept for the older
    ``RolloutConfig.chat_template_kwargs``).
    """

    def __init__(self, tokenizer: Any, config: ChatConfig | None = None, template_kwargs: dict[str, Any] | None = None):
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise TemplateError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template")
        self.tokenizer = tokenizer
        self.config = config or ChatConfig()
        fam, mode, kwargs = self.config.resolve(template if isinstance(template, str) else None)
        self.family: ChatFamily = fam
        self.mode: Literal["strict", "keep", "split"] = mode
        self.kwargs: dict[str, Any] = {**kwargs, **(template_kwargs or {})}
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # Added tokens (specials included) are split out of the text before the tokenizer's model runs, so text on
        # either side of one is tokenized independently.
        added = getattr(tokenizer, "get_added_vocab", lambda: {})()
        self.added_tokens: tuple[str, ...] = tuple(sorted(added, key=len, reverse=True))
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids: set[int] = set(getattr(tokenizer, "all_special_ids", None) or ())
        self.eos_ids |= {eos} if isinstance(eos, int) else set(eos or ())
        # Added tokens flagged special (role and end tokens) are not text either.
        self.eos_ids |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
                         if getattr(t, "special", False)}
        vocab = getattr(tokenizer, "get_vocab", dict)()
        self.stop_role_ids: dict[int, str] = {vocab[t]: t for t in fam.stop_role_tokens if t in vocab}
        self.turn_end_ids: dict[int, str] = {vocab[t]: t for t in fam.turn_ends if t in vocab}
        self.eos_ids |= set(self.stop_role_ids) | set(self.turn_end_ids)
        self._closings: dict[str, tuple[str, list[int]]] = {}
        self._parser: TurnParser | None = None
        self._gen_prefix: str | None = None
        if fam.tool_parser not in ("agentrl", "harmony"):
            self._parser = make_parser(fam, tokenizer, self.kwargs)  # a bad parser name fails here, not mid-episode
        try:  # templates that require tools get their closing per session (closing(tools))
            self.closing_text, self.closing_ids = self.closing(None)
        except TemplateError:
            raise
        except Exception:
            self.closing_text, self.closing_ids = "", []

    # -- text and tokens --------------------------------------------------------------------------------------------
    def render(self, messages: list[dict], *, add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        """Returns the template's text for ``messages``. Raises :class:`TemplateError` for tools on a template that
        has no tool-call format (the family's ``refuse_tools``) unless ``ChatConfig.tool_parser`` names one."""
        if tools and self.family.refuse_tools:
            raise TemplateError(
                f"the {self.family.name} chat template has no tool-call format (it ignores tools); set "
                f"rollout.chat.tool_parser (e.g. pythonic, with vLLM's tool_chat_template_gemma3_pythonic.jinja as the "
                f"chat template) or run the env without tools")
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False, **self.kwargs)
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:  # the Rust tokenizer itself: same ids, a fraction of the Python overhead
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """Returns the text of ``ids`` exactly (no clean-up of spaces, specials kept)."""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def decode_after(self, context: list[int], ids: list[int]) -> str:
        """Returns the text ``ids`` add after ``context`` (decoders that strip a leading space of a sequence, as
        SentencePiece's do, lose nothing: a few context tokens are decoded with them and their text removed)."""
        ctx = list(context[-4:])
        head = self.decode(ctx)
        full = self.decode(ctx + list(ids))
        return full[len(head):] if full.startswith(head) else self.decode(ids)

    def prompt(self, messages: list[dict], tools: list[dict] | None = None) -> tuple[str, list[int]]:
        """Returns the text and exact token ids of the prompt for ``messages`` (generation prompt included)."""
        text = self.render(messages, add_generation_prompt=True, tools=tools)
        return text, self.encode(text)

    # -- the assistant turn -----------------------------------------------------------------------------------------
    def closing(self, tools: list[dict] | None) -> tuple[str, list[int]]:
        """Returns the text (and ids) the template puts after an assistant message's content, rendered with
        ``tools`` (templates may require them); cached per tool set."""
        key = json.dumps(tools, sort_keys=True, default=str) if tools else ""
        if key not in self._closings:
            convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARKER}]
            text = self.render(convo, add_generation_prompt=False, tools=tools)
            at = text.rfind(_MARKER)
            if at < 0:
                raise TemplateError("the chat template does not render an assistant message's content verbatim")
            closing = text[at + len(_MARKER):]
            self._closings[key] = (closing, self.encode(closing))
        return self._closings[key]

    @staticmethod
    def closing_overlap(generated: list[int], closing_ids: list[int]) -> int:
        """Returns the largest ``k`` with ``generated[-k:] == closing_ids[:k]`` (0 if none)."""
        for k in range(min(len(closing_ids), len(generated)), 0, -1):
            if generated[-k:] == closing_ids[:k]:
                return k
        return 0

    def end_turn(self, context: list[int], generated: list[int], tools: list[dict] | None) -> TurnEnd:
        """Returns how the ``generated`` ids (after the stream's ``context`` ids) end their turn: the closing part
        the model wrote (largest ``k`` with ``generated[-k:] == closing[:k]``) and the rest to append, or a
        turn-ending token of the family's own; trailing stop tokens are not text."""
        closing_text, closing_ids = self.closing(tools)
        k = self.closing_overlap(generated, closing_ids)
        last = generated[-1] if generated else None
        if k == 0 and last in self.turn_end_ids:
            append, end_text, text_ids = [], self.turn_end_ids[last], list(generated[:-1])
        else:
            append, end_text, text_ids = closing_ids[k:], closing_text, list(generated[: len(generated) - k])
        stop_role = ""
        while text_ids and text_ids[-1] in self.eos_ids:
            if k == 0 and not stop_role and text_ids[-1] in self.stop_role_ids:
                stop_role = self.stop_role_ids[text_ids[-1]]
            text_ids = text_ids[:-1]
        return TurnEnd(list(append), text_ids, self.decode_after(context, text_ids), stop_role, end_text)

    def generation_prefix(self, prompt_text: str) -> str:
        """Returns the part of the generation prompt that the template counts as the assistant message's own text
        (QwQ's ``<think>\\n``, DeepSeek's ``<think>``; usually empty), when ``prompt_text`` ends with it.

        Found once on a probe conversation: the generation prompt's tail after where a rendered assistant message's
        content would begin (history-dependent renderings of the actual conversation cannot shift it)."""
        if self._gen_prefix is None:
            user = [{"role": "user", "content": _PROBE}]
            try:
                p = self.render(user, add_generation_prompt=True)
                q = self.render(user + [{"role": "assistant", "content": _MARKER}], add_generation_prompt=False)
                self._gen_prefix = p[self._token_start(p, _common_prefix(p, q[: max(q.find(_MARKER), 0)])):]
            except Exception:
                self._gen_prefix = ""
        return self._gen_prefix if self._gen_prefix and prompt_text.endswith(self._gen_prefix) else ""

    def _token_start(self, text: str, at: int) -> int:
        """Returns ``at``, or the start of the added token of ``text`` that ``at`` falls inside (DeepSeek-V3.1's
        thinking prompt ends ``<think>`` where its history has ``</think>``: the texts part after the ``<``)."""
        for t in self.added_tokens:
            s = text.find(t, max(0, at - len(t) + 1))
            if 0 <= s < at < s + len(t):
                return s
        return at

    @property
    def parser(self) -> TurnParser:
        if self._parser is None:
            self._parser = make_parser(self.family, self.tokenizer, self.kwargs)
        return self._parser

    def read_turn(self, raw_text: str, token_ids: list[int], tools: list[dict] | None, seed: str
                  ) -> tuple[ParsedTurn, dict[str, Any]]:
        """Returns the model's turn read with the family's parser and the assistant message the template reads for
        it (tool calls get deterministic ids from ``seed``). ``raw_text``: generation-prompt suffix + decoded turn."""
        turn = self.parser.parse(raw_text, token_ids, tools)
        for i, c in enumerate(turn.calls):  # deterministic ids (vLLM's are random): runs repeat
            c.id = call_id(self.family, seed, i)
        return turn, assistant_message(self.family, turn, raw_text)

    def handover(self, messages: list[dict], stream_text: str, prompt_len: int, tools: list[dict] | None
                 ) -> tuple[int, str] | None:
        """Re-renders ``messages`` (ending with the model's turn) and returns None when that equals ``stream_text``
        (the prompt the model was given + its turn + the closing), else ``(first differing character, what)`` where
        ``what`` is ``"prompt"`` when the re-rendering no longer starts with the prompt, ``"turn"`` otherwise."""
        try:
            text = self.render(messages, add_generation_prompt=False, tools=tools)
        except Exception as e:
            return 0, f"render failed: {e}"
        if text == stream_text:
            return None
        at = _common_prefix(text, stream_text)
        return at, "prompt" if at < prompt_len else "turn"

    # -- continuation -----------------------------------------------------------------------------------------------
    def continue_from(self, prev_text: str, messages: list[dict], tools: list[dict] | None) -> Continuation:
        """Returns how the prompt for ``messages`` (generation prompt included) continues ``prev_text``, the text of
        the stream so far (see :class:`Continuation`)."""
        text = self.render(messages, add_generation_prompt=True, tools=tools)
        return self.continue_text(prev_text, text, messages[-1].get("role") if messages else None)

    def continue_text(self, prev_text: str, text: str, role: str | None = None) -> Continuation:
        """Returns how the prompt text ``text`` (already rendered, or a raw completions prompt) continues
        ``prev_text``, with the rules of :meth:`continue_from` (``role``: the last message's, for the reason)."""
        if not text.startswith(prev_text):
            i = _common_prefix(text, prev_text)
            return Continuation("drift", self.encode(text), text, i,
                                f"rendering the conversation with the new {role!r} message changes earlier text "
                                f"(first difference at character {i}: {prev_text[i:i + 40]!r} became {text[i:i + 40]!r})", text)
        new_text = text[len(prev_text):]
        if new_text.startswith(self.added_tokens) or prev_text.endswith(self.added_tokens) or not prev_text:
            return Continuation("append", self.encode(new_text), new_text, rendered=text)
        prev_ids, full = self.encode(prev_text), self.encode(text)
        n = len(prev_ids)
        if full[:n] != prev_ids:
            return Continuation("drift", full, text, len(prev_text),
                                f"at the token level: the new {role!r} message's text {new_text[:40]!r} merges with "
                                f"the tokens before it", text)
        return Continuation("append", full[n:], new_text, rendered=text)

    def keep_suffix(self, last_turn: dict[str, Any], new: list[dict], stream_end: str = "") -> str:
        """Returns the text the template renders for ``new`` (and the generation prompt) right after the model's
        turn ``last_turn``, whatever it does to earlier history. ``stream_end``: a role token the model already
        generated (GLM stops on the next role), dropped from the front so it is not written twice.

        The turn is rendered after a probe user message, without system prompt and tools (they stay where the model
        first saw them); where the template rewrites the turn itself once more messages follow (reasoning stripped),
        the end of the turn is found as the longest tail of its rendering that reappears."""
        anchor = [{"role": "user", "content": _PROBE}, last_turn]
        t0 = self.render(anchor, add_generation_prompt=False)
        t1 = self.render(anchor + new, add_generation_prompt=True)
        closing = self.closing(None)[0]
        if t1.startswith(t0):
            rest = t1[len(t0):]
        else:
            body = t0[: len(t0) - len(closing)] if closing and t0.endswith(closing) else t0
            if t1.startswith(body):
                end = len(body)
            else:
                lcp = _common_prefix(t1, body)
                lo, hi = 0, len(body) - lcp
                while lo < hi:  # the longest tail of the turn's rendering that occurs again after the rewrite
                    mid = (lo + hi + 1) // 2
                    if t1.find(body[len(body) - mid:], lcp) >= 0:
                        lo = mid
                    else:
                        hi = mid - 1
                end = (t1.find(body[len(body) - lo:], lcp) + lo) if lo else lcp
            rest = t1[end:]
            for c in (closing, *self.family.closing_aliases.values()):
                if c and rest.startswith(c):
                    rest = rest[len(c):]
                    break
        if stream_end and rest.startswith(stream_end):
            rest = rest[len(stream_end):]
        return rest
