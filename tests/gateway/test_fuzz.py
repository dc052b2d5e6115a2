"""Hostile values in every field of every dialect's request (chat completions, completions, Messages, Responses,
Gemini), streamed and not: each field of a valid request replaced by a value of the wrong kind, or removed, and each
request must get a 4xx error or an answer, never a 5xx, and the server must still serve a valid request after them.
The requests are the shapes real clients send (tools, tool calls and results, reasoning blocks, system prompts)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
from test_gateway import serve, tiny_tok  # noqa: E402,F401

from agentrl.gateway import GatewayConfig  # noqa: E402

FN = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
BODIES = {
    "/v1/chat/completions": {
        "model": "tiny", "max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 1, "stop": ["x"], "n": 1,
        "logprobs": True, "tool_choice": "auto",
        "tools": [{"type": "function", "function": {"name": "lookup", "description": "d", "parameters": FN}}],
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"name": "a"}'}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "r"}]},
    "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 8, "logprobs": 1, "stop": ["x"]},
    "/v1/messages": {
        "model": "tiny", "max_tokens": 8, "system": [{"type": "text", "text": "s"}], "stop_sequences": ["x"],
        "tools": [{"name": "lookup", "description": "d", "input_schema": FN}], "tool_choice": {"type": "auto"},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                                       {"type": "tool_use", "id": "t1", "name": "lookup",
                                                        "input": {"name": "a"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                   "content": [{"type": "text", "text": "r"}]}]}]},
    "/v1/responses": {
        "model": "tiny", "max_output_tokens": 8, "instructions": "s", "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "lookup", "parameters": FN},
                  {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f", "parameters": FN}]},
                  {"type": "web_search"}],
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
                  {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "r"}]},
    "/v1beta/models/tiny:generateContent": {
        "systemInstruction": {"parts": [{"text": "s"}]},
        "tools": [{"functionDeclarations": [{"name": "lookup", "description": "d", "parameters": FN}]}],
        "generationConfig": {"maxOutputTokens": 8, "temperature": 1.0, "stopSequences": ["x"]},
        "contents": [{"role": "user", "parts": [{"text": "hi"}]},
                     {"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"name": "a"}}}]},
                     {"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {"r": 1}}}]}]},
}
HOSTILE = [None, -1, 1e300, "x", True, [], {}, [None], {"type": None}]


def _paths(obj, pre=()):
    yield pre
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, pre + (k,))


def _variants(body):
    for path in _paths(body):
        if not path:
            continue
        for value in [*HOSTILE, "<delete>"]:
            out = copy.deepcopy(body)
            cur = out
            for k in path[:-1]:
                cur = cur[k]
            if value == "<delete>":
                del cur[path[-1]]
            else:
                cur[path[-1]] = value
            yield path, value, out


async def test_no_field_of_any_dialect_can_make_a_server_error(tiny_tok):
    gw, eng = await serve(tiny_tok, ["ok<eos>"], cfg=GatewayConfig(port=0, max_sessions=100_000), max_model_len=4096)
    sent, statuses = 0, set()
    try:
        async with aiohttp.ClientSession() as s:
            for i, (route, body) in enumerate(BODIES.items()):
                for stream in (False, True):
                    if stream and "generateContent" in route:
                        route = route.replace("generateContent", "streamGenerateContent") + "?alt=sse"
                    for path, value, variant in _variants(body):
                        if stream and "generateContent" not in route:
                            variant["stream"] = True
                        sent += 1
                        async with s.post(f"{gw.url}/s/f{sent}{route}", data=json.dumps(variant),
                                          headers={"Content-Type": "application/json"}) as r:
                            await r.read()
                            statuses.add(r.status)
                            assert r.status < 500, (route, path, value, r.status)
            async with s.post(f"{gw.url}/v1/chat/completions", json=BODIES["/v1/chat/completions"]) as r:
                assert r.status == 200  # still serving
    finally:
        await gw.stop()
    assert sent > 1500 and 200 in statuses and 400 in statuses and "server_error" not in gw.errors
