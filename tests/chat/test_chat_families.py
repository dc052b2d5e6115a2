"""Real model families through the agent loop: the published chat templates (tests/fixtures/chat_templates), real
vocabularies where a package ships them (Qwen, Mistral Nemo, DeepSeek-V3/V3.1) and stand-ins otherwise (see chat_tokenizers.py),
driven through ``AgentLoopPolicy`` by a scripted engine that emits each family's own output format.

Every episode must: not crash; train exactly the tokens sampled (every request's prompt is its segment's tokens so
far, every generated token is in the record with loss mask 1 in order); read the family's tool calls (and hand them
to the env in agentrl's format); and round-trip them (render the structured call with the template, parse it back:
same call). Templates that rewrite history run in both ``keep`` and ``split`` modes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests run with --import-mode=importlib
from chat_tokenizers import (GEMMA3_ADDED, GLM45_ADDED, HARMONY_ADDED, LLAMA3_ADDED, deepseek_tokenizer,
                             nemo_tokenizer, qwen_tokenizer, standin_tokenizer, template)  # noqa: E402

from agentrl.chat import ChatConfig, ChatRenderer, load_tokenizer
from agentrl.inference.base import Generation, InferenceEngine
from agentrl.policy import EpisodeMeta
from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig, TemplateError
from agentrl.tools import parse_tool_calls
from agentrl.trajectory import Trajectory

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "the expression"}},
                   "required": ["expression"]}}}]

TOOL_EPISODE = [  # env messages per turn; the model calls, answers, is asked again, calls, answers
    [{"role": "system", "content": "You are a careful calculator agent."}, {"role": "user", "content": "What is 2+3?"}],
    [{"role": "tool", "content": "5"}],
    [{"role": "user", "content": "Correct. Now what is 3*4?"}],
    [{"role": "tool", "content": "12"}],
]
PLAIN_EPISODE = [
    [{"role": "system", "content": "Guess the secret number."}, {"role": "user", "content": "It is between 1 and 10."}],
    [{"role": "user", "content": "Too low."}],
    [{"role": "user", "content": "Too high."}],
]


# -- each family's own output ---------------------------------------------------------------------------------------
def hermes_call(expr):
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>' % expr


def qwen3_think(r, rest):
    return f"<think>\n{r}\n</think>\n\n{rest}"


OUT = {
    "qwen2.5": lambda: (
        [hermes_call("2+3") + "<|im_end|>", "2+3 is 5.<|im_end|>", hermes_call("3*4") + "<|im_end|>",
         "3*4 is 12.<|im_end|>"],
        ["5<|im_end|>", "8<|im_end|>", "7<|im_end|>"]),
    "qwen3-think": lambda: (
        [qwen3_think("I need the calculator.", hermes_call("2+3")) + "<|im_end|>",
         qwen3_think("It said 5.", "2+3 is 5.") + "<|im_end|>",
         qwen3_think("Again the calculator.", hermes_call("3*4")) + "<|im_end|>",
         qwen3_think("It said 12.", "3*4 is 12.") + "<|im_end|>"],
        [qwen3_think("Middle.", "5") + "<|im_end|>", qwen3_think("Higher.", "8") + "<|im_end|>",
         qwen3_think("Between.", "7") + "<|im_end|>"]),
    "qwen3-nothink": lambda: OUT["qwen2.5"](),
    "qwq": lambda: (
        ["I need the calculator.\n</think>\n\n" + hermes_call("2+3") + "<|im_end|>",
         "It said 5.\n</think>\n\n2+3 is 5.<|im_end|>",
         "Again.\n</think>\n\n" + hermes_call("3*4") + "<|im_end|>", "It said 12.\n</think>\n\n3*4 is 12.<|im_end|>"],
        ["Middle.\n</think>\n\n5<|im_end|>", "Higher.\n</think>\n\n8<|im_end|>", "Between.\n</think>\n\n7<|im_end|>"]),
    "llama3": lambda: (
        ['{"name": "calculator", "parameters": {"expression": "2+3"}}<|eot_id|>', "2+3 is 5.<|eot_id|>",
         '{"name": "calculator", "parameters": {"expression": "3*4"}}<|eot_id|>', "3*4 is 12.<|eot_id|>"],
        ["5<|eot_id|>", "8<|eot_id|>", "7<|eot_id|>"]),
    "mistral": lambda: (
        ['[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2+3"}}]</s>', "2+3 is 5.</s>",
         '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "3*4"}}]</s>', "3*4 is 12.</s>"],
        ["5</s>", "8</s>", "7</s>"]),
    "deepseek-v3.1": lambda: (
        ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{\"expression\": \"2+3\"}<｜tool▁call▁end｜>"
         "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>", "2+3 is 5.<｜end▁of▁sentence｜>",
         "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{\"expression\": \"3*4\"}<｜tool▁call▁end｜>"
         "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>", "3*4 is 12.<｜end▁of▁sentence｜>"],
        ["5<｜end▁of▁sentence｜>", "8<｜end▁of▁sentence｜>", "7<｜end▁of▁sentence｜>"]),
    "deepseek-v3": lambda: (
        ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{\"expression\": \"2+3\"}"
         "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>", "2+3 is 5.<｜end▁of▁sentence｜>",
         "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{\"expression\": \"3*4\"}"
         "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>", "3*4 is 12.<｜end▁of▁sentence｜>"],
        ["5<｜end▁of▁sentence｜>", "8<｜end▁of▁sentence｜>", "7<｜end▁of▁sentence｜>"]),
    "deepseek-v3.1-think": lambda: (
        None,
        ["Middle.</think>5<｜end▁of▁sentence｜>", "Higher.</think>8<｜end▁of▁sentence｜>",
         "Between.</think>7<｜end▁of▁sentence｜>"]),
    "glm-4.5": lambda: (
        ["\n<think>I need the calculator.</think>\n<tool_call>calculator\n<arg_key>expression</arg_key>\n"
         "<arg_value>2+3</arg_value>\n</tool_call><|observation|>",
         "\n<think>It said 5.</think>\n2+3 is 5.<|user|>",
         "\n<think>Again.</think>\n<tool_call>calculator\n<arg_key>expression</arg_key>\n<arg_value>3*4</arg_value>\n"
         "</tool_call><|observation|>",
         "\n<think>It said 12.</think>\n3*4 is 12.<|user|>"],
        ["\n<think>Middle.</think>\n5<|user|>", "\n<think>Higher.</think>\n8<|user|>",
         "\n<think>Between.</think>\n7<|user|>"]),
    "gpt-oss": lambda: (
        ["<|channel|>analysis<|message|>I need the calculator.<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.calculator <|constrain|>json<|message|>{\"expression\": \"2+3\"}<|call|>",
         "<|channel|>analysis<|message|>It said 5.<|end|><|start|>assistant<|channel|>final<|message|>2+3 is 5.<|return|>",
         "<|channel|>analysis<|message|>Again.<|end|><|start|>assistant<|channel|>commentary to=functions.calculator "
         "<|constrain|>json<|message|>{\"expression\": \"3*4\"}<|call|>",
         "<|channel|>analysis<|message|>It said 12.<|end|><|start|>assistant<|channel|>final<|message|>3*4 is 12.<|return|>"],
        ["<|channel|>analysis<|message|>Middle.<|end|><|start|>assistant<|channel|>final<|message|>5<|return|>",
         "<|channel|>analysis<|message|>Higher.<|end|><|start|>assistant<|channel|>final<|message|>8<|return|>",
         "<|channel|>analysis<|message|>Between.<|end|><|start|>assistant<|channel|>final<|message|>7<|return|>"]),
    "gemma3": lambda: (None, ["5<end_of_turn>", "8<end_of_turn>", "7<end_of_turn>"]),
    "gemma3-pythonic": lambda: (
        ['[calculator(expression="2+3")]<end_of_turn>', "2+3 is 5.<end_of_turn>",
         '[calculator(expression="3*4")]<end_of_turn>', "3*4 is 12.<end_of_turn>"],
        ["5<end_of_turn>", "8<end_of_turn>", "7<end_of_turn>"]),
}

# family case -> (tokenizer factory, ChatConfig kwargs, vocabulary)
CASES = {
    "qwen2.5": (lambda: qwen_tokenizer(template("qwen2.5-instruct.jinja")), {}, "real"),
    "qwen3-think": (lambda: qwen_tokenizer(template("qwen3.jinja")), {"thinking": True}, "real"),
    "qwen3-nothink": (lambda: qwen_tokenizer(template("qwen3.jinja")), {"thinking": False}, "real"),
    "qwq": (lambda: qwen_tokenizer(template("qwq-32b.jinja")), {}, "real"),
    "llama3": (lambda: standin_tokenizer(template("llama-3.3-instruct.jinja"), LLAMA3_ADDED, eos="<|eot_id|>",
                                         bos="<|begin_of_text|>"), {}, "stand-in"),
    "mistral": (nemo_tokenizer, {}, "real"),
    "deepseek-v3": (lambda: deepseek_tokenizer(template("deepseek-v3.jinja")), {}, "real"),
    "deepseek-v3.1": (lambda: deepseek_tokenizer(template("deepseek-v3.1.jinja")), {"thinking": False}, "real"),
    "deepseek-v3.1-think": (lambda: deepseek_tokenizer(template("deepseek-v3.1.jinja")), {"thinking": True}, "real"),
    "glm-4.5": (lambda: standin_tokenizer(template("glm-4.5.jinja"), GLM45_ADDED, eos="<|endoftext|>"), {}, "stand-in"),
    "gpt-oss": (lambda: standin_tokenizer(template("gpt-oss.jinja"), HARMONY_ADDED, eos="<|return|>"),
                {"reasoning_effort": "low"}, "stand-in"),
    "gemma3": (lambda: standin_tokenizer(template("gemma-3-it.jinja"), GEMMA3_ADDED, eos="<end_of_turn>", bos="<bos>"),
               {}, "stand-in"),
    "gemma3-pythonic": (lambda: standin_tokenizer(template("gemma-3-pythonic-vllm.jinja"), GEMMA3_ADDED,
                                                  eos="<end_of_turn>", bos="<bos>"), {}, "stand-in"),
}
_TOKS: dict[str, object] = {}


def tokenizer(case: str):
    if case not in _TOKS:
        _TOKS[case] = CASES[case][0]()
    return _TOKS[case]


class ScriptEngine(InferenceEngine):
    """Answers the i-th request with the i-th scripted token list; records every prompt."""

    def __init__(self, outputs: list[list[int]]):
        self.outputs, self.calls = outputs, []

    async def generate(self, prompt_ids, params, *, request_id, session_id=None) -> Generation:
        out = self.outputs[len(self.calls)][: params.max_tokens]
        self.calls.append((list(prompt_ids), out))
        return Generation(out, [-0.5] * len(out), [0] * len(out), "stop")

    async def update_weights(self, state_dict, version):
        pass

    @property
    def version(self) -> int:
        return 0

    async def abort(self, request_id):
        pass


def encode(tok, text: str) -> list[int]:
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


async def run_episode(case: str, episode: str, mode: str):
    tok = tokenizer(case)
    calls_out, plain_out = OUT[case]()
    outputs = calls_out if episode == "tools" else plain_out
    env = TOOL_EPISODE if episode == "tools" else PLAIN_EPISODE
    engine = ScriptEngine([encode(tok, o) for o in outputs])
    cfg = RolloutConfig(max_tokens_per_turn=512, max_context_tokens=16384,
                        chat=ChatConfig(template_mode=mode, **CASES[case][1]))
    policy = AgentLoopPolicy(engine, tok, cfg, tools=TOOLS if episode == "tools" else None)
    s = policy.session(EpisodeMeta(f"{case}-{episode}", "g", "test/Env-v0", 0))
    actions = [await s.act([dict(m) for m in msgs]) for msgs in env]
    return s, actions, engine, policy


def check_tokens_trained_equal_sampled(s, engine) -> Trajectory:
    rec = s.token_record()
    t = Trajectory(id="x", group_id="g", env_id="e", token_ids=rec.token_ids, loss_mask=rec.loss_mask,
                   logprobs=rec.logprobs, versions=rec.versions, prompt_len=rec.prompt_len, segments=rec.segments)
    t.validate()
    segs = [t.token_ids[a:b] for a, b in t.segment_slices()]
    masks = [t.loss_mask[a:b] for a, b in t.segment_slices()]
    gen_all = []
    for prompt, out in engine.calls:
        # Every request's prompt is the start of one segment, and the segment continues with exactly its output.
        # (A later segment may hold the same tokens as context, when the template re-renders them unchanged.)
        hit = [i for i, seg in enumerate(segs) if seg[: len(prompt)] == prompt
               and seg[len(prompt): len(prompt) + len(out)] == out
               and masks[i][len(prompt): len(prompt) + len(out)] == [1] * len(out)]
        assert hit, "a request's prompt + output (trained) is not in any segment"
        i = hit[-1]
        assert all(m == 0 for m in masks[i][: len(prompt)][-1:])  # the token before the output is not generated
        gen_all += out
    assert [x for x, m in zip(t.token_ids, t.loss_mask) if m] == gen_all  # trained == sampled, in order
    return t


def call_of(tc: dict) -> tuple[str, dict]:
    return tc["function"]["name"], json.loads(tc["function"]["arguments"])


def round_trip(s, msg: dict) -> list[tuple[str, dict]]:
    """Renders the assistant message ``msg`` with the template after a user message, reads the rendered turn back
    with the family's parser, and returns its calls."""
    r: ChatRenderer = s.chat
    user = [{"role": "user", "content": "go"}]
    prompt = r.render(user, add_generation_prompt=True, tools=TOOLS)
    full = r.render(user + [msg], add_generation_prompt=False, tools=TOOLS)
    n = 0
    while n < min(len(prompt), len(full)) and prompt[n] == full[n]:
        n += 1
    turn_text = full[n:]
    if r.closing_text and turn_text.endswith(r.closing_text):  # the model stops on the closing: not its text
        turn_text = turn_text[: -len(r.closing_text)]
    gen_prefix = prompt[n:]
    turn, _ = r.read_turn(gen_prefix + turn_text, encode(r.tokenizer, turn_text), TOOLS, seed="rt")
    return [(c.name, c.arguments) for c in turn.calls]


