"""Anthropic's Messages dialect against the gateway, driven by the official ``anthropic`` client over real HTTP: the
scripted engine with Qwen3's real vocabulary and template (reasoning and native tool calls), streaming and not,
tools and multi-turn; each request must land in the same session record as chat completions would put it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aiohttp
import anthropic
import pytest

from agentrl.gateway import GatewayConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chat"))
from chat_tokenizers import qwen_tokenizer, template  # noqa: E402
from test_gateway import assert_record_is_engine_record, client, serve  # noqa: E402

TOOLS = [{"name": "lookup", "description": "Looks a person up.",
          "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}]
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"name": "Ann"}}\n</tool_call><|im_end|>'
THINK_CALL = "<think>\nLook Ann up.\n</think>\n\n" + CALL
NO_THINK = "<think>\n\n</think>\n\n"
ANSWER = "<think>\nDone.\n</think>\n\nShe is 34.<|im_end|>"


@pytest.fixture(scope="module")
def qwen3():
    return qwen_tokenizer(template("qwen3.jinja"))


def aclient(gw, session, key="unused", **kw):
    c = anthropic.AsyncAnthropic(base_url=f"{gw.url}/s/{session}", api_key=key, max_retries=0, **kw)
    gw.clients.append(c)
    return c


def as_param(content):
    """A reply's blocks as the client sends them back (what Claude Code does)."""
    return [b.model_dump(exclude_none=True) for b in content]


async def test_messages_tools_thinking_multi_turn_stream_and_not(qwen3):
    gw, eng = await serve(qwen3, [THINK_CALL, ANSWER, THINK_CALL, ANSWER], max_model_len=4096)
    try:
        c = aclient(gw, "claude")
        msgs = [{"role": "user", "content": "How old is Ann?"}]
        for turn in range(4):
            kw = dict(model="tiny", max_tokens=200, system=[{"type": "text", "text": "Use tools."}], messages=msgs,
                      tools=TOOLS)
            if turn % 2:
                async with c.messages.stream(**kw) as s:
                    kinds = [e.type async for e in s]
                    r = await s.get_final_message()
                assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
            else:
                r = await c.messages.create(**kw)
            assert r.usage.output_tokens == len(eng.outputs[-1].token_ids)
            assert r.usage.input_tokens == len(eng.calls[-1]["prompt"])
            types = [b.type for b in r.content]
            assert types[0] == "thinking" and r.content[0].thinking.strip() in ("Look Ann up.", "Done.")
            msgs.append({"role": "assistant", "content": as_param(r.content)})
            if turn % 2 == 0:
                assert r.stop_reason == "tool_use" and types[-1] == "tool_use"
                use = r.content[-1]
                assert use.name == "lookup" and use.input == {"name": "Ann"}
                msgs.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "age 34"}]}]})
            else:
                assert r.stop_reason == "end_turn" and r.content[-1].text.strip() == "She is 34."
                msgs.append({"role": "user", "content": [{"type": "text", "text": f"And now ({turn})?"}]})
        traj = end_four_turns(gw, eng)
    finally:
        await gw.stop()
    await assert_same_record_as_chat(traj, qwen3)


def end_four_turns(gw, eng):
    """Ends session ``claude`` (two tool turns, two answers) and checks its record; returns the trajectory."""
    s = gw.store.sessions["claude"]
    # every reply sent back as given is the gateway's own turn
    assert s.stats["requests"] == 4 and s.stats["tool_calls"] == 2 and s.stats["substituted"] == 6
    # the session's tokens are exactly the gateway's rendering of the conversation, as chat completions'
    prompt = eng.calls[-1]["prompt"]
    assert s.segments[-1].token_ids[: len(prompt)] == prompt
    assert gw.renderer.decode(prompt).startswith("<|im_start|>system\nUse tools.")
    traj = gw.store.end("claude", reward=1.0)
    assert_record_is_engine_record(traj, eng)  # every sampled token with its log-prob and version
    return traj


async def assert_same_record_as_chat(traj, qwen3):
    """The same conversation through chat completions gives the same record, token for token (Qwen3's template
    drops the reasoning of turns before the last user message: that rewrite is one drift in any dialect)."""
    twin = await chat_twin(qwen3, 4)
    assert traj.info["gateway/drifts"] == twin.info["gateway/drifts"] == 1
    assert (traj.token_ids, traj.loss_mask, traj.logprobs, traj.versions, traj.segments) == \
        (twin.token_ids, twin.loss_mask, twin.logprobs, twin.versions, twin.segments)


