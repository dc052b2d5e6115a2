"""Tool-call formats: a model's own output -> reasoning, content and OpenAI-format ``tool_calls``, and back.

:func:`make_parser` returns a :class:`TurnParser` for a family:

- ``agentrl``: the tiny model's ``<tool_call>{"name", "arguments"}</tool_call>`` (:func:`agentrl.tools.parse_tool_calls`);
- ``harmony``: gpt-oss channels (``<|channel|>analysis<|message|>...<|end|>``, ``to=functions.NAME``). vLLM reads
  harmony through ``openai_harmony``'s token-level encoding, which loads the o200k vocabulary at run time and cannot
  parse text; this small text parser reads the same grammar from the decoded turn;
- any other name: vLLM's own tool parser (and reasoning parser) of that name, through a thin adapter
  (:class:`VLLMTurnParser`): the parsers are used as vLLM's OpenAI server uses them, on the whole completion.

A parsed turn becomes the structured assistant message the chat template reads (:func:`assistant_message`):
``content``, the family's reasoning field, and ``tool_calls`` with ``id``, ``type`` and ``function.name`` /
``function.arguments`` (a ``dict`` or the JSON string, as the family's template wants). OpenAI clients get
``arguments`` as a JSON string (:meth:`ParsedTurn.openai_tool_calls`). Round trip: rendering a parsed call with the
template and parsing the rendering gives the same name and arguments.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.chat.families import ChatFamily
from agentrl.tools import JSON_ERRORS, json_error


@dataclass
class ParsedCall:
    """One tool call: ``arguments`` decoded (a dict), ``raw_arguments`` the model's own JSON text when known."""

    name: str
    arguments: dict[str, Any]
    raw_arguments: str | None = None
    id: str | None = None


@dataclass
class ParsedTurn:
    """A model turn read with its family's format. ``errors`` holds one message per malformed call (never raised)."""

    content: str
    reasoning: str | None = None
    calls: list[ParsedCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def openai_tool_calls(self) -> list[dict[str, Any]]:
        """Returns the calls as OpenAI ``tool_calls`` (``arguments`` a JSON string)."""
        return [{"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.raw_arguments if c.raw_arguments is not None
                              else json.dumps(c.arguments, ensure_ascii=False)}} for c in self.calls]


class TurnParser(Protocol):
    def parse(self, text: str, token_ids: list[int] | None = None, tools: list[dict] | None = None) -> ParsedTurn:
        """Returns the turn read from ``text`` (the model's turn, generation-prompt suffix included). Never raises."""


def call_id(family: ChatFamily, seed: str, index: int) -> str:
    """Returns a deterministic tool-call id for call ``index`` of the turn identified by ``seed``, in the family's
    style (``random9``: 9 alphanumerics, as Mistral's template checks; else ``call_`` + 24 hex)."""
    h = hashlib.sha256(f"{seed}/{index}".encode()).hexdigest()
    if family.call_ids == "random9":
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        n = int(h, 16)
        return "".join(alphabet[(n >> (6 * i)) % 62] for i in range(9))
    return "call_" + h[:24]


def _decode_args(name: str, raw: Any, i: int, errors: list[str]) -> dict[str, Any] | None:
    args = raw
    if isinstance(raw, str):
        try:
            args = json.loads(raw) if raw.strip() else {}
        except JSON_ERRORS as e:
            errors.append(f"tool call {i} ({name}): arguments are not valid JSON ({json_error(e)})")
            return None
    if not isinstance(args, dict):
        errors.append(f"tool call {i} ({name}): arguments must be an object, got {type(args).__name__}")
        return None
    return args


class AgentrlTurnParser:
    """The tiny model's format: :func:`agentrl.tools.parse_tool_calls` (content is the text outside the tags)."""

    def parse(self, text: str, token_ids: list[int] | None = None, tools: list[dict] | None = None) -> ParsedTurn:
        from agentrl.tools import parse_tool_calls

        p = parse_tool_calls(text)
        calls = [ParsedCall(c.name, c.arguments) for c in p.calls]
        return ParsedTurn(content=p.content if calls or p.errors else text, calls=calls, errors=list(p.errors))


_HARMONY_MSG = re.compile(
    r"(?:<\|start\|>assistant)?(?P<header>(?:(?!<\|message\|>).)*?)<\|message\|>(?P<body>.*?)(?P<end><\|end\|>|<\|call\|>|<\|return\|>|$)",
    re.DOTALL)


class HarmonyTurnParser:
    """gpt-oss's harmony channels, from text: ``analysis`` is reasoning, ``final`` (or ``commentary`` without a
    recipient) is content, a ``to=functions.NAME`` header is a tool call whose body is its JSON arguments."""

    def parse(self, text: str, token_ids: list[int] | None = None, tools: list[dict] | None = None) -> ParsedTurn:
        out = ParsedTurn(content="")
        reasoning, content = [], []
        for i, m in enumerate(_HARMONY_MSG.finditer(text)):
            header, body = m.group("header"), m.group("body")
            ch = re.search(r"<\|channel\|>(\w+)", header)
            channel = ch.group(1) if ch else None
            to = re.search(r"to=functions\.([^\s<]+)", header)
            if to:
                args = _decode_args(to.group(1), body, len(out.calls) + 1, out.errors)
                if args is not None:
                    out.calls.append(ParsedCall(to.group(1), args, raw_arguments=body))
            elif channel == "analysis":
                reasoning.append(body)
            elif channel in ("final", "commentary"):
                content.append(body)
        out.reasoning = "".join(reasoning) if reasoning else None
        out.content = "".join(content)
        return out


