"""Tool-call formats per family (issue 32, items 2-5), with the real DeepSeek vocabulary and the published templates:

- DeepSeek-V3 and V3.1 write different call syntaxes; the parser follows the detected template;
- DeepSeek-V3.1's thinking prompt ends with ``<think>``, which is the reasoning's start, not ``think>``;
- a call the model started but the parser could not read is a parse error for every family's syntax;
- Gemma-3: Google's template (no tool format) is detected and refuses tools unless a parser is named; vLLM's
  pythonic Gemma-3 template is detected and read with vLLM's ``pythonic`` parser.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests run with --import-mode=importlib
from test_chat_families import OUT, TOOL_EPISODE, TOOLS, ScriptEngine, encode, run_episode, tokenizer  # noqa: E402

from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig
from agentrl.chat import ChatConfig, ChatRenderer, TemplateError
from agentrl.policy import EpisodeMeta

V3_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{\"key\": \"alice\"}\n```"
           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
V31_CALL = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>lookup<｜tool▁sep｜>{\"key\": \"alice\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
LOOKUP = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]


def read(case: str, text: str, **cfg):
    r = ChatRenderer(tokenizer(case), ChatConfig(**cfg))
    turn, msg = r.read_turn(text, encode(r.tokenizer, text), LOOKUP, seed="t")
    return r, turn, msg


# -- item 2: DeepSeek-V3's syntax is read with V3's parser ----------------------------------------------------------
def test_deepseek_v3_and_v31_templates_get_their_own_parser():
    r, turn, msg = read("deepseek-v3", V3_CALL)
    assert (r.family.name, r.family.tool_parser) == ("deepseek_v3", "deepseek_v3")
    assert [(c.name, c.arguments) for c in turn.calls] == [("lookup", {"key": "alice"})] and turn.errors == []
    assert msg["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"key": "alice"}'}
    r, turn, _ = read("deepseek-v3.1", V31_CALL, thinking=False)
    assert (r.family.name, r.family.tool_parser) == ("deepseek_v31", "deepseek_v31")
    assert [(c.name, c.arguments) for c in turn.calls] == [("lookup", {"key": "alice"})] and turn.errors == []


def test_a_v3_call_rendered_by_the_v3_template_reads_back():
    r = ChatRenderer(tokenizer("deepseek-v3"))
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "alice"}'}}]}
    user = [{"role": "user", "content": "who?"}]
    full = r.render(user + [msg], add_generation_prompt=False, tools=LOOKUP)
    prompt = r.render(user, add_generation_prompt=True, tools=LOOKUP)
    turn_text = full[len(prompt):].removesuffix(r.closing_text)
    assert "function<｜tool▁sep｜>lookup\n```json" in turn_text
    turn, _ = r.read_turn(turn_text, encode(r.tokenizer, turn_text), LOOKUP, seed="t")
    assert [(c.name, c.arguments) for c in turn.calls] == [("lookup", {"key": "alice"})]


def test_the_other_deepseek_syntax_is_an_error_not_silence():
    _, turn, _ = read("deepseek-v3", V31_CALL)
    assert turn.calls == [] and len(turn.errors) == 1


# -- item 3: DeepSeek-V3.1's thinking prefix ------------------------------------------------------------------------
def test_deepseek_v31_thinking_reasoning_starts_after_the_think_token():
    r = ChatRenderer(tokenizer("deepseek-v3.1-think"), ChatConfig(thinking=True))
    prompt, _ = r.prompt([{"role": "user", "content": "Hello world!"}])
    assert prompt.endswith("<｜Assistant｜><think>")
    prefix = r.generation_prefix(prompt)
    assert prefix == "<think>"
    turn, _ = r.read_turn(prefix + "Middle.</think>5", encode(r.tokenizer, "Middle.</think>5"), None, seed="t")
    assert (turn.reasoning, turn.content) == ("Middle.", "5")
    # Without thinking the prompt ends with </think>, which is not the turn's own text.
    r = ChatRenderer(tokenizer("deepseek-v3.1"), ChatConfig(thinking=False))
    assert r.generation_prefix(r.prompt([{"role": "user", "content": "x"}])[0]) == ""


async def test_deepseek_v31_thinking_turns_reach_the_env_without_their_reasoning():
    s, actions, _, _ = await run_episode("deepseek-v3.1-think", "plain", "keep")
    assert [a.text for a in actions] == ["5", "8", "7"]
    assert not any("think>" in a.text for a in actions)


# -- item 4: broken calls are counted for every syntax --------------------------------------------------------------
BROKEN = {  # the model starts a call in its family's syntax and breaks it
    "deepseek-v3.1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{\"expression\": \"2+3\"}"
                     "<｜tool▁calls▁end｜>",  # the call is never closed
    "deepseek-v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n"
                   "{\"expression\": \"2+3\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",  # no closing fence
    "mistral": '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": 2+3}}]',
    "glm-4.5": "\n<think>Use it.</think>\n<tool_call>\n<arg_key>expression</arg_key>\n<arg_value>2+3</arg_value>\n"
               "</tool_call>",  # no function name
    "llama3": '{"name": "calculator", "parameters": {"expression": 2+3}}',
    "qwen2.5": '<tool_call>\n{"name": "calculator", "arguments": {"expression": 2+3}\n</tool_call>',
    "gemma3-pythonic": '[calculator(expression="2+3"]',
}
EOS = {"deepseek-v3.1": "<｜end▁of▁sentence｜>", "deepseek-v3": "<｜end▁of▁sentence｜>", "mistral": "</s>",
       "glm-4.5": "<|observation|>", "llama3": "<|eot_id|>", "qwen2.5": "<|im_end|>", "gemma3-pythonic": "<end_of_turn>"}


@pytest.mark.parametrize("case", list(BROKEN))
async def test_a_broken_call_is_counted(case):
    tok = tokenizer(case)
    cfg = {"thinking": False} if case == "deepseek-v3.1" else {}
    engine = ScriptEngine([encode(tok, BROKEN[case] + EOS[case])])
    policy = AgentLoopPolicy(engine, tok, RolloutConfig(chat=ChatConfig(**cfg)), tools=TOOLS)
    s = policy.session(EpisodeMeta("bad", "g", "test/Env-v0", 0))
    a = await s.act([dict(m) for m in TOOL_EPISODE[0]])
    assert a.tool_calls == []
    assert s.token_record().info["chat/tool_parse_errors"] == 1
    assert policy.metrics()["chat/tool_parse_errors"] == 1.0


@pytest.mark.parametrize("case", list(BROKEN))
async def test_a_good_call_is_no_error(case):
    s, actions, _, policy = await run_episode(case, "tools", "keep")
    assert [json.loads(tc["function"]["arguments"]) for tc in actions[0].tool_calls] == [{"expression": "2+3"}]
    assert s.token_record().info["chat/tool_parse_errors"] == 0


# -- item 5: Gemma-3 ------------------------------------------------------------------------------------------------
def test_gemma3_template_is_detected():
    r = ChatRenderer(tokenizer("gemma3"))
    assert (r.family.name, r.mode) == ("gemma3", "keep")
    assert r.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                    add_generation_prompt=True) == "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n" \
                                                   "<start_of_turn>model\n"
    p = ChatRenderer(tokenizer("gemma3-pythonic"))
    assert (p.family.name, p.family.tool_parser) == ("gemma3_pythonic", "pythonic")


async def test_gemma3_refuses_to_guess_a_tool_format():
    tok = tokenizer("gemma3")
    engine = ScriptEngine([encode(tok, "5<end_of_turn>")])
    policy = AgentLoopPolicy(engine, tok, RolloutConfig(), tools=TOOLS)
    s = policy.session(EpisodeMeta("g3", "g", "test/Env-v0", 0))
    with pytest.raises(TemplateError, match="gemma3 chat template has no tool-call format.*rollout.chat.tool_parser"):
        await s.act([dict(m) for m in TOOL_EPISODE[0]])
    assert engine.calls == []  # refused before anything was generated
    # Named explicitly, the parser is the user's choice (here vLLM's pythonic, as Google's docs prompt for).
    r = ChatRenderer(tok, ChatConfig(tool_parser="pythonic"))
    assert r.render([{"role": "user", "content": "hi"}], add_generation_prompt=True, tools=TOOLS)
    text = '[calculator(expression="2+3")]'
    turn, _ = r.read_turn(text, encode(tok, text), TOOLS, seed="t")
    assert [(c.name, c.arguments) for c in turn.calls] == [("calculator", {"expression": "2+3"})]


async def test_gemma3_pythonic_tool_results_go_back_as_user_turns():
    s, actions, engine, _ = await run_episode("gemma3-pythonic", "tools", "keep")
    text = s.chat.decode(engine.calls[1][0])
    assert text.endswith('[calculator(expression="2+3")]<end_of_turn>\n<start_of_turn>user\n<tool_response>\n5'
                         '</tool_response><end_of_turn>\n<start_of_turn>model\n')
    assert "python list of the function calls" in text


@pytest.mark.parametrize("args", ["[" * 100_000, '{"n": ' + "9" * 5000 + "}"])
def test_harmony_arguments_no_json_reader_takes_are_a_parse_error_not_an_exception(args):
    """json.loads raises RecursionError (too deep) or a plain ValueError (an integer of over 4,300 digits) on what
    a model may write; either is the turn's parse error."""
    from agentrl.chat.toolcalls import HarmonyTurnParser

    turn = HarmonyTurnParser().parse("<|channel|>commentary to=functions.f <|message|>" + args + "<|call|>")
    assert turn.calls == [] and len(turn.errors) == 1 and "not valid JSON" in turn.errors[0]