async def chat_twin(qwen3, turns):
    gw, eng = await serve(qwen3, [THINK_CALL, ANSWER], max_model_len=4096)
    try:
        c = client(gw, "claude")
        msgs = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "How old is Ann?"}]
        tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": t["input_schema"]}} for t in TOOLS]
        for turn in range(turns):
            m = (await c.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=200)
                 ).choices[0].message
            msgs.append({"role": "assistant", "content": m.content or "",
                         **({"tool_calls": [t.model_dump() for t in m.tool_calls]} if m.tool_calls else {})})
            if m.tool_calls:
                msgs.append({"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "age 34"})
            else:
                msgs.append({"role": "user", "content": f"And now ({turn})?"})
        return gw.store.end("claude", reward=1.0)
    finally:
        await gw.stop()


async def test_claude_code_shapes_key_alias_clamp_and_system_message(qwen3):
    cfg = GatewayConfig(port=0, api_key="secret-key-1", model_aliases=["claude-*"], max_tokens=64)
    gw, eng = await serve(qwen3, [NO_THINK + "Hi there.<|im_end|>", NO_THINK + "Again.<|im_end|>"], cfg, max_model_len=4096)
    try:
        # the client sends x-api-key, not a bearer token; a set timeout lets it ask for 32,000 without streaming
        c = aclient(gw, "cc", key="secret-key-1", timeout=120)
        msgs = [{"role": "system", "content": "You are Claude Code."}, {"role": "user", "content": "hello"}]
        raw = await c.messages.with_raw_response.create(
            model="claude-sonnet-4-5", max_tokens=32000, messages=msgs, thinking={"type": "disabled"},
            tools=TOOLS + [{"type": "web_search_20250305", "name": "web_search"}])
        r = await raw.parse()
        assert r.model == "claude-sonnet-4-5" and r.content[-1].text.strip() == "Hi there." and r.stop_reason == "end_turn"
        note = raw.headers["x-agentrl-note"]
        assert "max_tokens 32000 clamped" in note and "64" in note and "web_search" in note
        assert eng.calls[0]["params"].max_tokens == 64
        assert "You are Claude Code." in gw.renderer.decode(eng.calls[0]["prompt"])
        # streaming with the clamp: the header comes with the stream
        async with c.messages.stream(model="claude-x", max_tokens=32000, messages=msgs) as s:
            text = "".join([t async for t in s.text_stream])
        assert text.strip() == "Again."
        bad = aclient(gw, "cc", key="wrong-key-99")
        with pytest.raises(anthropic.AuthenticationError) as e:
            await bad.messages.create(model="tiny", max_tokens=5, messages=msgs)
        assert e.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.NotFoundError):
            await c.messages.create(model="gpt-4", max_tokens=5, messages=msgs)
        with pytest.raises(anthropic.BadRequestError) as e:
            await c.messages.create(model="tiny", max_tokens=5, messages=[
                {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}])
        assert "messages[0].content[0].tool_use_id" in e.value.body["error"]["message"]
        assert len(eng.calls) == 2  # refused requests reached no engine
    finally:
        await gw.stop()


async def test_messages_stop_sequence_and_max_tokens(qwen3):
    gw, eng = await serve(qwen3, [NO_THINK + "one two three<|im_end|>"], max_model_len=4096)
    try:
        c = aclient(gw, "stops")
        r = await c.messages.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": "count"}])
        assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 1
        eng.outputs.clear()
        eng.calls.clear()
        async with aiohttp.ClientSession() as h:  # a raw stream: the event names in order
            async with h.post(f"{gw.url}/v1/messages", json={"model": "tiny", "max_tokens": 50, "stream": True,
                                                               "messages": [{"role": "user", "content": "x"}]}) as resp:
                raw = (await resp.read()).decode()
        names = [ln[len("event: "):] for ln in raw.splitlines() if ln.startswith("event: ")]
        assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                         "message_delta", "message_stop"]
        delta = json.loads(raw.split("event: message_delta\ndata: ")[1].split("\n")[0])
        assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] > 0
    finally:
        await gw.stop()


def test_stop_reasons_map_to_anthropic():
    from agentrl.gateway.anthropic import message_body
    from agentrl.gateway.choices import Choice, Completion

    def reply(**kw):
        c = Choice(0, "t", kw.pop("content", "t"), None, kw.pop("calls", []), kw.pop("finish", "stop"), [1], [-0.1],
                   [0], **kw)
        return message_body(Completion("s", 1, [c], 3, False, False), "m")

    assert (reply()["stop_reason"], reply()["stop_sequence"]) == ("end_turn", None)
    assert (reply(stop_sequence="END")["stop_reason"], reply(stop_sequence="END")["stop_sequence"]) == \
        ("stop_sequence", "END")
    assert reply(finish="length")["stop_reason"] == "max_tokens"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    body = reply(content=None, calls=[call], finish="tool_calls")
    assert body["stop_reason"] == "tool_use" and body["content"] == [
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}]
    assert body["usage"] == {"input_tokens": 3, "output_tokens": 1}


async def test_stream_pings_while_sampling_and_errors_as_anthropic_events(qwen3):
    import asyncio

    gate = asyncio.Event()
    gw, eng = await serve(qwen3, [NO_THINK + "ok<|im_end|>"], GatewayConfig(port=0, keepalive_s=0.01),
                          max_model_len=4096)
    inner = eng.generate

    async def gated(*a, **kw):  # the completion waits until the test has seen a keep-alive
        await gate.wait()
        return await inner(*a, **kw)

    eng.generate = gated

    async def until_ping(resp):  # pings come while the engine has nothing yet (message_start may precede them)
        seen = []
        while not seen or not seen[-1].startswith(b"event: ping\n"):
            seen.append(await resp.content.readuntil(b"\n\n"))
        assert not any(b"content_block" in f for f in seen)
        return seen

    try:
        body = {"model": "tiny", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "x"}]}
        async with aiohttp.ClientSession() as h:
            async with h.post(f"{gw.url}/s/ping/v1/messages", json=body) as resp:
                await until_ping(resp)
                gate.set()
                rest = (await resp.read()).decode()
            assert "event: message_stop" in rest
            gate.clear()
            async with h.post(f"{gw.url}/s/ping/v1/messages", json=body) as resp:
                await until_ping(resp)
                gw.store.sessions["ping"].close()  # ended while sampling: the error comes as Anthropic's event
                gate.set()
                rest = (await resp.read()).decode()
        err = json.loads(rest.split("event: error\ndata: ")[1].split("\n")[0])
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert "has ended" in err["error"]["message"]
    finally:
        await gw.stop()
