"""The gateway against hostile clients (issue 34): foreign Host headers (DNS rebinding), cross-site requests,
credentials as identifiers, revoked keys, a render that blocks, failing requests, slow clients, hostile ``end``
bodies and hostile JSON. Real HTTP against the gateway with the tiny model's tokenizer and the scripted engine of
test_gateway.py; slow clients are raw sockets. The browser-level checks are in test_browser_security.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import sys
import threading
from pathlib import Path

import aiohttp
import pytest

from agentrl.chat import ChatConfig, ChatRenderer
from agentrl.gateway import GatewayConfig
from agentrl.gateway.store import INLINE_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
from test_gateway import ClosingGateway, ScriptEngine, err, post, serve, tiny_tok  # noqa: E402,F401

OK = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
# a request too large to be rendered on the event loop (store.INLINE_BYTES): it goes to the render thread
BIG = {"model": "tiny", "messages": [{"role": "user", "content": "the " * (INLINE_BYTES // 4 + 1)}]}  # ~1k tokens


async def request(gw, method, path, *, data=None, headers=None):
    async with aiohttp.ClientSession() as http:
        async with http.request(method, gw.url + path, data=data, headers=headers or {}) as r:
            return r.status, await r.json(content_type=None)


async def raw(gw, data: bytes, *, read: bool = True, timeout: float = 20) -> bytes:
    """Sends ``data`` on a fresh connection and returns everything the server sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout) if read else b""
    finally:
        writer.close()


async def test_a_foreign_host_header_is_refused(tiny_tok):
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 sends its own name as Host."""
    gw, eng = await serve(tiny_tok, ["ok<eos>"])
    try:
        await post(gw, "/s/victim/v1/chat/completions", OK)
        for host in (f"evil.test:{gw.port}", "evil.test", f"127.0.0.1.evil.test:{gw.port}", f"localhost:{gw.port + 1}"):
            st, body = await request(gw, "GET", "/v1/sessions", headers={"Host": host})
            assert st == 421 and err(body)["code"] == "misdirected_request", host
            st, body = await request(gw, "POST", "/v1/sessions/victim/end", data=json.dumps({"reward": 1}),
                                     headers={"Host": host, "Content-Type": "application/json"})
            assert st == 421, host
        assert "victim" in gw.store.sessions
        for host in (f"127.0.0.1:{gw.port}", f"localhost:{gw.port}", f"LOCALHOST:{gw.port}"):
            assert (await request(gw, "GET", "/v1/sessions", headers={"Host": host}))[0] == 200, host
    finally:
        await gw.stop()
    # configurable: a name the operator serves the gateway under
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, allowed_hosts=["gw.example"]))
    try:
        assert (await request(gw, "GET", "/health", headers={"Host": f"gw.example:{gw.port}"}))[0] == 200
        assert (await request(gw, "GET", "/health", headers={"Host": f"127.0.0.1:{gw.port}"}))[0] == 421
    finally:
        await gw.stop()
    # the command line adds names to the default
    import argparse

    from agentrl.commands.gateway import load_config

    args = argparse.Namespace(set=[], config=None, model=None, host=None, port=None, api_key=None,
                              served_model_name=None, out=None, allowed_host=["gw.example"])
    assert load_config(args).gateway.allowed_hosts == ["localhost", "127.0.0.1", "::1", "gw.example"]


async def test_cross_site_requests_are_refused(tiny_tok):
    """CORS "simple" requests (no preflight): text/plain bodies, no body, or a foreign Origin."""
    gw, eng = await serve(tiny_tok, ["ok<eos>"])
    try:
        await post(gw, "/s/victim/v1/chat/completions", OK)
        body = json.dumps(OK)
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"Content-Type": ctype} if ctype else {}
            st, out = await request(gw, "POST", "/s/attacker/v1/chat/completions", data=body.encode(), headers=headers)
            assert st == 415 and err(out)["code"] == "unsupported_media_type", ctype
            st, out = await request(gw, "POST", "/v1/sessions/victim/end", data=b'{"reward": 1e300}', headers=headers)
            assert st == 415, ctype
        st, out = await request(gw, "POST", "/v1/sessions/victim/end")  # no body at all
        assert st == 415
        st, out = await request(gw, "POST", "/s/attacker/v1/chat/completions", data=body,
                                headers={"Content-Type": "application/json", "Origin": "http://evil.test"})
        assert st == 403 and err(out)["code"] == "origin_not_allowed"
        st, out = await request(gw, "GET", "/v1/sessions", headers={"Origin": "null"})
        assert st == 403
        assert set(gw.store.sessions) == {"victim"} and len(eng.calls) == 1
    finally:
        await gw.stop()
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, allowed_origins=["http://app.example"]))
    try:
        async with aiohttp.ClientSession() as http:  # the listed origin's page: preflight, then the request
            async with http.options(gw.url + "/s/web/v1/chat/completions", headers={
                    "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type, authorization"}) as r:
                assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"
                assert "Content-Type" in r.headers["Access-Control-Allow-Headers"]
            async with http.post(gw.url + "/s/web/v1/chat/completions", data=json.dumps(OK), headers={
                    "Content-Type": "application/json", "Origin": "http://app.example"}) as r:
                assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"
            async with http.options(gw.url + "/s/web/v1/chat/completions", headers={"Origin": "http://evil.test"}) as r:
                assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
    finally:
        await gw.stop()


async def test_a_credential_is_never_a_session_id_and_revoked_keys_are_refused(tiny_tok, tmp_path):
    out = tmp_path / "s.jsonl"
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, out=str(out)))  # no server key
    try:
        secret = "sk-proj-DO-NOT-LEAK-1234567890"
        st, _ = await post(gw, "/v1/chat/completions", OK, headers={"Authorization": f"Bearer {secret}"})
        assert st == 200
        assert all(secret not in sid for sid in gw.store.sessions)
        st, listed = await request(gw, "GET", "/v1/sessions")
        assert secret not in json.dumps(listed)
        await gw.stop()
        assert secret not in out.read_text()
        await gw.start()
        s, key = gw.open_session("episode")
        assert (await post(gw, "/v1/chat/completions", OK, headers={"Authorization": f"Bearer {key}"}))[0] == 200
        gw.close_session("episode")
        calls = len(eng.calls)
        for _ in range(3):
            st, body = await post(gw, "/v1/chat/completions", OK, headers={"Authorization": f"Bearer {key}"})
            assert st == 401 and err(body)["code"] == "invalid_api_key"
        assert len(eng.calls) == calls and "episode" not in gw.store.sessions
    finally:
        await gw.stop()


class BlockingRenderer(ChatRenderer):
    """Renders normally, but the first render waits for ``gate`` (at most 10 s): a huge request's template."""

    def __init__(self, tok):
        super().__init__(tok, ChatConfig())
        self.started, self.gate = threading.Event(), threading.Event()
        self.finished = False
        self.blocking = True

    def render(self, messages, **kw):
        if self.blocking:
            self.blocking = False
            self.started.set()
            self.gate.wait(10)
            self.finished = True
        return super().render(messages, **kw)


