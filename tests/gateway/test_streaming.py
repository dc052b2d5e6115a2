"""Token-by-token streaming in every dialect against a scripted engine that tells its tokens one at a time and can
be held mid-generation: the official clients' streaming helpers receive the first deltas while the engine is still
held (nothing committed yet), the streamed text equals the whole reply's token for token, an abort-and-resubmit
mid-stream continues the stream, a client that hangs up mid-stream cancels its engine request and leaves the
session as it was, and an engine that fails mid-stream ends the stream with the dialect's error (counted in the
gateway's errors, the session as it was). (The real vLLM engine: tests/gateway/test_gateway_engine.py.)"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest

from agentrl.gateway import GatewayConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chat"))
from chat_tokenizers import qwen_tokenizer, template  # noqa: E402
from test_gateway import ClosingGateway, ScriptEngine, assert_record_is_engine_record, client, tiny_tok  # noqa: E402,F401

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"name": "Ann"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Looks a person up.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]
LONG = "She is thirty-four years old and lives in a small town by the sea, where she keeps bees."


class DripEngine(ScriptEngine):
    """The scripted engine, telling its tokens one at a time; with ``hold_after=k`` the k-th token of the first
    request waits until ``gate`` is set (``held`` is set then); with ``fail_after=k`` the first request raises
    instead of telling its k-th token. ``cancelled`` is set when a held request is cancelled."""

    def __init__(self, *a, hold_after=None, fail_after=None, **kw):
        super().__init__(*a, **kw)
        self.hold_after, self.fail_after = hold_after, fail_after
        self.gate, self.held, self.cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def generate_streaming(self, prompt_ids, params, *, request_id, session_id=None, on_tokens):
        first = not self.calls
        gen = await self.generate(prompt_ids, params, request_id=request_id, session_id=session_id)
        try:
            for k, t in enumerate(gen.token_ids):
                if first and k == self.hold_after:
                    self.held.set()
                    await self.gate.wait()
                if first and k == self.fail_after:  # the engine dies mid-completion: nothing is returned
                    raise RuntimeError("engine died mid-completion")
                on_tokens([t])
                await asyncio.sleep(0)  # a step boundary: the gateway may write between tokens
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return gen


@pytest.fixture(scope="module")
def qwen3():
    return qwen_tokenizer(template("qwen3.jinja"))


async def drip(tok, replies, hold_after=None, keepalive_s=15.0, fail_after=None, **kw):
    eng = DripEngine(tok, replies, hold_after=hold_after, fail_after=fail_after, **kw)
    gw = ClosingGateway(eng, tok, GatewayConfig(port=0, keepalive_s=keepalive_s), model_name="tiny")
    gw.clients = []
    await gw.start()
    return gw, eng


def within(coro, s=60):
    return asyncio.wait_for(coro, s)  # a stream that never comes fails the test instead of hanging it


# ---------------------------------------------------------------------------------------------------- each dialect
async def openai_chat(gw, sid, stream, held):
    c = client(gw, sid)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Who is Ann?"}], tools=TOOLS, max_tokens=200)
    if not stream:
        m = (await c.chat.completions.create(**kw)).choices[0].message
        return m.reasoning_content if hasattr(m, "reasoning_content") else None, m.content or "", \
            [(t.function.name, t.function.arguments) for t in m.tool_calls or []]
    reasoning, content, calls = "", "", []
    async for ch in await c.chat.completions.create(stream=True, **kw):
        for d in ch.choices:
            reasoning += getattr(d.delta, "reasoning_content", None) or ""
            content += d.delta.content or ""
            calls += [(t.function.name, t.function.arguments) for t in d.delta.tool_calls or []]
            if content and held is not None:
                await held(reasoning, content)
                held = None
    return reasoning or None, content, calls


async def anthropic_messages(gw, sid, stream, held):
    c = anthropic.AsyncAnthropic(base_url=f"{gw.url}/s/{sid}", api_key="k", max_retries=0)
    gw.clients.append(c)
    kw = dict(model="tiny", max_tokens=200, messages=[{"role": "user", "content": "Who is Ann?"}],
              tools=[{"name": "lookup", "description": "Looks a person up.",
                      "input_schema": TOOLS[0]["function"]["parameters"]}])
    if not stream:
        r = await c.messages.create(**kw)
    else:
        reasoning, content = "", ""
        async with c.messages.stream(**kw) as s:
            async for ev in s:
                if ev.type == "thinking":
                    reasoning += ev.thinking
                elif ev.type == "text":
                    content += ev.text
                if content and held is not None:
                    await held(reasoning, content)
                    held = None
            r = await s.get_final_message()
        assert "".join(b.text for b in r.content if b.type == "text") == content  # the helper's snapshot agrees
    blocks = {b.type: b for b in r.content}
    return (blocks["thinking"].thinking if "thinking" in blocks else None,
            "".join(b.text for b in r.content if b.type == "text"),
            [(b.name, str(b.input)) for b in r.content if b.type == "tool_use"])


async def openai_responses(gw, sid, stream, held):
    c = openai.AsyncOpenAI(base_url=f"{gw.url}/s/{sid}/v1", api_key="k", max_retries=0)
    gw.clients.append(c)
    kw = dict(model="tiny", input="Who is Ann?", tools=[{"type": "function", **TOOLS[0]["function"]}])
    if not stream:
        r = await c.responses.create(**kw)
    else:
        reasoning, content = "", ""
        async with c.responses.stream(**kw) as s:
            async for ev in s:
                if ev.type == "response.reasoning_summary_text.delta":
                    reasoning += ev.delta
                elif ev.type == "response.output_text.delta":
                    content += ev.delta
                if content and held is not None:
                    await held(reasoning, content)
                    held = None
            r = await s.get_final_response()
        assert r.output_text == content
    summary = [s.text for o in r.output if o.type == "reasoning" for s in o.summary]
    return (summary[0] if summary else None, r.output_text,
            [(o.name, o.arguments) for o in r.output if o.type == "function_call"])


DIALECTS = {"chat": openai_chat, "messages": anthropic_messages, "responses": openai_responses}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("script", ["answer", "think_answer_call"])
async def test_deltas_reach_the_client_while_the_engine_is_held(qwen3, dialect, script):
    """The client holds its first deltas while the engine is held mid-completion (the session has committed
    nothing); the whole stream equals the non-streamed reply; the record is the engine's."""
    reply = {"answer": "<think>\n\n</think>\n\n" + LONG + "<|im_end|>",
             "think_answer_call": "<think>\nLook Ann up first.\n</think>\n\n" + LONG + "\n" + CALL + "<|im_end|>"}[script]
    # held inside the answer's text
    hold = len(qwen3(reply[:reply.index(LONG) + len(LONG) // 2], add_special_tokens=False)["input_ids"])
    gw, eng = await drip(qwen3, [reply], hold_after=hold, max_model_len=4096)
    run = DIALECTS[dialect]
    seen = {}

    async def held(reasoning, content):
        await within(eng.held.wait())
        seen.update(reasoning=reasoning, content=content, committed=gw.store.sessions["live"].requests)
        eng.gate.set()

    try:
        streamed = await within(run(gw, "live", True, held))
        assert seen["committed"] == 0 and seen["content"]  # the first deltas came before the completion did
        assert LONG.startswith(seen["content"].lstrip()) and len(seen["content"].strip()) < len(LONG)
        whole = await within(run(gw, "whole", False, None))
        assert streamed == whole
        assert streamed[1].strip() == LONG and bool(streamed[2]) == (script == "think_answer_call")
        if script == "think_answer_call":
            assert streamed[0].strip() == "Look Ann up first."
        assert "stream_mismatch" not in gw.errors
        for sid in ("live", "whole"):
            assert gw.store.sessions[sid].token_record().token_ids  # both recorded
        a, b = (gw.store.sessions[s].token_record() for s in ("live", "whole"))
        assert (a.token_ids, a.logprobs, a.versions, a.loss_mask) == (b.token_ids, b.logprobs, b.versions, b.loss_mask)
    finally:
        await gw.stop()


# ------------------------------------------------------------------------------- streamed == whole, many shapes
TINY_REPLIES = ["hello there, this is a plain answer<eos>", "  leading spaces, then text  <eos>",
                "Let me look.\n" + CALL + "<eos>", "  spaced before a call \n" + CALL + "<eos>",
                "<tool_call>\n{broken json\n</tool_call> after<eos>", "unicode: naïve café 🎉 done<eos>",
                "cut here STOP and not this<eos>", "no end of sequence, cut by length"]
QWEN_REPLIES = ["<think>\nDone.\n</think>\n\nShe is 34.<|im_end|>", "<think>\n\n</think>\n\nplain<|im_end|>",
                "no think block at all<|im_end|>", "<think>\nhm\n</think>\n\nSure.\n" + CALL + "<|im_end|>",
                "<think>\nunfinished thought", "<think>\nx\n</think>\n\ncut here STOP more<|im_end|>"]


@pytest.mark.parametrize("family", ["tiny", "qwen3"])
async def test_streamed_equals_whole_for_every_shape(tiny_tok, qwen3, family):
    tok, replies = (tiny_tok, TINY_REPLIES) if family == "tiny" else (qwen3, QWEN_REPLIES)
    gw, eng = await drip(tok, replies, max_model_len=4096)
    try:
        for i, _ in enumerate(replies):
            kw = dict(model="tiny", messages=[{"role": "user", "content": f"q{i}"}], tools=TOOLS, max_tokens=24,
                      stop=["STOP"])
            eng.replies = [replies[i]]
            whole = (await client(gw, f"w{i}").chat.completions.create(**kw)).choices[0]
            reasoning, content, calls, finish = "", "", [], None
            async for ch in await client(gw, f"s{i}").chat.completions.create(stream=True, **kw):
                for d in ch.choices:
                    reasoning += getattr(d.delta, "reasoning_content", None) or ""
                    content += d.delta.content or ""
                    calls += [(t.function.name, t.function.arguments) for t in d.delta.tool_calls or []]
                    finish = d.finish_reason or finish
            m = whole.message
            assert (reasoning or None, content, calls, finish) == (
                getattr(m, "reasoning_content", None), m.content or "",
                [(t.function.name, t.function.arguments) for t in m.tool_calls or []], whole.finish_reason), replies[i]
        assert "stream_mismatch" not in gw.errors
        # text completions too
        eng.replies = ["plain text STOP then more<eos>"]
        c = client(gw, "t")
        whole = (await c.completions.create(model="tiny", prompt="abc", max_tokens=20, stop=["STOP"])).choices[0]
        parts = [ch.choices[0].text async for ch in await c.completions.create(model="tiny", prompt="abc",
                                                                              max_tokens=20, stop=["STOP"],
                                                                              stream=True) if ch.choices]
        assert "".join(parts) == whole.text and len([p for p in parts if p]) > 1
    finally:
        await gw.stop()


async def test_abort_and_resubmit_mid_stream_continues_the_stream(tiny_tok):
    """A weight update in abort mode after 3 tokens: the stream goes on with the resubmitted request; the streamed
    text is the whole reply's, and the record holds both versions' tokens."""
    reply = "first part and then the rest of it<eos>"
    texts = []
    for stream in (True, False):
        gw, eng = await drip(tiny_tok, [reply], abort_first=3)
        try:
            c = client(gw, "r")
            kw = dict(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=40)
            if stream:
                chunks = [d.delta.content or "" async for ch in await c.chat.completions.create(stream=True, **kw)
                          for d in ch.choices]
                texts.append("".join(chunks))
                assert len([x for x in chunks if x]) > 3
            else:
                texts.append((await c.chat.completions.create(**kw)).choices[0].message.content)
            traj = gw.store.end("r", reward=1.0)
            assert traj.info["gateway/resubmits"] == 1 and set(traj.versions[traj.prompt_len:]) >= {0, 1}
            assert_record_is_engine_record(traj, eng)
        finally:
            await gw.stop()
    assert texts[0] == texts[1]


async def test_client_hanging_up_mid_stream_cancels_its_request_and_records_nothing(tiny_tok):
    gw, eng = await drip(tiny_tok, ["one two three four five six seven eight<eos>", "again<eos>"], hold_after=3,
                         keepalive_s=0.05)
    try:
        body = {"model": "tiny", "stream": True, "max_tokens": 30, "messages": [{"role": "user", "content": "x"}]}
        async with aiohttp.ClientSession() as h:
            resp = await h.post(f"{gw.url}/s/gone/v1/chat/completions", json=body)
            got = b""
            while b'"content": "one' not in got:
                got += await within(resp.content.readuntil(b"\n\n"))
            await within(eng.held.wait())
            resp.close()  # hang up while the engine is held mid-completion
            await within(eng.cancelled.wait())  # the next keep-alive finds the connection gone: the request is cancelled
        assert gw.errors.get("client_disconnected") == 1
        assert "gone" not in gw.store.sessions  # it served nothing: forgotten, as a failed request leaves it
        eng.gate.set()
        r = await client(gw, "gone").chat.completions.create(model="tiny", max_tokens=30,
                                                             messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "again"
        s = gw.store.sessions["gone"]
        assert s.requests == 1 and not s._live and s.inflight == 0
        rec = s.token_record()
        assert [t for t, m in zip(rec.token_ids, rec.loss_mask) if m] == eng.outputs[-1].token_ids
    finally:
        await gw.stop()


class HoldingEngine(ScriptEngine):
    """The scripted engine whose first whole (not streamed) answer waits until ``gate`` is set (``held`` is set
    then); ``cancelled`` is set when that wait is cancelled."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate, self.held, self.cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        if not self.held.is_set():
            self.held.set()
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return await super().generate(prompt_ids, params, request_id=request_id, session_id=session_id)


@pytest.mark.parametrize("path, body", [
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("messages", {"messages": [{"role": "user", "content": "x"}]}),
])
async def test_client_hanging_up_before_a_whole_answer_cancels_its_request_and_records_nothing(tiny_tok, path, body):
    """A client that hangs up while its non-streamed answer is sampled (a harness's timeout): the engine request is
    cancelled (aiohttp does not cancel the handler, so without the gateway watching the connection the engine would
    go on sampling up to max_tokens for nobody), the hang-up is counted, and the session keeps nothing of it."""
    eng = HoldingEngine(tiny_tok, ["again<eos>"])
    gw = ClosingGateway(eng, tiny_tok, GatewayConfig(port=0), model_name="tiny")
    gw.clients = []
    await gw.start()
    try:
        async with aiohttp.ClientSession() as h:
            post = asyncio.ensure_future(h.post(f"{gw.url}/s/gone/v1/{path}",
                                                json={"model": "tiny", "max_tokens": 30, **body}))
            await within(eng.held.wait())
            post.cancel()  # hang up while the engine is held mid-answer
            await asyncio.gather(post, return_exceptions=True)
        await within(eng.cancelled.wait(), 30)
        assert gw.errors.get("client_disconnected") == 1
        assert "gone" not in gw.store.sessions  # it served nothing: forgotten, as a failed request leaves it
        eng.gate.set()
        r = await client(gw, "gone").chat.completions.create(model="tiny", max_tokens=30,
                                                             messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "again" and len(eng.calls) == 1
        s = gw.store.sessions["gone"]
        assert s.requests == 1 and not s._live and s.inflight == 0
    finally:
        await gw.stop()


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
async def test_engine_failing_mid_stream_ends_it_with_an_error_counted_and_nothing_recorded(tiny_tok, dialect):
    """The engine raises after 3 tokens were streamed: the official client raises the dialect's error mid-stream
    (after the first deltas, so the response had started: HTTP 200), the failure is counted in the gateway's errors
    as a non-streamed one would be (``gateway/errors/server_error``), the session keeps nothing of it (a session that
    served nothing is forgotten), and the same session's next request is recorded alone."""
    gw, eng = await drip(tiny_tok, ["one two three four five six seven<eos>", "again<eos>"], fail_after=3)
    run = DIALECTS[dialect]
    seen = []

    async def held(reasoning, content):
        seen.append(content)

    try:
        with pytest.raises((openai.APIError, anthropic.APIError)) as e:
            await within(run(gw, "cut", True, held))
        assert seen and "one" in seen[0]  # deltas came before the error: it broke a started stream
        assert "engine died mid-completion" in str(e.value)
        assert gw.errors.get("server_error") == 1, gw.errors
        assert "cut" not in gw.store.sessions
        assert (await within(run(gw, "cut", False, None)))[1] == "again"
        s = gw.store.sessions["cut"]
        assert s.requests == 1 and s.stats["sampled_tokens"] == len(eng.outputs[-1].token_ids)
        rec = s.token_record()
        assert [t for t, m in zip(rec.token_ids, rec.loss_mask) if m] == eng.outputs[-1].token_ids
    finally:
        await gw.stop()
