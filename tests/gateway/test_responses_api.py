"""OpenAI's Responses dialect against the gateway, driven by the official ``openai`` client over real HTTP: the
scripted engine with Qwen3's real vocabulary and template (reasoning and native tool calls), streaming and not,
tools, multi-turn by whole input and by ``previous_response_id``; each request must land in the same session record
as chat completions would put it."""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest

from agentrl.gateway import GatewayConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chat"))
from chat_tokenizers import qwen_tokenizer, template  # noqa: E402
from test_anthropic import ANSWER, NO_THINK, THINK_CALL, chat_twin  # noqa: E402
from test_gateway import assert_record_is_engine_record, client, serve  # noqa: E402

TOOLS = [{"type": "function", "name": "lookup", "description": "Looks a person up.",
          "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}]


@pytest.fixture(scope="module")
def qwen3():
    return qwen_tokenizer(template("qwen3.jinja"))


async def test_responses_tools_reasoning_multi_turn_stream_and_not(qwen3):
    gw, eng = await serve(qwen3, [THINK_CALL, ANSWER, THINK_CALL, ANSWER], max_model_len=4096)
    try:
        c = client(gw, "claude")  # the chat twin's session name: the call ids are drawn per session
        items: list = [{"role": "user", "content": "How old is Ann?"}]
        for turn in range(4):
            kw = dict(model="tiny", instructions="Use tools.", input=items, tools=TOOLS, max_output_tokens=200)
            if turn % 2:
                events = [e async for e in await c.responses.create(stream=True, **kw)]
                kinds = [e.type for e in events]
                assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
                assert "response.output_text.delta" in kinds
                r = events[-1].response
            else:
                r = await c.responses.create(**kw)
            assert r.usage.output_tokens == len(eng.outputs[-1].token_ids)
            assert r.usage.input_tokens == len(eng.calls[-1]["prompt"])
            assert r.output[0].type == "reasoning"
            items += [o.model_dump(exclude_none=True) for o in r.output]
            if turn % 2 == 0:
                call = r.output[-1]
                assert call.type == "function_call" and call.name == "lookup" and call.arguments
                items.append({"type": "function_call_output", "call_id": call.call_id, "output": "age 34"})
            else:
                assert r.status == "completed" and r.output_text.strip() == "She is 34."
                items.append({"role": "user", "content": [{"type": "input_text", "text": f"And now ({turn})?"}]})
        s = gw.store.sessions["claude"]
        assert s.stats["requests"] == 4 and s.stats["tool_calls"] == 2
        traj = gw.store.end("claude", reward=1.0)
        assert_record_is_engine_record(traj, eng)
    finally:
        await gw.stop()
    twin = await chat_twin(qwen3, 4)  # chat completions: the same record, token for token
    assert (traj.token_ids, traj.loss_mask, traj.logprobs, traj.versions, traj.segments) == \
        (twin.token_ids, twin.loss_mask, twin.logprobs, twin.versions, twin.segments)


async def test_previous_response_id_codex_tools_and_defaults(qwen3):
    cfg = GatewayConfig(port=0, max_tokens=64, model_aliases=["gpt-*"])
    gw, eng = await serve(qwen3, [THINK_CALL, NO_THINK + "She is 34.<|im_end|>"], cfg, max_model_len=4096)
    try:
        c = client(gw, "codex")
        tools = [{"type": "namespace", "name": "people", "tools": TOOLS}, {"type": "web_search"},
                 {"type": "custom", "name": "patch\r\nX-Injected: 1\u00e9"}]  # a name cannot split the header
        raw = await c.responses.with_raw_response.create(model="gpt-5-codex", instructions="Use tools.",
                                                         input="How old is Ann?", tools=tools)
        r = raw.parse()
        assert "web_search" in raw.headers["x-agentrl-note"] and "patch??X-Injected: 1?" in raw.headers["x-agentrl-note"]
        assert "x-injected" not in raw.headers
        assert eng.calls[0]["params"].max_tokens == 64  # none asked: the gateway's default
        call = r.output[-1]
        assert call.type == "function_call" and call.name == "lookup"  # the namespace's tool, flattened
        r2 = await c.responses.create(model="gpt-5-codex", instructions="Use tools.", previous_response_id=r.id,
                                      input=[{"type": "function_call_output", "call_id": call.call_id,
                                              "output": "age 34"}], tools=tools, max_output_tokens=100000)
        assert r2.output_text.strip() == "She is 34." and r2.previous_response_id == r.id
        assert eng.calls[1]["params"].max_tokens == 64  # clamped, not refused
        s = gw.store.sessions["codex"]
        assert s.stats["drifts"] == 0 and len(s.segments) == 1  # the held conversation extends the session's tokens
        assert eng.calls[1]["prompt"][: len(eng.calls[0]["prompt"])] == eng.calls[0]["prompt"]
        with pytest.raises(openai.BadRequestError) as e:  # another session cannot continue it
            await client(gw, "other").responses.create(model="tiny", previous_response_id=r2.id, input="hi")
        assert "belongs to session 'codex'" in e.value.message and "other" not in gw.store.sessions
        with pytest.raises(openai.NotFoundError):
            await c.responses.create(model="tiny", previous_response_id="resp_gone", input="hi")
        with pytest.raises(openai.BadRequestError) as e:
            await c.responses.create(model="tiny", input=[{"type": "function_call_output", "output": "x"}])
        assert e.value.body["param"] == "input[0].call_id"
        assert len(eng.calls) == 2
        assert_record_is_engine_record(gw.store.end("codex"), eng)
    finally:
        await gw.stop()


def test_response_log_forgets_the_oldest_past_its_bounds():
    from agentrl.gateway.choices import Choice, Completion
    from agentrl.gateway.protocol import APIError
    from agentrl.gateway.responses_api import ResponseLog

    done = Completion("s", 1, [Choice(0, "ok", "ok", None, [], "stop", [1], [-0.1], [0])], 3, False, False)
    log = ResponseLog(limit=3, max_chars=10_000)
    for i in range(5):
        log.remember(f"r{i}", done, [{"role": "user", "content": "x" * 100}])
    assert len(log) == 3 and log.get("r4")[0] == "s" and log.get("r4")[1][-1] == {"role": "assistant", "content": "ok"}
    with pytest.raises(APIError) as e:
        log.get("r1")
    assert e.value.status == 404 and e.value.param == "previous_response_id"
    log.remember("big", done, [{"role": "user", "content": "y" * 9_900}])  # the character bound evicts too
    assert len(log) == 1 and log.chars <= 10_000


async def test_a_response_echoes_instructions_and_metadata_and_marks_a_cut_message_incomplete(qwen3):
    gw, eng = await serve(qwen3, [NO_THINK + "She is 34.<|im_end|>"] * 2, max_model_len=4096)
    try:
        c = client(gw, "echo")
        kw = dict(model="tiny", instructions="Be brief.", input="How old is Ann?", metadata={"run": "7"},
                  max_output_tokens=6)
        r = await c.responses.create(**kw)
        assert (r.instructions, r.metadata) == ("Be brief.", {"run": "7"})
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.output[-1].type == "message" and r.output[-1].status == "incomplete"
        events = [e async for e in await c.responses.create(stream=True, **kw)]
        assert events[0].response.instructions == "Be brief." and events[0].response.metadata == {"run": "7"}
        assert events[-1].type == "response.incomplete"
        done = events[-1].response
        assert (done.instructions, done.metadata, done.output[-1].status) == ("Be brief.", {"run": "7"}, "incomplete")
        assert [e.item.status for e in events if e.type == "response.output_item.done"][-1] == "incomplete"
    finally:
        await gw.stop()