async def test_rendering_runs_off_the_event_loop(tiny_tok):
    r = BlockingRenderer(tiny_tok)
    gw = ClosingGateway(ScriptEngine(tiny_tok, ["ok<eos>"], max_model_len=2048), renderer=r, cfg=GatewayConfig(port=0),
                        model_name="tiny")
    gw.clients = []
    await gw.start()
    try:
        slow = asyncio.ensure_future(post(gw, "/s/big/v1/chat/completions", BIG))
        assert await asyncio.to_thread(r.started.wait, 30)
        st, _ = await request(gw, "GET", "/health")  # served while the render is still running
        finished_first = r.finished
        r.gate.set()
        assert st == 200 and not finished_first
        assert (await slow)[0] == 200
    finally:
        r.gate.set()
        await gw.stop()


class ThreadRecordingRenderer(BlockingRenderer):
    """A :class:`BlockingRenderer` that records the thread of every render of a request's messages (not the
    renderer's own probe conversations) and how many ran at once."""

    def __init__(self, tok, blocking: bool):
        super().__init__(tok)
        self.blocking, self.threads, self.now, self.most = blocking, [], 0, 0
        self.lock = threading.Lock()

    def render(self, messages, **kw):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            if messages[0]["content"] in ("x", BIG["messages"][0]["content"]):
                self.threads.append(threading.current_thread().name)
        try:
            return super().render(messages, **kw)
        finally:
            with self.lock:
                self.now -= 1


