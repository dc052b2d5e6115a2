"""The gateway against a scripted engine: real HTTP (the ``openai`` client and raw aiohttp), the tiny model's real
tokenizer and chat template, and Qwen's real vocabulary and published templates for the native tool-call and
reasoning formats. The scripted engine is the only stand-in (the real-engine tests are in
test_gateway_engine.py); it records every request, so the record can be checked against what it was given.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from agentrl.chat import ChatConfig, ChatRenderer, load_tokenizer
from agentrl.gateway import Gateway, GatewayConfig
from agentrl.inference.base import Generation, InferenceEngine, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chat"))  # the tests run with --import-mode=importlib
from chat_tokenizers import qwen_tokenizer, template  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Looks a person up.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]


class ScriptEngine(InferenceEngine):
    """Answers the i-th request with ``replies[i % len]`` (text, encoded with the tokenizer; ``+eos`` appended when
    it ends with "<eos>"), log-prob ``-0.01·(k+1)`` per token and the current version. Records every request and
    every generation it returned. ``abort_first``: the first request stops after that many tokens with finish
    "abort" and the version moves on (a weight update in abort mode)."""

    def __init__(self, tok, replies, *, max_model_len=512, abort_first=None, delay=0.0):
        self.tok, self.replies, self.max_model_len = tok, replies, max_model_len
        self.abort_first, self.delay = abort_first, delay
        self.calls: list[dict] = []
        self.outputs: list[Generation] = []
        self._version = 0

    def _ids(self, text):
        eos = text.endswith("<eos>")
        ids = self.tok(text.removesuffix("<eos>"), add_special_tokens=False)["input_ids"]
        return ids + ([self.tok.eos_token_id] if eos else [])

    async def generate(self, prompt_ids, params: SamplingParams, *, request_id, session_id=None):
        i = len(self.calls)
        self.calls.append({"prompt": list(prompt_ids), "params": params, "request_id": request_id,
                           "session_id": session_id})
        if self.delay:
            await asyncio.sleep(self.delay)
        out = self._ids(self.replies[i % len(self.replies)])[: params.max_tokens]
        finish = "stop" if out and out[-1] == self.tok.eos_token_id else "length"
        v = self._version
        if self.abort_first is not None and i == 0:
            out, finish = out[: self.abort_first], "abort"
            self._version += 1
        gen = Generation(out, [-0.01 * (k + 1) for k in range(len(out))], [v] * len(out), finish)
        self.outputs.append(gen)
        return gen

    async def update_weights(self, state_dict, version):
        self._version = version

    @property
    def version(self):
        return self._version


@pytest.fixture(scope="module")
def tiny_tok():
    from agentrl.models import ensure_tiny_model

    return load_tokenizer(ensure_tiny_model())


class ClosingGateway(Gateway):
    """Closes the test's OpenAI clients with the server (an unclosed client complains after its loop is gone)."""

    clients: list

    async def stop(self):
        for c in self.clients:
            await c.close()
        await super().stop()


async def serve(tok, replies, cfg=None, **kw):
    eng = ScriptEngine(tok, replies, **kw)
    gw = ClosingGateway(eng, tok, cfg or GatewayConfig(port=0), model_name="tiny")
    gw.clients = []
    await gw.start()
    return gw, eng


def client(gw, session):
    c = openai.AsyncOpenAI(base_url=f"{gw.url}/s/{session}/v1", api_key="unused", max_retries=0)
    gw.clients.append(c)
    return c


def assert_record_is_engine_record(traj, eng):
    """Every token the engine sampled is in the record once, with its log-prob and version (loss mask 1), in the
    order sampled within each segment; every segment is a prompt the engine was given followed by its output."""
    traj.validate()
    sampled = [(t, lp, v) for g in eng.outputs for t, lp, v in zip(g.token_ids, g.logprobs, g.versions)]
    got = [(t, lp, v) for t, m, lp, v in zip(traj.token_ids, traj.loss_mask, traj.logprobs, traj.versions) if m]
    assert sorted(got) == sorted(sampled) and len(got) == len(sampled)
    for a, b in traj.segment_slices():
        seg = traj.token_ids[a:b]
        # the segment's last request: its prompt is a prefix of the segment, its output follows
        assert any(seg[: len(c["prompt"])] == c["prompt"] and
                   seg[len(c["prompt"]): len(c["prompt"]) + len(g.token_ids)] == g.token_ids
                   for c, g in zip(eng.calls, eng.outputs)), "a segment is not a context the engine saw"