WRITERS = ["qwen3-think", "qwen3-nothink", "qwq", "mistral", "deepseek-v3.1", "deepseek-v3.1-think", "glm-4.5", "gpt-oss"]


@pytest.mark.parametrize("case", [c for c in CASES if OUT[c]()[0] is not None])
@pytest.mark.parametrize("mode", ["keep", "split"])
async def test_tool_episode(case, mode):
    s, actions, engine, policy = await run_episode(case, "tools", mode)
    assert len(engine.calls) == 4
    t = check_tokens_trained_equal_sampled(s, engine)
    expected = [("calculator", {"expression": "2+3"}), None, ("calculator", {"expression": "3*4"}), None]
    for a, want in zip(actions, expected):
        got = [call_of(tc) for tc in a.tool_calls]
        assert got == ([want] if want else []), (case, a.text, a.tool_calls)
        # The env reads the call in agentrl's format whatever the family wrote.
        env_calls = [(c.name, c.arguments) for c in parse_tool_calls(a.text).calls]
        assert env_calls == got
    assert "12" in actions[3].text and "<think>" not in actions[3].text and "analysis" not in actions[3].text
    # Tool messages got the id of the call they answer.
    tool_msgs = [m for m in s.messages if m["role"] == "tool"]
    asst_calls = [m["tool_calls"][0]["id"] for m in s.messages if m["role"] == "assistant" and m.get("tool_calls")]
    assert [m["tool_call_id"] for m in tool_msgs] == asst_calls
    # Round trip: render -> parse returns each call unchanged.
    for m in s.messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            want = [(tc["function"]["name"], tc["function"]["arguments"] if isinstance(tc["function"]["arguments"], dict)
                     else json.loads(tc["function"]["arguments"])) for tc in m["tool_calls"]]
            assert round_trip(s, m) == want
    rec = s.token_record()
    assert rec.info["chat/segments"] == len(t.segment_slices())
    if mode == "keep":
        assert not rec.segments
    else:
        assert len(t.segment_slices()) == 1 + rec.info["chat/drift_env"]
    if case in ("qwen2.5", "llama3"):  # prefix-stable templates whose rendering is exactly what the model wrote
        assert rec.info["chat/drift_env"] == 0 and rec.info["chat/drift_handover"] == 0
    assert policy.metrics()["chat/drift_env"] == rec.info["chat/drift_env"]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["keep", "split"])