async def recording_gateway(tok, blocking: bool):
    r = ThreadRecordingRenderer(tok, blocking)
    gw = ClosingGateway(ScriptEngine(tok, ["ok<eos>", "ok<eos>"], max_model_len=2048), renderer=r,
                        cfg=GatewayConfig(port=0), model_name="tiny")
    gw.clients = []
    await gw.start()
    return r, gw


async def test_small_requests_render_on_the_loop_large_ones_in_the_thread(tiny_tok):
    r, gw = await recording_gateway(tiny_tok, blocking=False)
    try:
        assert (await post(gw, "/s/a/v1/chat/completions", OK))[0] == 200
        assert (await post(gw, "/s/b/v1/chat/completions", BIG))[0] == 200
        assert r.threads[0] == threading.current_thread().name  # the event loop's
        assert r.threads[1].startswith("agentrl-gateway-render")
    finally:
        await gw.stop()


async def test_a_compressed_body_is_sized_as_read_not_by_its_content_length(tiny_tok):
    """A gzip body a few hundred bytes long that inflates past INLINE_BYTES is rendered in the thread: the loop is
    never handed a large render by a small Content-Length."""
    r, gw = await recording_gateway(tiny_tok, blocking=False)
    try:
        packed = gzip.compress(json.dumps(BIG).encode())
        assert len(packed) < INLINE_BYTES
        st, _ = await post(gw, "/s/z/v1/chat/completions", raw=packed, headers={"Content-Encoding": "gzip"})
        assert st == 200 and r.threads == [r.threads[0]] and r.threads[0].startswith("agentrl-gateway-render")
    finally:
        await gw.stop()


async def test_a_small_request_waits_for_the_render_thread_when_it_is_busy(tiny_tok):
    """The tokenizer is never used by two threads at once: while a large render holds the worker thread, a small
    request is queued behind it, not rendered on the loop."""
    r, gw = await recording_gateway(tiny_tok, blocking=True)
    try:
        big = asyncio.ensure_future(post(gw, "/s/big/v1/chat/completions", BIG))
        assert await asyncio.to_thread(r.started.wait, 30)
        small = asyncio.ensure_future(post(gw, "/s/small/v1/chat/completions", OK))
        for _ in range(3000):  # until the small request has been handed to the worker (its render is queued)
            if sum(not f.done() for f in gw.store._running) == 2 or small.done():
                break
            await asyncio.sleep(0.01)
        assert not small.done() and len(r.threads) == 1
        r.gate.set()
        assert (await big)[0] == 200 and (await small)[0] == 200
        assert r.most == 1 and all(t.startswith("agentrl-gateway-render") for t in r.threads)
    finally:
        r.gate.set()
        await gw.stop()


async def test_rendering_is_bounded_in_time(tiny_tok):
    r = BlockingRenderer(tiny_tok)
    gw = ClosingGateway(ScriptEngine(tiny_tok, ["ok<eos>"], max_model_len=2048), renderer=r, model_name="tiny",
                        cfg=GatewayConfig(port=0, render_timeout_s=0.5))
    gw.clients = []
    await gw.start()
    try:
        st, body = await post(gw, "/s/big/v1/chat/completions", BIG)
        finished = r.finished
        r.gate.set()
        assert st == 503 and err(body)["code"] == "render_timeout" and not finished
        assert "big" not in gw.store.sessions
    finally:
        r.gate.set()
        await gw.stop()


async def test_failing_requests_create_no_sessions(tiny_tok):
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, max_sessions=2, max_tokens=8),
                          max_model_len=64)
    try:
        for i in range(5):
            st, _ = await post(gw, f"/s/f{i}/v1/chat/completions", {**OK, "temperature": "hot"})
            assert st == 400
            st, _ = await post(gw, f"/s/g{i}/v1/chat/completions", {**OK, "messages": [
                {"role": "user", "content": "word " * 200}]})
            assert st == 400
        assert gw.store.sessions == {} and gw.metrics()["gateway/sessions_started"] == 0
        assert (await post(gw, "/s/a/v1/chat/completions", OK))[0] == 200
        assert (await post(gw, "/s/b/v1/chat/completions", OK))[0] == 200
        # a failing request on a live session leaves it live
        assert (await post(gw, "/s/a/v1/chat/completions", {**OK, "temperature": "hot"}))[0] == 400
        assert set(gw.store.sessions) == {"a", "b"}
    finally:
        await gw.stop()


