"""Chat rendering for real model families: exact prompt tokens, template modes, native tool-call formats.

Used by the agent loop (:mod:`agentrl.rollout`) and meant for the OpenAI-compatible gateway as it is. The API::

    from agentrl.chat import ChatConfig, ChatRenderer, load_tokenizer

    tok = load_tokenizer(model_dir)                  # fixes tokenizer_class / tokenizer.json mismatches
    r = ChatRenderer(tok, ChatConfig(thinking=False))   # family detected from the template (or ChatConfig.family)
    text, ids = r.prompt(messages, tools)            # exact prompt token ids for a request
    c = r.continue_from(prev_text, messages, tools)  # does this request's prompt extend the session's stream?
    c.kind == "append"  -> send prev_ids + c.ids     # the stream continues: tokens appended, never re-encoded
    c.kind == "drift"   -> send c.ids (new segment)  # history was rewritten: c.at / c.reason say where and how
    turn, msg = r.read_turn(raw_text, gen_ids, tools, seed)  # the model's own format -> content/reasoning/calls
    turn.openai_tool_calls()                         # OpenAI ``tool_calls`` (ids, JSON-string arguments)
    r.closing(tools)                                 # what the template writes after an assistant message

``prev_text`` is the stream's text as the template sees it: the prompt text, then per model turn its decoded text
(:meth:`ChatRenderer.decode_after`, without the part of the closing the model generated and without trailing stop
tokens), then the full closing text; a stop token that is a role token (GLM's ``<|observation|>``) stays in it.
After a drift, the gateway's new segment starts from ``c.text`` (``c.kind == "drift"``); the agent loop's ``keep``
mode instead appends :meth:`ChatRenderer.keep_suffix`. ``raw_text`` for :meth:`ChatRenderer.read_turn` is
``r.generation_prefix(prompt_text)`` + the decoded turn.

Modules: :mod:`~agentrl.chat.families` (families, :class:`ChatConfig`, template modes), :mod:`~agentrl.chat.renderer`
(rendering, continuation, keep mode, handover check), :mod:`~agentrl.chat.toolcalls` (parsers: ours, vLLM's, harmony),
:mod:`~agentrl.chat.tokenizer` (loading).
"""

from agentrl.chat.families import FAMILIES, ChatConfig, ChatFamily, detect_family
from agentrl.chat.renderer import ChatRenderer, Continuation, TemplateError
from agentrl.chat.tokenizer import load_tokenizer
from agentrl.chat.toolcalls import ParsedCall, ParsedTurn, canonical_text

__all__ = ["FAMILIES", "ChatConfig", "ChatFamily", "ChatRenderer", "Continuation", "ParsedCall", "ParsedTurn",
           "TemplateError", "canonical_text", "detect_family", "load_tokenizer"]