async def test_plain_multi_turn_episode(case, mode):
    s, actions, engine, _ = await run_episode(case, "plain", mode)
    t = check_tokens_trained_equal_sampled(s, engine)
    assert [a.text.strip() for a in actions] == ["5", "8", "7"]
    rec = s.token_record()
    if case in WRITERS[:1] + ["qwq", "glm-4.5", "deepseek-v3.1-think", "gpt-oss"]:
        # These templates strip past reasoning when a new user message comes: history is rewritten every turn.
        assert rec.info["chat/drift_env"] == 2, rec.info
    if mode == "split":
        assert len(t.segment_slices()) == 1 + rec.info["chat/drift_env"]
    text = s.chat.decode(t.token_ids)
    # The system prompt is in each sample exactly once (Mistral moves it to the last user message).
    for a, b in t.segment_slices():
        seg = s.chat.decode(t.token_ids[a:b])
        assert seg.count("Guess the secret number.") == 1, seg
    if mode == "keep" and "Middle." in OUT[case]()[1][0]:
        assert text.count("Middle.") == 1  # past reasoning kept as the model saw it, never duplicated


async def test_split_segments_start_with_the_templates_own_rendering():
    s, _, engine, _ = await run_episode("qwen3-think", "plain", "split")
    r = s.chat
    convo: list[dict] = []
    for (prompt, _), msgs, i in zip(engine.calls, PLAIN_EPISODE, range(3)):
        convo = s.messages[: len(convo) + len(msgs)] if i == 0 else s.messages[: len(convo) + 1 + len(msgs)]
        assert r.decode(prompt) == r.render(convo, add_generation_prompt=True), i
    # The reasoning of earlier turns is not in later prompts (the template strips it), but each turn trains on its own.
    assert "Middle." not in r.decode(engine.calls[1][0]) and "Middle." in r.decode(engine.calls[0][1])