async def test_multi_turn_appends_to_one_segment(tiny_tok):
    gw, eng = await serve(tiny_tok, ["hello there<eos>", "second answer<eos>", "third<eos>"])
    try:
        c = client(gw, "s1")
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        for turn in range(3):
            r = await c.chat.completions.create(model="tiny", messages=msgs, max_tokens=16)
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"next {turn}"}]
            assert r.choices[0].finish_reason == "stop"
            assert r.usage.completion_tokens == len(eng.outputs[-1].token_ids)
        assert [x.choices[0].message.content for x in [r]] == ["third"]
        s = gw.store.sessions["s1"]
        assert len(s.segments) == 1 and s.stats["drifts"] == 0 and s.stats["appends"] == 2
        # each request's prompt is the segment's tokens so far (never re-encoded)
        seg = s.segments[0].token_ids
        for call in eng.calls:
            assert seg[: len(call["prompt"])] == call["prompt"]
            assert call["session_id"] == "s1"
        # the last request's prompt + its output + the closing is the whole segment
        closing = gw.renderer.closing_ids
        assert seg == eng.calls[-1]["prompt"] + eng.outputs[-1].token_ids + closing[1:]
        traj = gw.store.end("s1", reward=1.0)
        assert traj.reward == 1.0 and traj.segments == [] and traj.num_turns == 3
        assert_record_is_engine_record(traj, eng)
        assert gw.metrics()["gateway/drift_rate"] == 0.0
    finally:
        await gw.stop()


async def test_history_rewrite_starts_a_segment_with_exactly_what_the_engine_saw(tiny_tok):
    gw, eng = await serve(tiny_tok, ["<think>plan</think>answer one<eos>", "answer two<eos>", "three<eos>"])
    try:
        c = client(gw, "edit")
        msgs = [{"role": "user", "content": "Q1"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs)
        # the harness strips <think> from history (a rewrite of what the model saw)
        msgs += [{"role": "assistant", "content": "answer one"}, {"role": "user", "content": "Q2"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "Q3"}]
        await c.chat.completions.create(model="tiny", messages=msgs)
        s = gw.store.sessions["edit"]
        assert len(s.segments) == 2 and s.stats["drifts"] == 1 and "does not extend" in s.drifts[0]
        assert s.segments[1].token_ids[: len(eng.calls[1]["prompt"])] == eng.calls[1]["prompt"]
        traj = gw.store.end("edit", reward=0.5)
        assert traj.segments == [len(s.segments[0].token_ids), len(s.segments[1].token_ids)]
        assert_record_is_engine_record(traj, eng)
        # the first segment still holds the <think> tokens the model sampled, trained once
        assert traj.token_ids[: traj.segments[0]][-len(eng.outputs[0].token_ids) - 1:-1] == eng.outputs[0].token_ids
        m = gw.metrics()
        assert m["gateway/drift_rate"] == 0.5 and m["gateway/segments_per_session"] == 2.0
    finally:
        await gw.stop()


async def test_n_choices_every_token_trained_once(tiny_tok):
    gw, eng = await serve(tiny_tok, ["first<eos>", "a<eos>", "b<eos>", "c<eos>"])
    try:
        c = client(gw, "n")
        msgs = [{"role": "user", "content": "Q"}]
        r1 = await c.chat.completions.create(model="tiny", messages=msgs)
        msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "more"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs, n=3, seed=7)
        assert [ch.index for ch in r.choices] == [0, 1, 2]
        assert sorted(ch.message.content for ch in r.choices) == ["a", "b", "c"]
        seeds = {call["params"].seed for call in eng.calls[1:]}
        assert len(seeds) == 3  # each choice has its own seed
        # the harness continues the second choice: that segment gets the next turn appended
        msgs += [{"role": "assistant", "content": r.choices[1].message.content}, {"role": "user", "content": "go"}]
        await c.chat.completions.create(model="tiny", messages=msgs)
        s = gw.store.sessions["n"]
        assert len(s.segments) == 3 and s.stats["drifts"] == 0
        traj = gw.store.end("n")
        assert_record_is_engine_record(traj, eng)
        # the copied prefix (first answer) is context in the extra segments: trained once in total
        assert traj.num_generated == sum(len(g.token_ids) for g in eng.outputs)
    finally:
        await gw.stop()


