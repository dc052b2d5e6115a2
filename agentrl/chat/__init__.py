"""Chat rendering for real model families: exact prompt tokens, template modes, native tool-call formats.

Used by the agent loop (:mod:`agentrl.agent.loop`) and meant for the OpenAI-compatible gateway as it is. The API::

    from agentrl.chat import ChatConfig, ChatRenderer, load_tokenizer

    tok = load_tokenizer(model_dir)                  # fixes tokenizer_class / tokenizer.json mismatches
    r = ChatRenderer(tok, ChatConfig(thinking=False))   # family detected from the template (or ChatConfig.family)
    text, ids = r.prompt(messages, tools)            # exact prompt token ids for a request (a session's first)
    c = r.continue_from(prev_text, messages, tools)  # does this request's prompt extend the session's stream?
    c.kind == "append"  -> send prev_ids + c.ids, prev_text += c.text    # tokens appended, never re-encoded
    c.kind == "drift"   -> new segment: send c.ids, prev_text = c.text   # c.at / c.reason say where and how
    end = r.end_turn(prev_ids[-4:], gen_ids, tools)  # after a completion: closing to append, text, stop tokens
    prev_ids += gen_ids + end.append_ids; prev_text += end.stream_text
    turn, msg = r.read_turn(r.generation_prefix(prompt_text) + end.text, end.text_ids, tools, seed)
    turn.openai_tool_calls()                         # OpenAI ``tool_calls`` (ids, JSON-string arguments)
    turn.content, turn.reasoning                     # the response's content and reasoning
    r.handover(messages + [msg], prompt_text + end.text + end.end_text, len(prompt_text), tools)  # None if exact

``prev_text`` is the stream's text as the template sees it (the rule above keeps it so): after a drift the
gateway's new segment starts from ``c.text``; the agent loop's ``keep`` mode instead appends
:meth:`ChatRenderer.keep_suffix` after the model's own turn.

Modules: :mod:`~agentrl.chat.families` (families, :class:`ChatConfig`, template modes), :mod:`~agentrl.chat.renderer`
(rendering, continuation, keep mode, handover check), :mod:`~agentrl.chat.toolcalls` (parsers: ours, vLLM's, harmony),
:mod:`~agentrl.chat.tokenizer` (loading).
"""

from agentrl.chat.families import FAMILIES, ChatConfig, ChatFamily, detect_family
from agentrl.chat.renderer import ChatRenderer, Continuation, TemplateError, TurnEnd
from agentrl.chat.tokenizer import load_tokenizer
from agentrl.chat.toolcalls import ParsedCall, ParsedTurn, canonical_text

__all__ = ["FAMILIES", "ChatConfig", "ChatFamily", "ChatRenderer", "Continuation", "ParsedCall", "ParsedTurn",
           "TemplateError", "TurnEnd", "canonical_text", "detect_family", "load_tokenizer"]
