"""The official answer formats: which ``bfcl_eval`` handler builds the prompt and decodes the answer.

A format names one of ``bfcl_eval``'s local-model handlers. agentrl uses the handler's own methods for everything
but the HTTP call: ``_pre_query_processing_prompting`` + ``add_first_turn_message_prompting`` build the opening
messages (system prompt included where the handler adds one), ``_parse_query_response_prompting`` turns the raw
completion into the recorded answer (the Qwen FC handler drops ``<think>...</think>`` there),
``_add_execution_results_prompting`` builds the tool messages, ``decode_ast``/``decode_execute`` decode. The chat
template that turns messages into tokens is the policy's own (the handlers' ``_format_prompt`` is a copy of the
Qwen template).

- ``qwen_fc`` (alias ``hermes``, ``fc``): ``QwenFCHandler``, the handler of the leaderboard's Qwen "(FC)" entries.
  The item's function docs go to the chat template as ``tools`` (as BFCL's docs, unconverted, which is what the
  handler puts in the prompt); the model answers with ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  blocks (the newlines inside the tags are required; a block that is not JSON is skipped; ``arguments`` given as a
  JSON string fails single-turn decoding and is accepted by the multi-turn executor: all as the handler does).
- ``prompt``: ``QwenHandler``, the handler of the "(Prompt)" entries: BFCL's default system prompt lists the
  functions and asks for Python call syntax ``[f(a=1), g(b='x')]`` (Java/JavaScript items: decoded by the
  tree-sitter parsers); no ``tools`` for the template.

Every decode goes through :class:`SafeHandler`, which screens the two ``eval`` sites (:mod:`.safety`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterable

from agentrl.envs.bfcl import safety
from agentrl.envs.bfcl.official import load


@dataclass(frozen=True)
class AnswerFormat:
    """One official answer format: ``handler`` is ``"module:Class"`` under ``bfcl_eval.model_handler``;
    ``registry_name`` the leaderboard model id the handler is registered for (passed to the checker as the model
    name); ``tools_in_template``: the function docs go to the chat template as ``tools`` (FC) rather than into the
    system prompt (prompt mode)."""

    name: str
    handler: str
    registry_name: str
    tools_in_template: bool
    python_decoder: bool  # decode_* parse Python call syntax (prompt mode): screen it before decoding


FORMATS: dict[str, AnswerFormat] = {
    "qwen_fc": AnswerFormat("qwen_fc", "local_inference.qwen_fc:QwenFCHandler", "Qwen/Qwen3-8B-FC", True, False),
    "prompt": AnswerFormat("prompt", "local_inference.qwen:QwenHandler", "Qwen/Qwen3-8B", False, True),
}
ALIASES = {"hermes": "qwen_fc", "fc": "qwen_fc"}
DEFAULT_FORMAT = "qwen_fc"


def get_format(name: str) -> AnswerFormat:
    """Returns the format called ``name`` (or an alias). Raises ``ValueError`` listing the known names."""
    key = ALIASES.get(name, name)
    if key not in FORMATS:
        known = sorted(FORMATS) + sorted(ALIASES)
        raise ValueError(f"unknown BFCL answer format {name!r}; known: {', '.join(known)}")
    return FORMATS[key]


class SafeHandler:
    """The official handler with the :mod:`.safety` screens in front of its decoders; what agentrl hands the
    official evaluators. ``methods``: the callable backend methods (multi-turn), for :func:`safety.screen_calls`."""

    def __init__(self, handler: Any, fmt: AnswerFormat, methods: Iterable[str] = ()):
        self.handler, self.fmt, self.methods = handler, fmt, frozenset(methods)

    def with_methods(self, methods: Iterable[str]) -> "SafeHandler":
        return SafeHandler(self.handler, self.fmt, methods)

    def decode_ast(self, result: Any, language: Any, has_tool_call_tag: bool = False) -> Any:
        if self.fmt.python_decoder and isinstance(result, str):
            safety.check_python_answer(result)
        return self.handler.decode_ast(result, language, has_tool_call_tag)

    def decode_execute(self, result: Any, has_tool_call_tag: bool = False) -> Any:
        return safety.screen_calls(self.decode_calls(result, has_tool_call_tag), self.methods)

    def decode_calls(self, result: Any, has_tool_call_tag: bool = False) -> Any:
        """The handler's ``decode_execute`` behind the decoder screen only: the call strings as decoded (run them
        through :func:`safety.screen_calls` before executing)."""
        if self.fmt.python_decoder and isinstance(result, str):
            safety.check_python_answer(result)
        return self.handler.decode_execute(result, has_tool_call_tag)


_handlers: dict[str, Any] = {}
_lock = threading.Lock()


def handler_of(fmt: AnswerFormat) -> Any:
    """Returns the (shared, stateless) official handler of ``fmt``."""
    with _lock:
        if fmt.name not in _handlers:
            cls = load().handler_class(fmt.handler)
            model_name = fmt.registry_name.removesuffix("-FC")
            _handlers[fmt.name] = cls(model_name=model_name, temperature=0.0, registry_name=fmt.registry_name,
                                      is_fc_model=fmt.tools_in_template)
        return _handlers[fmt.name]


def safe_handler(fmt: AnswerFormat, methods: Iterable[str] = ()) -> SafeHandler:
    return SafeHandler(handler_of(fmt), fmt, methods)


def opening(fmt: AnswerFormat, entry: dict[str, Any], first_turn: list[dict[str, Any]] | None = None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Returns ``(messages, tools)`` the handler builds for the first turn of ``entry`` (a prompt-side entry; it
    is deep-copied first, the handlers mutate it): the first turn's messages (``first_turn`` if given, else the
    entry's), after any system prompt the handler adds. ``tools`` is None in prompt mode."""
    import copy
    import json

    handler = handler_of(fmt)
    # The handlers mutate the question (the prompt handler inserts its system prompt) and hand the function docs
    # on as tools: both are copied (the docs by a JSON round trip, several times faster than deepcopy).
    entry = {**entry, "question": copy.deepcopy(entry["question"]),
             "function": json.loads(json.dumps(entry.get("function", [])))}
    data = handler._pre_query_processing_prompting(entry)
    turn = copy.deepcopy(first_turn) if first_turn is not None else entry["question"][0]
    data = handler.add_first_turn_message_prompting(data, turn)
    messages = [dict(m) for m in data["message"]]
    return messages, (list(data["function"]) if fmt.tools_in_template else None)


def recorded_answer(fmt: AnswerFormat, text: str) -> str:
    """Returns what the leaderboard records as the model's answer for the raw completion ``text``: the handler's
    ``_parse_query_response_prompting`` (the Qwen FC handler drops a ``<think>`` block there)."""
    response = SimpleNamespace(choices=[SimpleNamespace(text=text)],
                               usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0))
    return handler_of(fmt)._parse_query_response_prompting(response)["model_responses"]


def tool_messages(fmt: AnswerFormat, decoded_calls: list[str], results: list[str]) -> list[dict[str, Any]]:
    """Returns the messages the handler appends after executing ``decoded_calls`` (one ``tool`` message per
    result, named after its call)."""
    data = handler_of(fmt)._add_execution_results_prompting({"message": []}, list(results),
                                                            {"model_responses_decoded": list(decoded_calls)})
    return [dict(m) for m in data["message"]]