async def test_slow_and_idle_connections_are_closed(tiny_tok):
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, idle_timeout_s=0.5, body_timeout_s=0.5))
    try:
        # partial headers, never finished: closed without a response
        assert await raw(gw, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ") == b""
        # a connection that sends nothing
        assert await raw(gw, b"") == b""
        # a body that never arrives: 408
        head = (f"POST /s/slow/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
        got = await raw(gw, head + b'{"model": ')
        assert got.startswith(b"HTTP/1.1 408") and b"body_timeout" in got
        # an idle keep-alive connection after a complete request
        got = await raw(gw, f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n\r\n".encode())
        assert got.startswith(b"HTTP/1.1 200")
        assert "slow" not in gw.store.sessions
    finally:
        await gw.stop()


def nested(depth: int) -> dict:
    x: dict = {}
    for _ in range(depth):
        x = {"a": x}
    return x


async def test_end_validates_before_removing_the_session(tiny_tok, tmp_path):
    out = tmp_path / "s.jsonl"
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, out=str(out)))
    try:
        assert (await post(gw, "/s/s1/v1/chat/completions", OK))[0] == 200
        bad_infos = [nested(600), {"score": float("nan")}, {"gateway/requests": 0}, {"gateway/drift_rate": 9},
                     ["a"], 0, "text"]
        for info in bad_infos:
            st, body = await post(gw, "/v1/sessions/s1/end", {"reward": 1, "info": info})
            assert st == 400 and err(body)["param"] == "info", info
        for raw_reward in (b"1" + b"0" * 400, b"1e400", b"-1e400", b"1e308", b"-1e308", b"NaN"):
            st, body = await post(gw, "/v1/sessions/s1/end", raw=b'{"reward": ' + raw_reward + b"}")
            assert st == 400 and err(body)["param"] == "reward", raw_reward
        assert "s1" in gw.store.sessions and not out.exists() or out.read_text() == ""
        st, body = await post(gw, "/v1/sessions/s1/end", {"reward": 1, "info": {"score": 0.5}})
        assert st == 200
        line = out.read_text().splitlines()[0]
        traj = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSONL"))
        assert traj["info"]["score"] == 0.5 and traj["info"]["gateway/requests"] == 1
    finally:
        await gw.stop()


async def test_hostile_json_and_ids_get_400_not_500(tiny_tok):
    gw, eng = await serve(tiny_tok, ["ok<eos>"])
    try:
        path = "/s/h/v1/chat/completions"
        for raw_body in (b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
                         b'{"model": "tiny", "seed": ' + b"9" * 5000 + b"}"):
            st, body = await post(gw, path, raw=raw_body)
            assert st == 400 and err(body)["code"] == "invalid_json", raw_body[:20]
        st, body = await post(gw, "/s/nl%0A/v1/chat/completions", OK)
        assert st == 400 and err(body)["code"] == "invalid_session"
        got = await raw(gw, (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n"
                             f"Content-Type: application/json\r\nAuthorization: Bearer \xff\xfe-key\r\n"
                             f"Connection: close\r\nContent-Length: {len(json.dumps(OK))}\r\n\r\n").encode("latin-1")
                        + json.dumps(OK).encode())
        assert got.startswith(b"HTTP/1.1 401"), got[:200]
        assert "server_error" not in gw.errors and gw.store.sessions == {}
    finally:
        await gw.stop()


async def test_a_client_hang_up_is_not_a_server_error(tiny_tok, caplog):
    gw, eng = await serve(tiny_tok, ["ok<eos>"])
    try:
        with caplog.at_level(logging.DEBUG, logger="agentrl.gateway"):
            head = (f"POST /s/gone/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
            await raw(gw, head + b'{"model": ', read=False)  # and hangs up
            for _ in range(2000):  # the handler notices the closed connection
                if gw.errors:
                    break
                await asyncio.sleep(0.005)
        assert gw.errors == {"client_disconnected": 1}
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    finally:
        await gw.stop()


LONE = "@LONE@"  # replaced in the raw body by the JSON escape \ud800: valid JSON, a lone surrogate, not Unicode text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body,where", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
    ("/v1/completions", {"prompt": "ok " + LONE}, "prompt"),
    ("/v1/messages", {"max_tokens": 8, "system": [{"type": "text", "text": LONE}],
                      "messages": [{"role": "user", "content": "x"}]}, "system[0].text"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a" + LONE}]}]},
     "input[0].content[0].text"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {LONE: {"type": "string"}}}}]}, "tools[0].parameters.properties"),
])
async def test_a_lone_surrogate_anywhere_in_a_request_is_a_400_that_says_where(tiny_tok, path, body, where, stream):
    """JSON lets a string hold ``\\ud800`` alone; it is no Unicode text, and the tokenizer raised on it (a 500 in
    every dialect). A surrogate pair (an emoji) is text and goes through."""
    gw, eng = await serve(tiny_tok, ["ok<eos>"])
    try:
        raw_body = json.dumps({"model": "tiny", "stream": stream, **body}).replace(LONE, "\\ud800").encode()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gw.url}/s/u{path}", data=raw_body,
                                 headers={"Content-Type": "application/json"}) as r:
                st, text = r.status, await r.text()
            assert st == 400, text
            assert where in text and "surrogate" in text, text
            ok = json.dumps({"model": "tiny", "stream": False, **body}).replace(LONE, "\\ud83d\\ude00").encode()
            async with http.post(f"{gw.url}/s/u{path}", data=ok, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, await r.text()
        assert "server_error" not in gw.errors
    finally:
        await gw.stop()


@pytest.mark.parametrize("bad_value", [-1, 1.5, True, "text"])
@pytest.mark.parametrize("body,where", [
    ({"input": [{"role": "user", "content": "x"}, {"type": "reasoning", "summary": "@"}]}, "input[1].summary"),
    ({"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": "@"}]}, "tools[0].tools"),
])
async def test_responses_lists_of_the_wrong_type_are_400_not_500(tiny_tok, body, where, bad_value):
    gw, eng = await serve(tiny_tok, ["ok<eos>"])
    try:
        raw_body = json.dumps({"model": "tiny", **body}).replace('"@"', json.dumps(bad_value)).encode()
        st, got = await post(gw, "/s/r/v1/responses", raw=raw_body)
        assert st == 400 and err(got)["param"] == where, got
        assert "server_error" not in gw.errors
    finally:
        await gw.stop()