async def test_concurrent_requests_on_one_segment(tiny_tok):
    gw, eng = await serve(tiny_tok, ["first<eos>", "x<eos>", "y<eos>"], delay=0.05)
    try:
        c = client(gw, "cc")
        msgs = [{"role": "user", "content": "Q"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        both = await asyncio.gather(*(c.chat.completions.create(model="tiny", messages=msgs + [
            {"role": "user", "content": q}]) for q in ("left", "right")))
        assert sorted(b.choices[0].message.content for b in both) == ["x", "y"]
        s = gw.store.sessions["cc"]
        assert len(s.segments) == 2 and s.stats["drifts"] == 0  # one grew in place, the other copied the prefix
        traj = gw.store.end("cc")
        assert_record_is_engine_record(traj, eng)
        assert traj.num_generated == sum(len(g.token_ids) for g in eng.outputs)
    finally:
        await gw.stop()


class HangingEngine(ScriptEngine):
    """Generates nothing until its request is aborted (then returns it as aborted, as vLLM does)."""

    def __init__(self, tok):
        super().__init__(tok, ["x<eos>"])
        self.aborted: list[str] = []
        self.waiting: dict[str, asyncio.Event] = {}

    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        self.calls.append({"prompt": list(prompt_ids), "params": params, "request_id": request_id})
        ev = self.waiting[request_id] = asyncio.Event()
        await ev.wait()
        return Generation([], [], [], "abort")

    async def abort(self, request_id):
        self.aborted.append(request_id)
        if request_id in self.waiting:
            self.waiting[request_id].set()


async def test_ending_a_session_aborts_its_engine_requests(tiny_tok):
    eng = HangingEngine(tiny_tok)
    gw = ClosingGateway(eng, tiny_tok, GatewayConfig(port=0), model_name="tiny")
    gw.clients = []
    await gw.start()
    try:
        s, key = gw.open_session("ep")  # an episode's session (the manager cancels it, e.g. for staleness)
        task = asyncio.ensure_future(post(gw, "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "x"}]}, headers={"Authorization": f"Bearer {key}"}))
        for _ in range(500):
            if eng.calls:
                break
            await asyncio.sleep(0.01)
        assert eng.calls and s.inflight == 1
        gw.close_session("ep")
        st, body = await asyncio.wait_for(task, 30)
        assert eng.aborted == [eng.calls[0]["request_id"]] and len(eng.calls) == 1  # aborted, not resubmitted
        assert st == 409 and err(body)["code"] == "session_ended" and s.segments == []
    finally:
        await gw.stop()


async def test_streaming_matches_non_streaming(tiny_tok):
    gw, eng = await serve(tiny_tok, ["streamed text<eos>"])
    try:
        c = client(gw, "st")
        stream = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                 stream=True, stream_options={"include_usage": True})
        parts, finish, used = [], None, None
        async for chunk in stream:
            if chunk.usage:
                used = chunk.usage
            for ch in chunk.choices:
                parts.append(ch.delta.content or "")
                finish = ch.finish_reason or finish
        assert "".join(parts) == "streamed text" and finish == "stop"
        assert used.completion_tokens == len(eng.outputs[0].token_ids)
        r = await client(gw, "st2").completions.create(model="tiny", prompt="abc", max_tokens=5, stream=True)
        text = "".join([ch.text async for chunk in r for ch in chunk.choices])
        assert text == "strea" or text.startswith("stre")
    finally:
        await gw.stop()


async def test_aborted_request_is_resubmitted_and_keeps_versions(tiny_tok):
    gw, eng = await serve(tiny_tok, ["abcdefgh<eos>", "gh<eos>"], abort_first=3)
    try:
        r = await client(gw, "ab").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert len(eng.calls) == 2 and eng.calls[1]["prompt"] == eng.calls[0]["prompt"] + eng.outputs[0].token_ids
        ch = gw.store.sessions["ab"].segments[0]
        gen = [(v, m) for v, m in zip(ch.versions, ch.loss_mask) if m]
        assert [v for v, _ in gen] == [0] * 3 + [1] * len(eng.outputs[1].token_ids)
        assert r.choices[0].finish_reason == "stop"
    finally:
        await gw.stop()


async def test_completions_text_and_token_prompts_append(tiny_tok):
    gw, eng = await serve(tiny_tok, [" world<eos>", " again<eos>"])
    try:
        c = client(gw, "cmp")
        r = await c.completions.create(model="tiny", prompt="hello", max_tokens=8, logprobs=1)
        assert r.choices[0].text == " world"
        assert r.choices[0].logprobs.token_logprobs == eng.outputs[0].logprobs
        seg = gw.store.sessions["cmp"].segments[0]
        r2 = await c.completions.create(model="tiny", prompt=seg.token_ids + [5], max_tokens=8)
        s = gw.store.sessions["cmp"]
        assert len(s.segments) == 1 and eng.calls[1]["prompt"] == eng.calls[0]["prompt"] + eng.outputs[0].token_ids + [5]
        assert r2.choices[0].text == " again"
    finally:
        await gw.stop()


async def post(gw, path, body=None, raw=None, headers=None):
    async with aiohttp.ClientSession() as http:
        data = raw if raw is not None else json.dumps(body)
        async with http.post(gw.url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r:
            return r.status, await r.json()


def err(body):
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    return e


async def test_bad_requests_get_openai_errors_and_leave_the_session_unchanged(tiny_tok):
    cfg = GatewayConfig(port=0, max_request_bytes=4096, max_n=2, max_tokens=32, max_sessions=2)
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=cfg, max_model_len=64)
    try:
        path = "/s/b/v1/chat/completions"
        ok = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
        assert (await post(gw, path, ok))[0] == 200
        before = [list(s.token_ids) for s in gw.store.sessions["b"].segments]
        cases = [
            ({"raw": b"{not json"}, 400, "invalid_json", None),
            ({"raw": b"[1, 2]"}, 400, "invalid_json", None),
            ({"body": {**ok, "model": "gpt-4"}}, 404, "model_not_found", "model"),
            ({"body": {**ok, "messages": []}}, 400, None, "messages"),
            ({"body": {**ok, "messages": [{"role": "wizard", "content": "x"}]}}, 400, None, "messages[0].role"),
            ({"body": {**ok, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}}, 400, None,
             "messages[0].content[0]"),
            ({"body": {**ok, "tools": [{"type": "function", "function": {"name": "bad name!"}}]}}, 400,
             "invalid_tool_schema", "tools[0].function.name"),
            ({"body": {**ok, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}},
             400, "invalid_tool_schema", "tools[0].function.parameters.type"),
            ({"body": {**ok, "tools": "nope"}}, 400, None, "tools"),
            ({"body": {**ok, "max_tokens": -1}}, 400, None, "max_tokens"),
            ({"body": {**ok, "n": 3}}, 400, None, "n"),
            ({"body": {**ok, "temperature": "hot"}}, 400, None, "temperature"),
            ({"body": {**ok, "tool_choice": "required"}}, 400, None, "tool_choice"),
            ({"body": {**ok, "logit_bias": {"1": 5}}}, 400, None, "logit_bias"),
            ({"body": {**ok, "messages": [{"role": "user", "content": "word " * 200}]}}, 400,
             "context_length_exceeded", "messages"),
            ({"raw": b'{"model": "tiny", "messages": [' + b'{"role": "user", "content": "x"},' * 200 + b'{}]}'},
             413, "request_too_large", None),
        ]
        for kw, status, code, param in cases:
            st, body = await post(gw, path, **kw)
            e = err(body)
            assert st == status, (kw, body)
            assert code is None or e["code"] == code, (kw, e)
            assert e["param"] == param, (kw, e)
        assert [list(s.token_ids) for s in gw.store.sessions["b"].segments] == before
        assert len(eng.calls) == 1  # nothing bad reached the engine
        # unknown route, wrong method, bad session id, too many sessions
        assert (await post(gw, "/v1/nothing", ok))[0] == 404
        async with aiohttp.ClientSession() as http:
            async with http.get(gw.url + "/v1/chat/completions") as r:
                assert r.status == 405 and err(await r.json())
        st, body = await post(gw, "/v1/chat/completions", ok, headers={"X-Agentrl-Session": "bad id!"})
        assert st == 400 and err(body)["code"] == "invalid_session"
        assert (await post(gw, "/s/second/v1/chat/completions", ok))[0] == 200
        st, body = await post(gw, "/s/third/v1/chat/completions", ok)
        assert st == 429 and err(body)["code"] == "too_many_sessions"
        # ending: bad reward, unknown session, then a real end
        st, body = await post(gw, "/v1/sessions/b/end", {"reward": "high"})
        assert st == 400 and err(body)["param"] == "reward"
        assert (await post(gw, "/v1/sessions/nope/end", {"reward": 1}))[0] == 404
        st, body = await post(gw, "/v1/sessions/b/end", {"reward": 1, "return_trajectory": True})
        assert st == 200 and body["sampled_tokens"] == len(eng.outputs[0].token_ids)
        assert body["trajectory"]["reward"] == 1.0 and body["trajectory"]["token_ids"] == before[0]
    finally:
        await gw.stop()


async def test_stream_interval_reaches_the_engine_and_a_bad_one_is_named(tiny_tok):
    """``stream_interval`` is the engine's to apply (vLLM's interval; tests/inference/test_engine.py and
    test_gateway_engine.py): the gateway hands it with every request, streamed or not."""
    with pytest.raises(ValueError, match="stream_interval must be >= 1, got 0"):
        GatewayConfig(stream_interval=0).validate()
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, stream_interval=8))
    try:
        c = client(gw, "si")
        kw = dict(model="tiny", messages=[{"role": "user", "content": "x"}])
        await c.chat.completions.create(**kw)
        assert "".join([d.delta.content or "" async for ch in await c.chat.completions.create(stream=True, **kw)
                        for d in ch.choices]) == "ok"
        assert [call["params"].stream_interval for call in eng.calls] == [8, 8]
    finally:
        await gw.stop()


async def test_api_key_and_bind_rules(tiny_tok):
    with pytest.raises(ValueError, match="api_key"):
        GatewayConfig(host="0.0.0.0").validate()
    cfg = GatewayConfig(port=0, api_key="secret-key-123")
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=cfg)
    try:
        ok = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
        for headers in ({}, {"Authorization": "Bearer wrong-key-123"}, {"Authorization": "Bearer secret-key-12"}):
            st, body = await post(gw, "/v1/chat/completions", ok, headers=headers)
            assert st == 401 and err(body)["type"] == "authentication_error"
        st, _ = await post(gw, "/v1/chat/completions", ok, headers={"Authorization": "Bearer secret-key-123:mine"})
        assert st == 200 and "mine" in gw.store.sessions
        # an issued session key reaches its own session only
        s, key = gw.open_session("owned")
        st, _ = await post(gw, "/v1/chat/completions", ok, headers={"Authorization": f"Bearer {key}"})
        assert st == 200 and len(s.segments) == 1
        st, body = await post(gw, "/s/mine/v1/chat/completions", ok, headers={"Authorization": f"Bearer {key}"})
        assert st == 403
        st, body = await post(gw, "/s/owned/v1/chat/completions", ok,
                              headers={"Authorization": "Bearer secret-key-123"})
        assert st == 403  # the server key cannot write into an episode's session either
        gw.close_session("owned")
        st, body = await post(gw, "/v1/chat/completions", ok, headers={"Authorization": f"Bearer {key}"})
        assert st == 401  # revoked with its session
    finally:
        await gw.stop()