async def test_glm_stop_on_next_role_token_is_not_duplicated():
    s, actions, engine, _ = await run_episode("glm-4.5", "tools", "keep")
    text = s.chat.decode(s.token_ids)
    assert text.count("<|observation|>") == 2 and text.count("<|user|>") == 3, text  # opening + two stops
    assert "<|observation|><|observation|>" not in text and "<|observation|>\n<tool_response>\n5" in text
    # The generated role token is trained (loss mask 1): the model chose to stop there.
    obs = s.chat.tokenizer.convert_tokens_to_ids("<|observation|>")
    i = s.token_ids.index(obs)
    assert s.loss_mask[i] == 1


async def test_mistral_keep_mode_keeps_the_system_prompt_where_the_model_saw_it():
    s, _, engine, _ = await run_episode("mistral", "plain", "keep")
    rec = s.token_record()
    assert rec.info["chat/drift_env"] == 2  # the template moves the system prompt to the last user message
    text = s.chat.decode(s.token_ids)
    assert text.startswith("<s>[INST]Guess the secret number.\n\nIt is between 1 and 10.[/INST]5</s>[INST]Too low.")


async def test_handover_drift_is_counted():
    """DeepSeek-V3.1 with thinking drops the turn's reasoning when it re-renders it; QwQ's template joins reasoning
    and tool call with one newline where the model wrote two: both are counted, neither crashes."""
    s, _, _, policy = await run_episode("deepseek-v3.1-think", "plain", "keep")
    assert s.token_record().info["chat/drift_handover"] == 3
    assert any("handover" in d for d in s.token_record().info["chat/drifts"])
    s, _, _, _ = await run_episode("qwq", "tools", "keep")
    assert s.token_record().info["chat/drift_handover"] >= 2