async def test_completions_token_ids_past_the_vocabulary_or_any_integer_type_are_400_not_500(tiny_tok):
    """A token id too large for the tokenizer's integer type raised OverflowError while the prompt was planned."""
    gw, eng = await serve(tiny_tok, ["ok<eos>"])
    try:
        for ids in ([10**12], [2**63], [1, len(tiny_tok)], [-1], [True]):
            st, got = await post(gw, "/s/t/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": 4})
            assert st == 400 and err(got)["param"] == "prompt", (ids, got)
        st, got = await post(gw, "/s/t/v1/completions", {"model": "tiny", "prompt": [1, 2], "max_tokens": 4})
        assert st == 200, got
        assert "server_error" not in gw.errors
    finally:
        await gw.stop()


DEEP = "[" * 100_000  # json.loads raises RecursionError on it, which is no JSONDecodeError


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_call_arguments_too_deep_for_json_are_a_parse_error_not_a_500(tiny_tok, stream):
    """The model's call with such arguments (a tiny model writes anything) is the turn's parse error, and a client's
    history holding such arguments is served: no dialect answers 500."""
    calls = ['<tool_call>{"name": "f", "arguments": ' + DEEP + "}</tool_call><eos>",
             '<tool_call>{"name": "f", "arguments": "' + DEEP + '"}</tool_call><eos>']
    gw, eng = await serve(tiny_tok, calls, max_model_len=200_000)
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": DEEP}}]},
               {"role": "tool", "tool_call_id": "1", "content": "r"}]
    try:
        for i, (path, body) in enumerate([("/v1/chat/completions", {"messages": history}),
                                          ("/v1/chat/completions", {"messages": history[:1]}),
                                          ("/v1/messages", {"max_tokens": 8, "messages": history[:1]}),
                                          ("/v1/responses", {"input": "x"})]):
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{gw.url}/s/d{i}{path}", json={"model": "tiny", "stream": stream, **body}) as r:
                    text = await r.text()
                    assert r.status == 200 and "internal error" not in text, (path, text[:300])
        assert "server_error" not in gw.errors
    finally:
        await gw.stop()
