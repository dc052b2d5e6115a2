"""Hosted-model policies (agentrl.eval.hosted): an OpenAI-compatible chat API acting in agentrl's envs.

Against a scripted chat-completions server on loopback (what a hosted API answers, including its failures), and
against vLLM's own OpenAI-compatible server (``vllm serve``, a server agentrl did not write) through
``agentrl eval --policy openai-chat``."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from agentrl.eval.hosted import HostedAPIError, HostedChatPolicy, HostedConfig, SpendLimit
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import EpisodeMeta
from agentrl.testing.vllm_server import vllm_server

ROOT = Path(__file__).resolve().parents[2]


class FakeAPI:
    """A chat-completions server that answers from a script: each entry is ``(status, body)``; requests are kept."""

    def __init__(self, script):
        self.script, self.requests = list(script), []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append({"auth": request.headers.get("Authorization"), "body": await request.json(),
                              "at": asyncio.get_running_loop().time()})
        status, body, *headers = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return web.json_response(body, status=status, headers=headers[0] if headers else None)

    async def __aenter__(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def reply(content="", calls=None, prompt=10, completion=5):
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    return 200, {"choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}],
                 "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def call(name, args, cid="c1"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def test_native_tool_calls_reach_the_env_and_its_answers_go_back_with_their_call_ids(monkeypatch):
    monkeypatch.setenv("TEST_HOSTED_KEY", "sk-test")
    async with FakeAPI([reply("", [call("lookup", {"name": "ada"})]), reply("The answer is 7.")]) as api:
        pol = HostedChatPolicy(HostedConfig(api.url, "m", api_key_env="TEST_HOSTED_KEY", backoff_s=0))
        meta = EpisodeMeta("t0", "g0", "env", 0)
        meta.tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        s = pol.session(meta)
        a1 = await s.act([{"role": "user", "content": "How old is Ada?"}])
        assert '"name": "lookup"' in a1.text and '"arguments": {"name": "ada"}' in a1.text
        assert a1.tool_calls[0]["id"] == "c1"
        a2 = await s.act([{"role": "tool", "content": "age 7"}])
        assert a2.text == "The answer is 7."
        await pol.aclose()
    first, second = api.requests
    assert first["auth"] == "Bearer sk-test" and first["body"]["tools"] == meta.tools
    assert second["body"]["messages"][-1] == {"role": "tool", "content": "age 7", "tool_call_id": "c1"}
    assert second["body"]["messages"][-2]["tool_calls"][0]["function"]["name"] == "lookup"
    assert pol.usage == {"prompt_tokens": 20, "completion_tokens": 10, "requests": 2, "retries": 0}
    rec = s.token_record()
    assert rec.token_ids == [] and rec.info["text_level"] is True


async def test_rate_limits_and_server_errors_are_retried_then_given_up():
    async with FakeAPI([(429, {"error": "slow down"}), (503, {"error": "busy"}), reply("ok")]) as api:
        pol = HostedChatPolicy(HostedConfig(api.url, "m", backoff_s=0.01, retries=3))
        a = await pol.session(EpisodeMeta("t", "g", "e", 0)).act([{"role": "user", "content": "hi"}])
        assert a.text == "ok" and pol.usage["retries"] == 2
        await pol.aclose()
    async with FakeAPI([(500, {"error": "down"})]) as api:
        pol = HostedChatPolicy(HostedConfig(api.url, "m", backoff_s=0.01, retries=2))
        with pytest.raises(HostedAPIError, match="gave up after 3 attempts .*HTTP 500"):
            await pol.session(EpisodeMeta("t", "g", "e", 0)).act([{"role": "user", "content": "hi"}])
        await pol.aclose()
    assert len(api.requests) == 3


async def test_a_rate_limit_waits_as_long_as_its_retry_after_asks():
    # Hosted APIs say how long to wait; retrying sooner (backoff_s=0 here) spends the retries while still limited.
    for wait in ({"Retry-After": "1"}, {"retry-after-ms": "1000"}):
        async with FakeAPI([(429, {"error": "slow down"}, wait), reply("ok")]) as api:
            pol = HostedChatPolicy(HostedConfig(api.url, "m", backoff_s=0, retries=1))
            a = await pol.session(EpisodeMeta("t", "g", "e", 0)).act([{"role": "user", "content": "hi"}])
            assert a.text == "ok"
            await pol.aclose()
        assert api.requests[1]["at"] - api.requests[0]["at"] >= 1.0, wait


def test_retry_after_reads_seconds_milliseconds_and_dates_and_ignores_nonsense():
    import email.utils
    import time

    from multidict import CIMultiDict

    from agentrl.eval.hosted import MAX_RETRY_AFTER_S, retry_after

    def wait(**h):
        return retry_after(CIMultiDict({k.replace("_", "-"): v for k, v in h.items()}))

    assert wait(Retry_After="2") == 2.0 and wait(retry_after_ms="250") == 0.25
    assert wait(retry_after_ms="soon", Retry_After="3") == 3.0  # an unreadable one does not hide the other
    assert 0 < wait(Retry_After=email.utils.formatdate(time.time() + 30, usegmt=True)) <= 30
    assert wait(Retry_After="999999") == MAX_RETRY_AFTER_S
    for nonsense in ("garbage", "-3", "nan", "1e999", "Mon, 99 Foo", email.utils.formatdate(0, usegmt=True)):
        assert wait(Retry_After=nonsense) == 0.0, nonsense
    assert wait() == 0.0


async def test_an_answer_with_nonsense_usage_is_an_api_error_not_a_crash():
    body = reply("ok")[1]
    body["usage"]["prompt_tokens"] = float("inf")  # json.dumps writes Infinity, which json.loads reads back
    async with FakeAPI([(200, body)]) as api:
        pol = HostedChatPolicy(HostedConfig(api.url, "m", backoff_s=0, retries=0))
        with pytest.raises(HostedAPIError, match="not a chat answer"):
            await pol.session(EpisodeMeta("t", "g", "e", 0)).act([{"role": "user", "content": "hi"}])
        await pol.aclose()


async def test_a_bad_key_fails_at_once_with_a_clear_error():
    async with FakeAPI([(401, {"error": {"message": "invalid api key"}})]) as api:
        pol = HostedChatPolicy(HostedConfig(api.url, "m", backoff_s=0, retries=5))
        with pytest.raises(HostedAPIError, match="HTTP 401 \\(bad or missing API key.*invalid api key"):
            await pol.session(EpisodeMeta("t", "g", "e", 0)).act([{"role": "user", "content": "hi"}])
        await pol.aclose()
    assert len(api.requests) == 1  # no retry of a refusal


async def test_a_server_gone_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pol = HostedChatPolicy(HostedConfig(f"http://127.0.0.1:{port}/v1", "m", backoff_s=0, retries=1))
    with pytest.raises(HostedAPIError, match="gave up after 2 attempts .*(Connect|Connection)"):
        await pol.session(EpisodeMeta("t", "g", "e", 0)).act([{"role": "user", "content": "hi"}])
    await pol.aclose()


async def test_the_spend_guard_stops_the_run_and_failed_episodes_are_errors_not_rewards():
    async with FakeAPI([reply("<answer>up</answer>", prompt=60, completion=50)]) as api:
        pol = HostedChatPolicy(HostedConfig(api.url, "m", backoff_s=0, max_total_tokens=200))
        async with EnvManager(ManagerConfig(max_concurrency=1, max_turns=8, max_failures_per_group=0), pol) as m:
            trajs = await m.run_episodes([EpisodeSpec("agentrl/FrozenLake-v0", {"size": 3}, seed=i) for i in range(4)])
        await pol.aclose()
    assert pol.spent() == 220  # two requests, then the guard refused every later one
    errors = [t for t in trajs if t.termination == "error"]
    assert errors and all("token budget is spent" in t.error for t in errors)
    with pytest.raises(SpendLimit):
        await pol.complete("/chat/completions", {})


# --------------------------------------------- every dialect, against agentrl's gateway (exact tokens recorded)
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages", "gemini"])
async def test_each_dialect_plays_a_tool_episode_through_the_gateway(dialect, monkeypatch):
    """A hosted policy of each dialect (chat completions, Responses, Anthropic Messages, Gemini) against agentrl's
    gateway on a scripted engine: the native tool call reaches the env as text, the tool's answer goes back as the
    dialect's tool result, and the gateway records the exact tokens the engine sampled."""
    sys.path.insert(0, str(ROOT / "tests" / "gateway"))
    from test_gateway import TOOLS, serve

    from agentrl.chat import load_tokenizer
    from agentrl.models import ensure_tiny_model

    monkeypatch.setenv("TEST_GW_KEY", "")
    call = '<tool_call>\n{"name": "lookup", "arguments": {"name": "ada"}}\n</tool_call><eos>'
    gw, eng = await serve(load_tokenizer(ensure_tiny_model()), [call, "The answer is 7.<eos>"])
    try:
        root = f"{gw.url}/s/hosted-{dialect}/" + ("v1beta" if dialect == "gemini" else "v1")
        pol = HostedChatPolicy(HostedConfig(root, "tiny", dialect=dialect,
                                            api_key_env="TEST_GW_KEY", backoff_s=0, retries=0))
        meta = EpisodeMeta("t0", "g0", "env", 0)
        meta.tools = TOOLS
        s = pol.session(meta)
        a1 = await s.act([{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Ada?"}])
        assert [c["function"]["name"] for c in a1.tool_calls] == ["lookup"], a1
        assert '"arguments": {"name": "ada"}' in a1.text
        a2 = await s.act([{"role": "tool", "content": "age 7"}])
        assert a2.text == "The answer is 7." and not a2.tool_calls
        await pol.aclose()
        sampled = [t for seg in gw.store.sessions[f"hosted-{dialect}"].segments
                   for t, m in zip(seg.token_ids, seg.loss_mask) if m]
        assert sampled == [t for g in eng.outputs for t in g.token_ids]
        assert pol.usage["requests"] == 2 and pol.usage["completion_tokens"] > 0
    finally:
        await gw.stop()


def test_each_hosted_policy_kind_speaks_its_dialect_with_its_vendors_key_variable():
    from agentrl.eval.config import HOSTED_KINDS, PolicyConfig
    from agentrl.eval.policies import build_policy

    keys = {"openai-chat": "OPENAI_API_KEY", "openai-responses": "OPENAI_API_KEY",
            "anthropic-messages": "ANTHROPIC_API_KEY", "google-gemini": "GEMINI_API_KEY"}
    assert set(HOSTED_KINDS) == set(keys)
    for kind, dialect in HOSTED_KINDS.items():
        pol = build_policy(PolicyConfig(kind=kind, endpoint="http://127.0.0.1:9/v1", model="m")).policy
        assert (pol.cfg.dialect, pol.cfg.api_key_env) == (dialect, keys[kind])
    with pytest.raises(ValueError, match="dialect must be one of chat, responses, messages, gemini"):
        HostedConfig("http://127.0.0.1:9/v1", "m", dialect="palm").validate()


# ------------------------------------------------------------------- against vLLM's own server (vllm serve)
@pytest.fixture(scope="module")
def vllm_serve(tiny_model_dir):
    args = ["--served-model-name", "tiny", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with vllm_server(str(tiny_model_dir), args) as port:
        yield f"http://127.0.0.1:{port}/v1"


@pytest.mark.engine
def test_agentrl_eval_with_a_hosted_policy_on_bfcl_and_the_tool_env(vllm_serve, tmp_path):
    """``agentrl eval --policy openai-chat`` against vllm serve: every episode runs through the API (the tiny model
    answers badly; the report is what matters), trajectories are text-level, and the report is written."""
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "agentrl.cli", "eval", "--env", "agentrl/BFCL-simple-python-v0", "--env", "agentrl/ToolUse-v0",
           "--policy", "openai-chat", "--endpoint", vllm_serve, "--model", "tiny", "--limit", "3", "--out", str(out),
           "--set", "policy.api.max_tokens=32"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = {p.name for p in out.iterdir()}
    assert "report.json" in files or "summary.json" in files, files
    trajs = [json.loads(x) for f in out.glob("*.jsonl") for x in f.read_text().splitlines() if '"token_ids"' in x]
    assert trajs, files
    for line in trajs:
        t = line.get("trajectory", line)
        assert t["token_ids"] == [] and t["info"].get("text_level") is True
        assert t["termination"] in ("terminated", "truncated"), t.get("error")