async def test_strict_mode_refuses_a_rewriting_template_with_a_clear_error():
    with pytest.raises(TemplateError, match="not prefix-stable.*template_mode to keep or split"):
        await run_episode("qwen3-think", "plain", "strict")


def test_family_detection_and_options():
    r = ChatRenderer(tokenizer("qwen3-nothink"), ChatConfig(thinking=False))
    assert r.family.name == "qwen3" and r.kwargs == {"enable_thinking": False} and r.mode == "keep"
    assert ChatRenderer(tokenizer("deepseek-v3.1-think"), ChatConfig(thinking=True)).kwargs == {"thinking": True}
    g = ChatRenderer(tokenizer("gpt-oss"), ChatConfig(reasoning_effort="high"))
    assert g.family.name == "gpt-oss" and "Reasoning: high" in g.render([{"role": "user", "content": "x"}],
                                                                           add_generation_prompt=True)
    names = {c: ChatRenderer(tokenizer(c)).family.name for c in ("qwen2.5", "qwq", "llama3", "mistral", "glm-4.5")}
    assert names == {"qwen2.5": "qwen2.5", "qwq": "qwq", "llama3": "llama3", "mistral": "mistral",
                     "glm-4.5": "glm45"}
    with pytest.raises(ValueError, match="thinking: family 'llama3'"):
        ChatRenderer(tokenizer("llama3"), ChatConfig(thinking=True))
    with pytest.raises(ValueError, match="reasoning_effort must be"):
        ChatConfig(reasoning_effort="max").validate()