class VLLMTurnParser:
    """vLLM's tool parser ``tool_parser`` (and reasoning parser ``reasoning_parser``) over a whole completion, as
    vLLM's chat-completions server runs them (``ParserManager`` composes the pair)."""

    def __init__(self, tokenizer: Any, tool_parser: str, reasoning_parser: str | None = None,
                 template_kwargs: dict[str, Any] | None = None, call_pattern: str | None = None):
        from vllm.parser.parser_manager import ParserManager

        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        try:
            self.parser_cls = ParserManager.get_parser(tool_parser_name=tool_parser,
                                                       reasoning_parser_name=reasoning_parser,
                                                       enable_auto_tools=True)
        except (TypeError, KeyError) as e:
            raise ValueError(f"chat.tool_parser {tool_parser!r} (reasoning parser {reasoning_parser!r}) is not one of "
                             f"vLLM's parsers ({e}); use agentrl, harmony or a name vLLM registers") from e
        self.names = (tool_parser, reasoning_parser)
        # Calls the model started (matches of the family's pattern) that the parser did not read are parse errors:
        # vLLM's parsers drop a broken call silently (or return it as content).
        self.call_pattern = re.compile(call_pattern) if call_pattern else None
        self._parser: Any = None
        self._requests: dict[str, Any] = {}

    def _request(self, tools: list[dict] | None) -> Any:
        """vLLM's request object for ``tools``, built once per tool set (the gateway's live streaming parses a turn
        at every step, and building one costs more than the parse)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        key = json.dumps(tools, sort_keys=True, default=str)
        if key not in self._requests:
            if len(self._requests) >= 16:
                self._requests.pop(next(iter(self._requests)))
            self._requests[key] = ChatCompletionRequest(
                messages=[{"role": "user", "content": ""}], model="agentrl", tools=tools or None,
                tool_choice="auto" if tools else "none", chat_template_kwargs=self.template_kwargs or None)
        return self._requests[key]

    def _new_parser(self) -> Any:
        try:
            return self.parser_cls(self.tokenizer, None, chat_template_kwargs=self.template_kwargs)
        except TypeError:
            return self.parser_cls(self.tokenizer)

    def parse(self, text: str, token_ids: list[int] | None = None, tools: list[dict] | None = None) -> ParsedTurn:
        # One parser instance serves every whole-completion parse (building one reads the whole vocabulary); the
        # streaming state it keeps is not used by parse().
        try:
            if self._parser is None:
                self._parser = self._new_parser()
            parser = self._parser
            req = self._request(tools or [{"type": "function", "function": {"name": "_", "parameters": {}}}])
            reasoning, content, calls = parser.parse(text, req, enable_auto_tools=True,
                                                     model_output_token_ids=list(token_ids or ()))
        except Exception as e:  # a parser bug or malformed output is the model's turn, never a crash
            self._parser = None
            return ParsedTurn(content=text, errors=[f"{self.names[0]} parser failed: {e!r}"])
        out = ParsedTurn(content=content or "", reasoning=reasoning)
        for i, fc in enumerate(calls or (), 1):
            args = _decode_args(fc.name, fc.arguments, i, out.errors)
            if args is not None:
                out.calls.append(ParsedCall(fc.name, args, raw_arguments=fc.arguments, id=fc.id))
        if self.call_pattern is not None:
            output = text.replace(reasoning, "", 1) if reasoning else text
            started = len(self.call_pattern.findall(output))
            missing = started - len(out.calls) - len(out.errors)
            if missing > 0:
                out.errors += [f"{self.names[0]}: {started} tool call(s) started ({self.call_pattern.pattern!r}), "
                               f"{len(calls or ())} read"] * missing
        return out


def make_parser(family: ChatFamily, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> TurnParser:
    """Returns the turn parser of ``family`` (see the module docstring)."""
    if family.tool_parser == "agentrl":
        return AgentrlTurnParser()
    if family.tool_parser == "harmony":
        return HarmonyTurnParser()
    return VLLMTurnParser(tokenizer, family.tool_parser, family.reasoning_parser, template_kwargs, family.call_pattern)


def assistant_message(family: ChatFamily, turn: ParsedTurn, raw_text: str) -> dict[str, Any]:
    """Returns the assistant message the family's chat template reads for ``turn`` (``raw_text``: the model's turn
    as decoded, generation-prompt suffix included).

    Families with a reasoning field get ``content`` and that field; the others keep the reasoning inline, as the
    model wrote it (``content`` = the raw text before the tool-call section). ``tool_calls`` is present only when
    there are calls (some templates branch on the key alone)."""
    if family.reasoning_field:
        content = turn.content
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if turn.reasoning is not None:
            msg[family.reasoning_field] = turn.reasoning
    else:
        content = raw_text
        if turn.calls:
            at = raw_text.find(family.tool_start)
            content = raw_text[:at] if at >= 0 else turn.content
        msg = {"role": "assistant", "content": content}
    if turn.calls:
        if family.strip_content_before_tools:
            msg["content"] = msg["content"].strip()
        msg["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name,
                          "arguments": (c.raw_arguments if c.raw_arguments is not None else json.dumps(c.arguments))
                          if family.arguments == "str" else c.arguments}}
            for c in turn.calls]
    return msg


def canonical_text(turn: ParsedTurn) -> str:
    """Returns the turn as envs read tool calls (:mod:`agentrl.tools`' format): the content, then one
    ``<tool_call>`` block per call."""
    from agentrl.tools import format_tool_call

    parts = [turn.content.strip()] if turn.content.strip() else []
    parts += [format_tool_call(c.name, c.arguments) for c in turn.calls]
    return "\n".join(parts)
