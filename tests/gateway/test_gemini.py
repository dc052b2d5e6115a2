"""Google's Gemini dialect against the gateway, driven by the official ``google-genai`` client over real HTTP: the
scripted engine with Qwen3's real vocabulary and template (reasoning and native tool calls), streaming and not,
tools and multi-turn; each request must land in the same session record as chat completions would put it."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import pytest
from google import genai
from google.genai import errors, types

from agentrl.gateway import GatewayConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
from test_anthropic import (ANSWER, NO_THINK, THINK_CALL, assert_same_record_as_chat,  # noqa: E402,F401
                            end_four_turns, qwen3)
from test_gateway import serve  # noqa: E402

LOOKUP = types.FunctionDeclaration(  # Gemini's own schema form: upper-case type names
    name="lookup", description="Looks a person up.",
    parameters=types.Schema(type="OBJECT", properties={"name": types.Schema(type="STRING")}, required=["name"]))


def gclient(gw, session, key="unused"):
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=f"{gw.url}/s/{session}",
                                                                    api_version="v1beta"))


async def test_gemini_tools_thinking_multi_turn_stream_and_not(qwen3):
    gw, eng = await serve(qwen3, [THINK_CALL, ANSWER, THINK_CALL, ANSWER], max_model_len=4096)
    try:
        c = gclient(gw, "claude")  # the chat twin's session name: the records are compared whole below
        cfg = types.GenerateContentConfig(
            system_instruction="Use tools.", tools=[types.Tool(function_declarations=[LOOKUP])], max_output_tokens=200,
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
        contents = [types.Content(role="user", parts=[types.Part(text="How old is Ann?")])]
        for turn in range(4):
            if turn % 2:
                chunks = [ch async for ch in await c.aio.models.generate_content_stream(
                    model="tiny", contents=contents, config=cfg)]
                assert len(chunks) >= 2  # token by token: the deltas, then the finish
                parts = [p for ch in chunks for p in ch.candidates[0].content.parts or []]
                r = chunks[-1]
                content = types.Content(role="model", parts=parts)
            else:
                r = await c.aio.models.generate_content(model="tiny", contents=contents, config=cfg)
                content = r.candidates[0].content
            assert r.usage_metadata.candidates_token_count == len(eng.outputs[-1].token_ids)
            assert r.usage_metadata.prompt_token_count == len(eng.calls[-1]["prompt"])
            assert r.candidates[0].finish_reason == types.FinishReason.STOP
            thoughts = "".join(p.text for p in content.parts if p.thought)
            assert thoughts.strip() in ("Look Ann up.", "Done.")
            contents.append(content)
            calls = [p.function_call for p in content.parts if p.function_call]
            if turn % 2 == 0:
                assert [(f.name, f.args) for f in calls] == [("lookup", {"name": "Ann"})] and calls[0].id
                contents.append(types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                    id=calls[0].id, name="lookup", response={"result": "age 34"}))]))
            else:
                assert not calls and "".join(p.text for p in content.parts if not p.thought).strip() == "She is 34."
                contents.append(types.Content(role="user", parts=[types.Part(text=f"And now ({turn})?")]))
        traj = end_four_turns(gw, eng)
    finally:
        await gw.stop()
    await assert_same_record_as_chat(traj, qwen3)


async def test_gemini_cli_shapes_key_clamp_google_tools_and_errors(qwen3):
    cfg = GatewayConfig(port=0, api_key="secret-key-1", model_aliases=["gemini-*"], max_tokens=64)
    gw, eng = await serve(qwen3, [NO_THINK + "Hi there.<|im_end|>"], cfg, max_model_len=4096)
    try:
        c = gclient(gw, "g", key="secret-key-1")  # the client sends x-goog-api-key
        cfg = types.GenerateContentConfig(max_output_tokens=32000, temperature=0.5, stop_sequences=["zz"],
                                          tools=[types.Tool(google_search=types.GoogleSearch()),
                                                 types.Tool(function_declarations=[LOOKUP])],
                                          thinking_config=types.ThinkingConfig(include_thoughts=True))
        r = await c.aio.models.generate_content(model="gemini-2.5-pro", contents="hello", config=cfg)
        assert r.text.strip() == "Hi there." and r.model_version == "gemini-2.5-pro"
        params = eng.calls[0]["params"]
        assert params.max_tokens == 64 and params.temperature == 0.5 and "zz" in params.stop
        assert '"name": "lookup"' in gw.renderer.decode(eng.calls[0]["prompt"])  # the tool reached the template
        with pytest.raises(errors.ClientError) as e:
            await gclient(gw, "g", key="wrong-key-99").aio.models.generate_content(model="tiny", contents="hi")
        assert e.value.code == 401 and e.value.status == "UNAUTHENTICATED"
        with pytest.raises(errors.ClientError) as e:
            await c.aio.models.generate_content(model="gpt-4", contents="hi")
        assert e.value.code == 404 and "gpt-4" in e.value.message
        # with raw HTTP: the notes, a bad field named, other methods, a stream that is not SSE, ?key=
        base = f"{gw.url}/s/g/v1beta/models/tiny"
        async with aiohttp.ClientSession(headers={"x-goog-api-key": "secret-key-1"}) as http:
            body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [{"codeExecution": {}}],
                    "generationConfig": {"maxOutputTokens": 1000}}
            async with http.post(f"{base}:generateContent", json=body) as resp:
                assert resp.status == 200
                note = resp.headers["X-Agentrl-Note"]
                assert "codeExecution" in note and "maxOutputTokens 1000 clamped" in note
            bad = {"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]}
            async with http.post(f"{base}:generateContent", json=bad) as resp:
                err = (await resp.json())["error"]
                assert resp.status == 400 and err["status"] == "INVALID_ARGUMENT"
                assert "contents[0].parts[0].functionCall.args" in err["message"]
            async with http.post(f"{base}:embedContent", json=body) as resp:
                assert resp.status == 404 and (await resp.json())["error"]["status"] == "NOT_FOUND"
            async with http.post(f"{base}:streamGenerateContent", json=body) as resp:
                assert resp.status == 400 and "alt=sse" in (await resp.json())["error"]["message"]
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}:generateContent?key=secret-key-1", json=body) as resp:
                assert resp.status == 200
            async with http.post(f"{gw.url}/v1/chat/completions?key=secret-key-1", json={}) as resp:
                assert resp.status == 401  # a key in the query string only on Gemini's paths
    finally:
        await gw.stop()


async def test_function_responses_without_ids_answer_their_calls_in_order(qwen3):
    """Older clients send no call ids: a response answers the first open call of its name."""
    gw, eng = await serve(qwen3, [NO_THINK + "ok<|im_end|>"], max_model_len=4096)
    try:
        body = {"contents": [
            {"role": "user", "parts": [{"text": "Look up Ann and Bo."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"name": "Ann"}}},
                                        {"functionCall": {"name": "lookup", "args": {"name": "Bo"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {"age": 34}}},
                                       {"functionResponse": {"name": "lookup", "response": {"age": 5}}}]}],
            "tools": [{"functionDeclarations": [{"name": "lookup", "parameters": {
                "type": "OBJECT", "properties": {"name": {"type": "STRING"}}}}]}]}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gw.url}/s/ids/v1beta/models/tiny:generateContent", json=body) as resp:
                assert resp.status == 200, await resp.text()
        text = gw.renderer.decode(eng.calls[0]["prompt"])
        assert text.index('"Ann"') < text.index('"Bo"') < text.index('{"age": 34}') < text.index('{"age": 5}')
        assert '"type": "object"' in text and "OBJECT" not in text  # Gemini's type names as JSON Schema's
    finally:
        await gw.stop()