def test_closing_probe_renders_with_the_sessions_tools():
    tok = standin_tokenizer(
        "{%- if not tools %}{{ raise_exception('this template needs tools') }}{%- endif %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}",
        [("<|im_start|>", True), ("<|im_end|>", True)], eos="<|im_end|>")
    r = ChatRenderer(tok)
    assert r.closing(TOOLS)[0] == "<|im_end|>"


def test_tokenizer_class_mismatch_is_fixed(tmp_path):
    """A byte-level BPE tokenizer.json declared as LlamaTokenizerFast (DeepSeek-V3's published config) loads with the
    file's own ids."""
    tok = tokenizer("deepseek-v3.1")
    tok.save_pretrained(tmp_path)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="LlamaTokenizerFast", legacy=True, add_bos_token=True)
    cfg_path.write_text(json.dumps(cfg))
    from tokenizers import Tokenizer

    from transformers import AutoTokenizer

    ref = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "Hello world!\n\n  x = f(1, 2)"
    want = ref.encode(text, add_special_tokens=False).ids
    assert list(AutoTokenizer.from_pretrained(tmp_path)(text, add_special_tokens=False)["input_ids"]) != want
    loaded = load_tokenizer(tmp_path)
    assert list(loaded(text, add_special_tokens=False)["input_ids"]) == want
    assert loaded.chat_template


async def test_gpt_oss_call_token_ends_the_turn_without_a_closing():
    s, actions, _, _ = await run_episode("gpt-oss", "tools", "keep")
    text = s.chat.decode(s.token_ids)
    assert "<|call|><|start|>functions.calculator to=assistant<|channel|>commentary<|message|>\"5\"<|end|>" in text
    assert "<|call|><|return|>" not in text and "<|return|><|end|>" not in text
    assert s.token_record().info["chat/drift_env"] >= 1  # the template drops the analysis and rewrites <|return|>