async def test_ended_idle_and_shutdown_sessions_are_written(tiny_tok, tmp_path):
    out = tmp_path / "sessions.jsonl"
    cfg = GatewayConfig(port=0, out=str(out))
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=cfg)
    try:
        for sid in ("a", "b", "c"):
            await client(gw, sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": sid}])
        st, _ = await post(gw, "/v1/sessions/a/end", {"reward": 2.5, "info": {"graded": True}})
        assert st == 200
        gw.store.sessions["b"].last_used -= 2 * cfg.session_idle_s  # b idles out; c is live at shutdown
        gw.store.expire_idle()
        assert list(gw.store.sessions) == ["c"]
    finally:
        await gw.stop()
    from agentrl.trajectory import Trajectory

    rows = [Trajectory.from_json(x) for x in out.read_text().splitlines()]
    assert {t.id: t.reward for t in rows} == {"a": 2.5, "b": 0.0, "c": 0.0}
    assert {t.id: t.termination for t in rows}["b"] == "truncated"
    assert all(t.num_generated == len(eng.outputs[0].token_ids) for t in rows)


# -- a family with native tool calls and reasoning (Qwen's real vocabulary and published templates) ----------------
@pytest.fixture(scope="module")
def qwen3():
    return qwen_tokenizer(template("qwen3.jinja"))


@pytest.fixture(scope="module")
def qwen25():
    return qwen_tokenizer(template("qwen2.5-instruct.jinja"))


CALL = '<tool_call>\n{"name": "lookup", "arguments": {"name": "Ann"}}\n</tool_call><|im_end|>'


async def test_native_tool_calls_round_trip_and_append(qwen25):
    gw, eng = await serve(qwen25, [CALL, "Ann is 34.<|im_end|>"], max_model_len=4096)
    try:
        c = client(gw, "t")
        msgs = [{"role": "user", "content": "How old is Ann?"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        call = ch.message.tool_calls[0]
        assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"name": "Ann"}
        # render -> parse round trip: the template's rendering of the returned call parses back to the same call
        r_ = gw.renderer
        hist = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}]
        text = r_.render(gw.store.sessions["t"]._for_template(
            [{"role": m["role"], "content": m["content"] or "", **({"tool_calls": m["tool_calls"]} if "tool_calls" in m else {})}
             for m in hist]), add_generation_prompt=False, tools=TOOLS)
        body = text[text.rfind("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
        turn, _ = r_.read_turn(body, r_.encode(body), TOOLS, seed="x")
        assert [(c_.name, c_.arguments) for c_ in turn.calls] == [("lookup", {"name": "Ann"})]
        msgs += [ch.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "Ann: age 34"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        assert r.choices[0].message.content == "Ann is 34." and not r.choices[0].message.tool_calls
        s = gw.store.sessions["t"]
        assert len(s.segments) == 1 and s.stats["drifts"] == 0 and s.stats["tool_calls"] == 1
        assert_record_is_engine_record(gw.store.end("t"), eng)
    finally:
        await gw.stop()


async def test_reasoning_dropped_by_the_client_is_restored(qwen3):
    think = "<think>\nLook Ann up.\n</think>\n\n" + CALL
    gw, eng = await serve(qwen3, [think, "<think>\nDone.\n</think>\n\nShe is 34.<|im_end|>"], max_model_len=4096)
    try:
        c = client(gw, "q3")
        msgs = [{"role": "user", "content": "How old is Ann?"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        assert m.tool_calls[0].function.name == "lookup" and m.model_extra["reasoning_content"].strip() == "Look Ann up."
        # a plain OpenAI client sends back content and tool calls only: the gateway renders its own record
        msgs += [{"role": "assistant", "content": m.content, "tool_calls": [t.model_dump() for t in m.tool_calls]},
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "Ann: age 34"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        assert r.choices[0].message.content.strip() == "She is 34."  # vLLM's qwen3 parser keeps the newlines
        s = gw.store.sessions["q3"]
        assert s.stats["substituted"] == 1 and len(s.segments) == 1 and s.stats["drifts"] == 0
        assert_record_is_engine_record(gw.store.end("q3"), eng)
    finally:
        await gw.stop()


async def test_malformed_tool_call_is_content_and_counted(qwen25):
    bad_call = '<tool_call>\n{"name": "lookup", "arguments": {"name": \n</tool_call><|im_end|>'
    gw, eng = await serve(qwen25, [bad_call], max_model_len=4096)
    try:
        r = await client(gw, "bad").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "?"}], tools=TOOLS)
        assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"
        assert gw.metrics()["tool/parse_error_rate"] == 1.0
    finally:
        await gw.stop()


def test_cli_refuses_an_open_bind_without_a_key_and_reads_its_config(tmp_path):
    import subprocess

    p = subprocess.run([sys.executable, "-m", "agentrl.cli", "gateway", "--host", "0.0.0.0"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "requires an API key" in p.stderr
    from agentrl.commands.gateway import load_config

    cfg_file = tmp_path / "gw.yaml"
    cfg_file.write_text("model: tiny\ngateway: {port: 0, max_n: 2, chat: {family: auto}}\n")
    args = type("A", (), dict(config=str(cfg_file), set=["gateway.max_sessions=3"], model=None, host=None, port=None,
                              api_key="k" * 12, served_model_name="m", out=None))()
    cfg = load_config(args)
    assert (cfg.gateway.max_n, cfg.gateway.max_sessions, cfg.gateway.api_key, cfg.gateway.model_name) == \
        (2, 3, "k" * 12, "m")
    args.set = ["gateway.max_nn=3"]
    with pytest.raises(Exception, match="max_nn"):
        load_config(args)


def test_the_operator_is_told_when_the_model_takes_longer_prompts_than_the_engine_serves(tmp_path):
    """A 64k model behind the default engine (2,048) answered every harness with context_length_exceeded and the
    operator had nothing to go on."""
    from agentrl.commands.gateway import context_note

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 65536}))
    note = context_note(str(tmp_path), 2048)
    assert note is not None and "max_model_len=2048" in note and "--set engine.max_model_len=65536" in note
    assert context_note(str(tmp_path), 65536) is None
    (tmp_path / "config.json").write_text("[not a config")
    assert context_note(str(tmp_path), 2048) is None
    assert context_note(str(tmp_path / "missing"), 2048) is None


# -- every family's own tool-call syntax, through the openai client -------------------------------------------------
@pytest.mark.parametrize("case", ["llama3", "mistral", "deepseek-v3.1", "glm-4.5", "gpt-oss"])
async def test_family_tool_calls_come_back_openai_style_and_round_trip(case):
    """The model writes a call in its family's syntax; the client gets it as an OpenAI tool call, sends it back
    (as plain clients do: content and calls only), and the template's rendering of it parses back to the same call;
    every sampled token is recorded once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chat"))
    from test_chat_families import CASES, OUT, TOOLS as CALC, tokenizer

    tok = tokenizer(case)
    replies = OUT[case]()[0][:2]  # a call for 2+3, then the answer
    cfg = GatewayConfig(port=0, chat=ChatConfig(**CASES[case][1]))
    gw, eng = await serve(tok, replies, cfg=cfg, max_model_len=8192)
    try:
        c = client(gw, case)
        msgs = [{"role": "system", "content": "You are a careful calculator agent."},
                {"role": "user", "content": "What is 2+3?"}]
        r = await c.chat.completions.create(model="tiny", messages=msgs, tools=CALC)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in ch.message.tool_calls]
        assert calls == [("calculator", {"expression": "2+3"})] and ch.message.tool_calls[0].id
        back = {"role": "assistant", "content": ch.message.content,
                "tool_calls": [t.model_dump() for t in ch.message.tool_calls]}
        # render -> parse: the template's rendering of the call the client sends back reads back unchanged
        s = gw.store.sessions[case]
        r_ = gw.renderer
        hist = s._for_template([dict(m) for m in msgs[1:]] + [dict(back)])
        prompt = r_.render(hist[:1], add_generation_prompt=True, tools=CALC)
        full = r_.render(hist, add_generation_prompt=False, tools=CALC)
        n = next(i for i, (a, b) in enumerate(zip(prompt, full)) if a != b) if not full.startswith(prompt) \
            else len(prompt)
        turn, _ = r_.read_turn(prompt[n:] + full[n:], r_.encode(full[n:]), CALC, seed="rt")
        assert [(x.name, x.arguments) for x in turn.calls] == calls
        msgs += [back, {"role": "tool", "tool_call_id": ch.message.tool_calls[0].id, "content": "5"}]
        before = s.stats["substituted"]
        r = await c.chat.completions.create(model="tiny", messages=msgs, tools=CALC)
        assert "5" in (r.choices[0].message.content or "") and not r.choices[0].message.tool_calls
        assert s.stats["substituted"] == before + 1 and s.stats["tool_calls"] == 1 and s.stats["parse_errors"] == 0
        if case == "llama3":  # prefix-stable: one segment
            assert len(s.segments) == 1
        assert_record_is_engine_record(gw.store.end(case), eng)
    finally:
        await gw.stop()


async def test_max_tokens_over_the_cap_is_clamped_and_said_in_every_route(tiny_tok):
    """Harnesses ask for 32,000 tokens by default: chat and text completions lower it to the gateway's cap (as the
    Messages and Responses routes do) and say so in X-Agentrl-Note, instead of refusing the request."""
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, max_tokens=32), max_model_len=256)
    try:
        async with aiohttp.ClientSession() as http:
            for path, body in (("/s/c/v1/chat/completions", {"model": "tiny", "messages": [
                                   {"role": "user", "content": "x"}], "max_tokens": 32000}),
                               ("/s/d/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 32000})):
                async with http.post(gw.url + path, json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    assert "max_tokens 32000 clamped to this gateway's limit of 32" in resp.headers["X-Agentrl-Note"]
        assert [c["params"].max_tokens <= 32 for c in eng.calls] == [True, True]
    finally:
        await gw.stop()



async def test_a_dead_engine_is_a_503_everywhere_and_ends_the_command_line_server(tiny_tok, tmp_path):
    """A killed engine core left /health answering 200 "ok" while every request failed with a 500, forever: a
    supervisor saw nothing wrong. Now /health and every request answer 503 ``engine_dead``, and ``agentrl gateway``
    exits 1 with its live sessions written, as vLLM's own server exits."""
    import socket

    import aiohttp

    from agentrl.commands.gateway import GatewayRunConfig, serve as serve_command

    class DyingEngine(ScriptEngine):
        why = None
        die_next = False

        def dead(self):
            return self.why

        async def generate(self, prompt_ids, params, *, request_id, session_id=None):
            if self.die_next:
                self.why = "the vLLM engine core exited"
            if self.why:
                raise RuntimeError("EngineDeadError('EngineCore encountered an issue')")
            return await super().generate(prompt_ids, params, request_id=request_id, session_id=session_id)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    eng = DyingEngine(tiny_tok, ["Hello there<eos>"])
    out = tmp_path / "sessions.jsonl"
    server = asyncio.ensure_future(serve_command(GatewayRunConfig(gateway=GatewayConfig(port=port, out=str(out))),
                                                 asyncio.Event(), engine=eng))
    base = f"http://127.0.0.1:{port}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(base + "/health") as r:
                    assert r.status == 200
                    break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
        async with http.post(base + "/s/a/v1/chat/completions", json=body) as r:
            assert r.status == 200
        eng.die_next = True  # dies under a streamed request: its stream ends in an engine_dead error event
        async with http.post(base + "/s/b/v1/chat/completions", json={**body, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in (await r.text()).splitlines()
                      if line.startswith("data: {")]
            assert events[-1]["error"]["code"] == "engine_dead"
        eng.why = None  # alive again, to die under a plain request: a 503, not the 500 of other failures
        async with http.post(base + "/s/b2/v1/chat/completions", json=body) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "engine_dead"
        for stream in (False, True):  # then every request is refused before it reaches the engine
            async with http.post(base + "/s/c/v1/chat/completions", json={**body, "stream": stream}) as r:
                err = (await r.json())["error"]
                assert r.status == 503 and err["code"] == "engine_dead" and "engine core exited" in err["message"]
        async with http.get(base + "/health") as r:
            assert r.status == 503 and (await r.json())["reason"] == "the vLLM engine core exited"
    assert await asyncio.wait_for(server, 30) == 1  # the server stopped by itself
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a"] and rows[0]["termination"] == "truncated"
