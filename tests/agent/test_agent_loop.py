"""The token-in/token-out agent loop against a scripted fake engine and a real trained tokenizer with a chat template.

The fake engine is the only stand-in: it returns scripted token ids (so the exact tokens at every turn boundary can
be pinned), records every request, and can abort a request once while bumping its weight version. The real-engine
tests live in test_agent_loop_engine.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agentrl.config import ConfigError, from_dict
from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.models import train_tokenizer
from agentrl.policy import EpisodeMeta
from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig, TemplateError
from agentrl.tools import format_tool_call
from agentrl.trajectory import Trajectory

CORPUS = [
    "<|im_start|>user\nGuess a number between 1 and 100.<|im_end|>\n<|im_start|>assistant\n42<|im_end|>\n",
    "Too low. Try again. Too high. Correct! The secret number was 57.",
    '{"name": "calculator", "arguments": {"expression": "2+3"}}',
    "You are a helpful assistant. Use the tools when they help.",
] * 20

# Qwen2.5's real habit: consecutive tool messages are merged into one user turn. Written here to check that
# rendering several new messages at once gives the right tokens for such templates.
GROUPING_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Not prefix-stable: the system header counts the messages.
UNSTABLE_TEMPLATE = (
    "{{ '<|im_start|>system\\n' + (messages | length | string) + ' messages<|im_end|>\\n' }}"
    "{%- for m in messages -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS, 400)


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


class FakeEngine(InferenceEngine):
    """Returns ``script(prompt_ids, params, call_index) -> list[int]`` as the generation: the tokens up to and
    including the first eos (finish "stop") or the first ``max_tokens`` (finish "length").

    ``abort_after``: the first request is aborted after that many tokens and the version bumped (like a weight update
    in abort mode). ``delay(request_id) -> seconds`` sleeps before answering. Every call is recorded.
    """

    def __init__(self, script, eos_id: int, *, abort_after: int | None = None, delay=None):
        self.script, self.eos_id, self.abort_after, self.delay = script, eos_id, abort_after, delay
        self.calls: list[dict] = []
        self._version = 0
        self.aborted: list[str] = []

    async def generate(self, prompt_ids, params: SamplingParams, *, request_id, session_id=None) -> Generation:
        i = len(self.calls)
        self.calls.append(dict(prompt=list(prompt_ids), params=params, request_id=request_id, session_id=session_id,
                               t=time.perf_counter()))
        if self.delay:
            await asyncio.sleep(self.delay(request_id))
        out = list(self.script(list(prompt_ids), params, i))
        finish = "length"
        if self.eos_id in out[: params.max_tokens]:
            out, finish = out[: out.index(self.eos_id) + 1], "stop"
        else:
            out = out[: params.max_tokens]
        version = self._version
        if self.abort_after is not None and i == 0 and len(out) > self.abort_after:
            out = out[: self.abort_after]
            self._version += 1
            return Generation(out, [-0.25] * len(out), [version] * len(out), "abort")
        lps = [-0.1 * (j + 1) for j in range(len(out))]
        return Generation(out, lps, [version] * len(out), finish)

    async def update_weights(self, state_dict, version):
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    async def abort(self, request_id):
        self.aborted.append(request_id)


def meta(tid="traj-0", seed=0, task=None):
    return EpisodeMeta(trajectory_id=tid, group_id="g0", env_id="test/Env-v0", seed=seed, task=task)


def traj_of(session) -> Trajectory:
    rec = session.token_record()
    t = Trajectory(id=session.meta.trajectory_id, group_id="g0", env_id="x", token_ids=rec.token_ids,
                   loss_mask=rec.loss_mask, logprobs=rec.logprobs, versions=rec.versions, prompt_len=rec.prompt_len)
    t.validate()
    return t


def replies(tok, *texts_and_stops):
    """A script that answers the n-th request with the n-th text's tokens, plus eos where the text is followed by
    True."""
    outs = []
    for text, stop in texts_and_stops:
        ids = enc(tok, text)
        outs.append(ids + ([tok.eos_token_id] if stop else []))
    return lambda prompt, params, i: outs[i]


async def test_turn_boundaries_are_exact_tokens(tok):
    eos = tok.eos_token_id
    engine = FakeEngine(replies(tok, ("50", True), ("75", True)), eos)
    policy = AgentLoopPolicy(engine, tok, RolloutConfig(max_tokens_per_turn=16))
    s = policy.session(meta())
    opening = [{"role": "system", "content": "Guess the number."}, {"role": "user", "content": "Between 1 and 100."}]
    a1 = await s.act(opening)
    assert a1.text == "50" and a1.finish_reason == "stop"
    assert a1.token_ids == enc(tok, "50") + [eos]
    a2 = await s.act([{"role": "user", "content": "Too low."}])
    assert a2.text == "75"

    prompt = enc(tok, "<|im_start|>system\nGuess the number.<|im_end|>\n<|im_start|>user\nBetween 1 and 100.<|im_end|>\n"
                      "<|im_start|>assistant\n")
    g1, g2 = enc(tok, "50") + [eos], enc(tok, "75") + [eos]
    # The model stopped on <|im_end|>: the loop adds only the template's "\n" after it, then the user turn.
    between = enc(tok, "\n<|im_start|>user\nToo low.<|im_end|>\n<|im_start|>assistant\n")
    closing = enc(tok, "\n")
    assert s.token_ids == prompt + g1 + between + g2 + closing
    assert s.loss_mask == [0] * len(prompt) + [1] * len(g1) + [0] * len(between) + [1] * len(g2) + [0]
    # The second request's prompt is exactly the trajectory so far: generated ids were never re-encoded.
    assert engine.calls[1]["prompt"] == prompt + g1 + between
    assert s.prompt_len == len(prompt)
    # The whole stream decodes to what the template renders for the conversation (no lost newline anywhere).
    convo = opening + [{"role": "assistant", "content": "50"}, {"role": "user", "content": "Too low."},
                       {"role": "assistant", "content": "75"}]
    assert tok.decode(s.token_ids) == tok.apply_chat_template(convo, tokenize=False)
    t = traj_of(s)
    assert t.num_generated == len(g1) + len(g2)


async def test_lost_newline_after_eos_and_closing_after_length_cut(tok):
    eos, nl = tok.eos_token_id, enc(tok, "\n")
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    # Turn 1 stops on eos; turn 2 is cut by max_tokens (no eos at all).
    long_text = "Too high. Too low. Too high. Too low."
    engine = FakeEngine(replies(tok, ("50", True), (long_text, False)), eos)
    s = AgentLoopPolicy(engine, tok, RolloutConfig(max_tokens_per_turn=4)).session(meta())
    await s.act([{"role": "user", "content": "Guess."}])
    i = s.token_ids.index(eos, s.prompt_len)
    a2 = await s.act([{"role": "user", "content": "Too low."}])
    # After the first turn's <|im_end|> comes "\n" then <|im_start|>, never <|im_start|> right away.
    assert s.token_ids[i + 1: i + 1 + len(nl)] == nl and s.token_ids[i + 1 + len(nl)] == im_start
    assert a2.finish_reason == "length" and len(a2.token_ids) == 4
    # The cut turn gets the whole closing <|im_end|>\n with loss mask 0.
    tail = [eos] + nl
    assert s.token_ids[-len(tail):] == tail and s.loss_mask[-len(tail):] == [0] * len(tail)
    assert s.token_ids[-len(tail) - 4: -len(tail)] == a2.token_ids
    traj_of(s)


async def test_tool_call_and_tool_result_tokens(tok):
    eos = tok.eos_token_id
    call = format_tool_call("calculator", {"expression": "2+3"})
    engine = FakeEngine(replies(tok, ("Let me compute.\n" + call, True), ("5", True)), eos)
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluates arithmetic.",
                                               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                              "required": ["expression"]}}}]
    policy = AgentLoopPolicy(engine, tok, RolloutConfig(max_tokens_per_turn=64), tools=tools)
    s = policy.session(meta())
    a1 = await s.act([{"role": "user", "content": "What is 2+3?"}])
    # <tool_call> tags are ordinary added tokens: they survive decoding, so the env can parse the call.
    assert a1.text == "Let me compute.\n" + call
    assert enc(tok, "<tool_call>")[0] in a1.token_ids
    await s.act([{"role": "tool", "name": "calculator", "content": "5"}])
    prompt_text = tok.decode(s.token_ids[: s.prompt_len])
    assert prompt_text.startswith("<|im_start|>system\n# Tools") and '"name": "calculator"' in prompt_text
    g1 = enc(tok, "Let me compute.\n" + call) + [eos]
    tool_turn = enc(tok, "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    g2 = enc(tok, "5") + [eos]
    assert s.token_ids[s.prompt_len:] == g1 + tool_turn + g2 + enc(tok, "\n")
    assert s.loss_mask[s.prompt_len:] == [1] * len(g1) + [0] * len(tool_turn) + [1] * len(g2) + [0]
    # With tools off the template gets none.
    off = AgentLoopPolicy(FakeEngine(replies(tok, ("5", True)), eos), tok, RolloutConfig(tools=False), tools=tools)
    s2 = off.session(meta())
    await s2.act([{"role": "user", "content": "What is 2+3?"}])
    assert "# Tools" not in tok.decode(s2.token_ids)


async def test_grouped_tool_messages_render_as_one_turn(tok):
    tok2 = train_tokenizer(CORPUS, 400)
    tok2.chat_template = GROUPING_TEMPLATE
    eos = tok2.eos_token_id
    engine = FakeEngine(replies(tok2, ("call", True), ("done", True)), eos)
    s = AgentLoopPolicy(engine, tok2, RolloutConfig()).session(meta())
    await s.act([{"role": "user", "content": "Go."}])
    n = len(s.token_ids)
    assert s.token_ids[-2:] == [eos] + enc(tok2, "\n")
    await s.act([{"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}])
    expected = enc(tok2, "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert s.token_ids[n: n + len(expected)] == expected


async def test_template_that_is_not_prefix_stable_is_refused(tok):
    tok2 = train_tokenizer(CORPUS, 400)
    tok2.chat_template = UNSTABLE_TEMPLATE
    engine = FakeEngine(replies(tok2, ("50", True), ("60", True)), tok2.eos_token_id)
    s = AgentLoopPolicy(engine, tok2, RolloutConfig()).session(meta())
    await s.act([{"role": "user", "content": "Guess."}])
    with pytest.raises(TemplateError, match="not prefix-stable.*'user'"):
        await s.act([{"role": "user", "content": "Too low."}])


async def test_max_turns_and_max_context(tok):
    eos = tok.eos_token_id
    engine = FakeEngine(lambda p, params, i: enc(tok, "Too high. Too low. " * 20), eos)
    s = AgentLoopPolicy(engine, tok, RolloutConfig(max_turns=2, max_tokens_per_turn=8)).session(meta())
    for _ in range(2):
        assert not (await s.act([{"role": "user", "content": "Go."}])).context_exhausted
    a = await s.act([{"role": "user", "content": "Go."}])
    assert a.context_exhausted and a.finish_reason == "max_turns" and a.token_ids == []
    assert len(engine.calls) == 2

    # Context: with room for the prompt, 6 generated tokens and the 2-token closing, the turn's max_tokens is capped
    # to 6, and the next turn, whose env tokens would not fit, is not started (and its tokens not appended).
    engine = FakeEngine(lambda p, params, i: enc(tok, "Too high. Too low. " * 20), eos)
    probe = AgentLoopPolicy(engine, tok, RolloutConfig()).session(meta())
    await probe.act([{"role": "user", "content": "Go."}])
    p_len = probe.prompt_len
    limit = p_len + 6 + 2
    engine = FakeEngine(lambda p, params, i: enc(tok, "Too high. Too low. " * 20), eos)
    s = AgentLoopPolicy(engine, tok, RolloutConfig(max_context_tokens=limit, max_tokens_per_turn=100)).session(meta())
    a1 = await s.act([{"role": "user", "content": "Go."}])
    assert engine.calls[0]["params"].max_tokens == 6 and len(a1.token_ids) == 6 and a1.finish_reason == "length"
    assert len(s.token_ids) == limit
    a2 = await s.act([{"role": "user", "content": "Go."}])
    assert a2.context_exhausted and a2.finish_reason == "max_context" and len(engine.calls) == 1
    assert len(s.token_ids) == limit
    traj_of(s)


async def test_aborted_turn_is_resubmitted_and_keeps_versions(tok):
    eos = tok.eos_token_id
    text = "Too high. Too low. Correct!"
    full = enc(tok, text)
    assert len(full) > 5
    base = [0]  # the first prompt's length, set below

    # The script continues from wherever the prompt ends, like a model would: it emits the rest of `full`.
    def script(prompt, params, i):
        return full[len(prompt) - base[0]:] + [eos]

    engine = FakeEngine(script, eos, abort_after=3)
    policy = AgentLoopPolicy(engine, tok, RolloutConfig(max_tokens_per_turn=64))
    s = policy.session(meta())
    prompt_ids = enc(tok, "<|im_start|>user\nGo.<|im_end|>\n<|im_start|>assistant\n")
    base[0] = len(prompt_ids)
    a = await s.act([{"role": "user", "content": "Go."}])
    assert len(engine.calls) == 2 and s.stats["resubmits"] == 1
    assert engine.calls[1]["prompt"] == prompt_ids + full[:3]
    assert engine.calls[1]["params"].max_tokens == 64 - 3
    assert engine.calls[0]["request_id"] != engine.calls[1]["request_id"]
    assert a.token_ids == full + [eos] and a.text == text and a.finish_reason == "stop"
    assert a.versions == [0, 0, 0] + [1] * (len(full) - 2)
    t = traj_of(s)
    assert t.version_range() == (0, 1)
    gen = [v for v, m in zip(t.versions, t.loss_mask) if m]
    assert gen == a.versions
    assert t.logprobs[s.prompt_len: s.prompt_len + 3] == [-0.25] * 3


async def test_each_trajectory_sends_its_own_request_without_waiting(tok):
    """Queue scheduling: a slow trajectory's request does not hold back a fast trajectory's next turns."""
    eos = tok.eos_token_id
    engine = FakeEngine(lambda p, params, i: enc(tok, "50") + [eos], eos,
                        delay=lambda rid: 0.5 if rid.startswith("slow") else 0.01)
    policy = AgentLoopPolicy(engine, tok, RolloutConfig())
    done_at = {}

    async def episode(tid, turns):
        s = policy.session(meta(tid))
        for _ in range(turns):
            await s.act([{"role": "user", "content": "Go."}])
        done_at[tid] = time.perf_counter()
        await s.aclose()

    t0 = time.perf_counter()
    await asyncio.gather(episode("slow", 1), episode("fast", 5))
    fast_reqs = [c["t"] - t0 for c in engine.calls if c["request_id"].startswith("fast")]
    assert len(fast_reqs) == 5 and max(fast_reqs) < 0.4  # all five fast turns started while "slow" was generating
    assert done_at["fast"] < done_at["slow"]
    assert all(c["session_id"] == c["request_id"].split("-t")[0] for c in engine.calls)


async def test_seed_per_request_and_sampling_params(tok):
    eos = tok.eos_token_id
    engine = FakeEngine(lambda p, params, i: enc(tok, "50") + [eos], eos)
    cfg = RolloutConfig(seed=7, temperature=0.7, top_p=0.9, top_k=20, stop=["</answer>"], max_tokens_per_turn=33)
    policy = AgentLoopPolicy(engine, tok, cfg)
    for tid in ("a", "b", "a"):
        await policy.session(meta(tid)).act([{"role": "user", "content": "Go."}])
    p = [c["params"] for c in engine.calls]
    assert (p[0].temperature, p[0].top_p, p[0].top_k, p[0].stop, p[0].max_tokens) == (0.7, 0.9, 20, ["</answer>"], 33)
    assert p[0].seed == p[2].seed != p[1].seed and p[0].seed is not None
    engine2 = FakeEngine(lambda p, params, i: enc(tok, "50") + [eos], eos)
    await AgentLoopPolicy(engine2, tok, RolloutConfig()).session(meta()).act([{"role": "user", "content": "Go."}])
    assert engine2.calls[0]["params"].seed is None


async def test_aclose_aborts_the_request_in_flight(tok):
    eos = tok.eos_token_id
    engine = FakeEngine(lambda p, params, i: enc(tok, "50") + [eos], eos, delay=lambda rid: 10)
    s = AgentLoopPolicy(engine, tok, RolloutConfig()).session(meta("t9"))
    task = asyncio.create_task(s.act([{"role": "user", "content": "Go."}]))
    while not engine.calls:  # the request is in flight (recorded before its 10 s answer)
        await asyncio.sleep(0)
    task.cancel()
    await s.aclose()
    assert engine.aborted == ["t9-t0-r0"]
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(RuntimeError, match="closed"):
        await s.act([{"role": "user", "content": "Go."}])


async def test_bad_input_is_reported_clearly(tok):
    eos = tok.eos_token_id
    engine = FakeEngine(lambda p, params, i: [eos], eos)
    s = AgentLoopPolicy(engine, tok, RolloutConfig()).session(meta())
    with pytest.raises(ValueError, match=r"new_messages\[1\]"):
        await s.act([{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="opening messages"):
        await s.act([])
    # A string observation is one user message; an immediately-stopping model gives empty text.
    a = await s.act("Go.")
    assert a.text == "" and a.token_ids == [eos]
    traj_of(s)


async def test_an_observation_with_a_lone_surrogate_is_read_with_replacement_characters(tok):
    """An env's text may hold a lone surrogate (bytes decoded with surrogateescape, a JSON "\\udc80"): the tokenizer
    raised TypeError on it and the episode died at its next act. It is read as U+FFFD, as undecodable bytes are."""
    eos = tok.eos_token_id
    engine = FakeEngine(replies(tok, ("ok", True), ("ok", True)), eos)
    s = AgentLoopPolicy(engine, tok, RolloutConfig(max_tokens_per_turn=8)).session(meta())
    assert (await s.act([{"role": "user", "content": "bytes: \udc80\udcff end"}])).text == "ok"
    assert (await s.act("more \ud800")).text == "ok"
    text = tok.decode(s.token_ids)
    assert "bytes: \ufffd\ufffd end" in text and "more \ufffd" in text
    traj_of(s)


class MisalignedEngine(FakeEngine):
    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        return Generation([1, 2], [-1.0], [0, 0], "length")


async def test_misaligned_engine_output_is_an_error(tok):
    s = AgentLoopPolicy(MisalignedEngine(None, tok.eos_token_id), tok, RolloutConfig()).session(meta())
    with pytest.raises(ValueError, match="misaligned"):
        await s.act("Go.")


def test_config_is_typed_and_validated(tok):
    cfg = from_dict(RolloutConfig, {"temperature": 0.5, "max_tokens_per_turn": 12, "stop": ["x"]}, "rollout.yaml")
    assert cfg.temperature == 0.5 and cfg.max_tokens_per_turn == 12
    with pytest.raises(ConfigError, match="rollout.yaml: max_token_per_turn: unknown key.*max_tokens_per_turn"):
        from_dict(RolloutConfig, {"max_token_per_turn": 3}, "rollout.yaml")
    with pytest.raises(ConfigError, match="top_p must be in"):
        from_dict(RolloutConfig, {"top_p": 0.0}, "rollout.yaml")
    with pytest.raises(ValueError, match="max_turns"):
        AgentLoopPolicy(FakeEngine(None, 0), tok, RolloutConfig(max_turns=0))
    no_template = train_tokenizer(CORPUS, 300)
    no_template.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        AgentLoopPolicy(FakeEngine(None, 0), no_template, RolloutConfig())


async def test_other_eos_token_gets_the_full_closing(tok):
    """A model that stops on a different eos (generation_config's <|endoftext|>) still gets <|im_end|>\\n after it."""
    eos, eot = tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")
    engine = FakeEngine(lambda p, params, i: enc(tok, "50") + [eot], eot)
    s = AgentLoopPolicy(engine, tok, RolloutConfig()).session(meta())
    a = await s.act("Go.")
    assert a.text == "50" and a.token_ids[-1] == eot
    assert s.token_ids[-3:] == [eot, eos] + enc(tok, "\n") and s.loss_mask[-3:] == [1, 0, 0]


async def test_episode_tools_are_taken_at_the_first_act(tok):
    """A manager may attach the env's tools (reset info) to the episode meta after opening the session."""
    eos = tok.eos_token_id
    tools = [{"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {}}}]
    policy = AgentLoopPolicy(FakeEngine(lambda p, params, i: [eos], eos), tok, RolloutConfig())
    m = meta()
    s = policy.session(m)
    m.tools = tools  # after session creation, before the first act
    await s.act("Go.")
    assert '"name": "lookup"' in tok.decode(s.token_ids[: s.prompt_len])
    s2 = policy.session(meta(task={"tools": tools}))
    await s2.act("Go.")
    assert s2.tools == tools


PLAIN_TEMPLATE = (  # no added tokens at turn boundaries: the delta is found by tokenizing both renderings
    "{%- for m in messages -%}{{ '### ' + m.role + '\\n' + m.content + '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '### assistant\\n' }}{%- endif -%}"
)
GLUED_TEMPLATE = "{%- for m in messages -%}{{ m.content }}{%- endfor -%}"  # turns glued together


async def test_template_without_added_tokens_at_boundaries(tok):
    tok2 = train_tokenizer(CORPUS, 400)
    tok2.chat_template = PLAIN_TEMPLATE
    eos = tok2.eos_token_id
    engine = FakeEngine(replies(tok2, ("50", True), ("75", True)), eos)
    s = AgentLoopPolicy(engine, tok2, RolloutConfig()).session(meta())
    await s.act([{"role": "user", "content": "Go."}])
    n = len(s.token_ids)
    assert s.token_ids[n - 2:] == [eos] + enc(tok2, "\n")  # the closing is "\n"; eos stays as generated
    await s.act([{"role": "user", "content": "Too low."}])
    base = "### user\nGo.\n### assistant\n50\n"
    full = enc(tok2, base + "### user\nToo low.\n### assistant\n")
    assert enc(tok2, base) == full[: len(enc(tok2, base))]
    assert s.token_ids[n: n + len(full) - len(enc(tok2, base))] == full[len(enc(tok2, base)):]

    tok3 = train_tokenizer(CORPUS, 400)
    tok3.chat_template = GLUED_TEMPLATE
    assert enc(tok3, "Guess")[: len(enc(tok3, "Gu"))] != enc(tok3, "Gu")  # BPE merges across the boundary
    engine = FakeEngine(replies(tok3, ("Gu", False)), tok3.eos_token_id)
    s = AgentLoopPolicy(engine, tok3, RolloutConfig(max_tokens_per_turn=len(enc(tok3, "Gu")))).session(meta())
    await s.act([{"role": "user", "content": "Go."}])
    with pytest.raises(TemplateError, match="token level.*'ess'"):
        await s.act([{"role": "user", "content": "ess"}])


def test_fast_encode_matches_the_tokenizer(tok):
    from agentrl.agent.loop import ChatTokens

    chat = ChatTokens(tok)
    text = tok.apply_chat_template([{"role": "user", "content": "Guess 42 <tool_call>{\"a\": 1}</tool_call> ok"}],
                                   add_generation_prompt=True, tokenize=False)
    assert chat.encode(text) == tok(text, add_special_tokens=False)["input_ids"]
    assert chat.closing_text == "<|im_end|>\n" and chat.closing_ids == enc(tok, "<|im_end|>\n")


async def test_rollout_through_the_env_manager(tok):
    """``rollout`` over the real EnvManager: GuessNumber episodes whose trajectories hold the loop's tokens; an
    episode that runs out of context ends truncated."""
    from agentrl.manager import EpisodeSpec, ManagerConfig
    from agentrl.agent.loop import rollout

    eos = tok.eos_token_id
    engine = FakeEngine(lambda p, params, i: enc(tok, "<answer>5</answer>") + [eos], eos)
    policy = AgentLoopPolicy(engine, tok, RolloutConfig(max_tokens_per_turn=32))
    trajs = await rollout([EpisodeSpec("agentrl/GuessNumber-v0", seed=i) for i in range(3)], policy,
                          ManagerConfig(max_concurrency=3, max_turns=8))
    for t in trajs:
        t.validate()
        assert t.termination == "terminated" and t.num_turns >= 1
        assert t.num_generated == t.num_turns * (len(enc(tok, "<answer>5</answer>")) + 1)
        assert t.messages[2] == {"role": "assistant", "content": "<answer>5</answer>"}
        assert t.reward == (1.0 if t.info["won"] else 0.0)
    small = AgentLoopPolicy(engine, tok, RolloutConfig(max_tokens_per_turn=16, max_context_tokens=120))
    (t,) = await rollout([EpisodeSpec("agentrl/GuessNumber-v0", seed=0, env_kwargs={"max_guesses": 50})], small,
                         ManagerConfig(max_turns=50))
    assert t.termination == "truncated" and t.info.get("context_exhausted") and len(t.token_ids) <= 120
    t.validate()


async def test_rollout_command_config_and_bad_env(tmp_path, capsys):
    from agentrl.cli import build_parser
    from agentrl.commands.rollout import load_config, run

    config = Path(__file__).resolve().parents[2] / "configs" / "rollout.yaml"
    args = build_parser().parse_args(["rollout", "--config", str(config), "--episodes", "3", "--env",
                                      "agentrl/FrozenLake-v0", "--concurrency", "2", "--set", "rollout.temperature=0.5"])
    cfg = load_config(args)
    assert (cfg.env, cfg.episodes, cfg.manager.max_concurrency, cfg.rollout.temperature) == ("agentrl/FrozenLake-v0", 3, 2, 0.5)
    with pytest.raises(ConfigError, match="rollout.temprature: unknown key.*'temperature'"):
        load_config(build_parser().parse_args(["rollout", "--set", "rollout.temprature=0.5"]))
    cfg.env, cfg.out = "agentrl/Nope-v0", str(tmp_path / "x.jsonl")
    assert await run(cfg) == 2  # before any engine starts
    assert "unknown env id 'agentrl/Nope-v0'" in capsys.readouterr().err
    cfg.env, cfg.env_kwargs = "agentrl/FrozenLake-v0", {"size": 99}  # a kwarg the env refuses: the same
    assert await run(cfg) == 2
    assert "cannot make 'agentrl/FrozenLake-v0' with kwargs {'size': 99}: ValueError" in capsys.readouterr().err


async def test_rollout_command_stops_when_its_engine_dies(tmp_path, capsys):
    """A killed engine core made every episode left an error line (376 of 400 in seconds); the run now stops."""
    from agentrl.chat import load_tokenizer
    from agentrl.cli import build_parser
    from agentrl.commands.rollout import load_config, run
    from agentrl.models import ensure_tiny_model

    tok = load_tokenizer(ensure_tiny_model())  # the command's own: the rollout's model is the tiny one
    class DyingEngine(FakeEngine):
        def dead(self):
            return "the engine core exited" if len(self.calls) > 6 else None

        async def generate(self, prompt_ids, params, *, request_id, session_id=None):
            if self.dead():
                raise RuntimeError("EngineDeadError")
            return await super().generate(prompt_ids, params, request_id=request_id, session_id=session_id)

    engine = DyingEngine(lambda p, params, i: enc(tok, "right") + [tok.eos_token_id], tok.eos_token_id)
    cfg = load_config(build_parser().parse_args(["rollout", "--episodes", "200", "--env", "agentrl/FrozenLake-v0",
                                                 "--concurrency", "2", "--no-progress", "--out",
                                                 str(tmp_path / "t.jsonl")]))
    assert await run(cfg, engine) == 1
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert 0 < len(lines) < 20 and all('"termination": "error"' not in line for line in lines)
    assert f"stopped after {len(lines)} of 200 episodes: the engine core exited" in capsys.readouterr().err