def test_chat_config_is_typed_and_validated():
    from agentrl.config import ConfigError, from_dict

    c = from_dict(RolloutConfig, {"chat": {"family": "qwen3", "thinking": False, "template_mode": "split"}}, "r.yaml")
    assert (c.chat.family, c.chat.thinking, c.chat.template_mode) == ("qwen3", False, "split")
    with pytest.raises(ConfigError, match="chat.template_mode: expected one of"):
        from_dict(RolloutConfig, {"chat": {"template_mode": "splt"}}, "r.yaml")
    with pytest.raises(ConfigError, match="chat: family must be"):
        from_dict(RolloutConfig, {"chat": {"family": "qwen4"}}, "r.yaml")


async def test_malformed_native_tool_call_is_counted_not_fatal():
    tok = tokenizer("qwen2.5")
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": 2+3}\n</tool_call><|im_end|>'
    engine = ScriptEngine([encode(tok, bad)])
    policy = AgentLoopPolicy(engine, tok, RolloutConfig(), tools=TOOLS)
    s = policy.session(EpisodeMeta("bad", "g", "test/Env-v0", 0))
    a = await s.act([dict(m) for m in TOOL_EPISODE[0]])
    assert a.tool_calls == [] and s.token_record().info["chat/tool_parse_errors"] == 1
    assert policy.metrics()["chat/tool_parse_errors"] == 1.0


def test_unknown_tool_parser_fails_at_construction():
    with pytest.raises(ValueError, match="chat.tool_parser 'nope'"):
        ChatRenderer(tokenizer("qwen2.5"), ChatConfig(tool_parser="nope"))


def test_renderer_api_for_a_gateway():
    """The calls a gateway makes per request, on Qwen3 with thinking: a tool result after a tool call extends the
    stream (append: exact tokens, nothing re-encoded); a new user message after a thinking turn drifts (the template
    strips the reasoning), and the new segment's ids are the template's own prompt."""
    tok = tokenizer("qwen3-think")
    r = ChatRenderer(tok, ChatConfig(thinking=True))
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    prompt_text, ids = r.prompt(msgs, TOOLS)
    gen = encode(tok, qwen3_think("Use the tool.", hermes_call("2+3")) + "<|im_end|>")
    end = r.end_turn(ids[-4:], gen, TOOLS)
    assert end.append_ids == encode(tok, "\n") and end.end_text == "<|im_end|>\n"
    turn, msg = r.read_turn(r.generation_prefix(prompt_text) + end.text, end.text_ids, TOOLS, seed="s")
    oa = turn.openai_tool_calls()
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in oa] == \
        [("calculator", {"expression": "2+3"})] and turn.reasoning.strip() == "Use the tool."
    assert r.handover(msgs + [msg], prompt_text + end.text + end.end_text, len(prompt_text), TOOLS) is None
    stream_ids, stream_text = ids + gen + end.append_ids, prompt_text + end.stream_text
    msgs = msgs + [msg, {"role": "tool", "content": "5", "tool_call_id": oa[0]["id"]}]
    c = r.continue_from(stream_text, msgs, TOOLS)
    assert c.kind == "append" and tok.decode(c.ids).startswith("<|im_start|>user\n<tool_response>\n5")
    assert r.encode(c.rendered)[: len(stream_ids)] == stream_ids  # the same tokens a full re-render gives
    msgs = msgs + [{"role": "assistant", "content": "5", "reasoning_content": "Done."},
                   {"role": "user", "content": "And 3*4?"}]
    c = r.continue_from(stream_text + c.text + "<think>\nDone.\n</think>\n\n5<|im_end|>\n", msgs, TOOLS)
    assert c.kind == "drift" and "Use the tool." not in c.text and c.ids == r.prompt(msgs, TOOLS)[1]
