"""Each dialect's token-counting endpoint, driven by its official client (``anthropic``'s
``messages.count_tokens``, ``openai``'s ``responses.input_tokens.count``, ``google-genai``'s ``models.count_tokens``):
the count is the ``usage`` input count of the same request served next on the same session (a first turn and a
follow-up that extends the session's record), counting alone leaves no session and samples nothing, and bad input
is a 400 that names the field."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import openai
from google.genai import types

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
from test_anthropic import ANSWER, TOOLS, aclient, as_param, qwen3  # noqa: E402,F401
from test_gateway import serve  # noqa: E402
from test_gemini import LOOKUP, gclient  # noqa: E402

QUESTION = "How old is Ann?"


async def test_anthropic_count_is_the_input_usage_of_the_request_served_next(qwen3):
    gw, eng = await serve(qwen3, [ANSWER, ANSWER], max_model_len=4096)
    try:
        c = aclient(gw, "ant")
        kw = dict(model="tiny", system="Use tools.", tools=TOOLS, messages=[{"role": "user", "content": QUESTION}])
        n = (await c.messages.count_tokens(**kw)).input_tokens
        assert "ant" not in gw.store.sessions and eng.calls == []  # nothing kept, nothing sampled
        r = await c.messages.create(max_tokens=64, **kw)
        assert r.usage.input_tokens == n > 0
        kw["messages"] += [{"role": "assistant", "content": as_param(r.content)}, {"role": "user", "content": "Bob?"}]
        n2 = (await c.messages.count_tokens(**kw)).input_tokens
        r2 = await c.messages.create(max_tokens=64, **kw)
        assert r2.usage.input_tokens == n2 > n and len(eng.calls) == 2
        assert gw.store.get("ant", create=False).requests == 2  # the counts were no requests of the session
    finally:
        await gw.stop()


async def test_responses_count_follows_previous_response_id_and_its_session(qwen3):
    gw, eng = await serve(qwen3, [ANSWER, ANSWER], max_model_len=4096)
    o = openai.AsyncOpenAI(base_url=f"{gw.url}/s/resp/v1", api_key="unused", max_retries=0)
    other = openai.AsyncOpenAI(base_url=f"{gw.url}/s/other/v1", api_key="unused", max_retries=0)
    try:
        tools = [{"type": "function", "name": t["name"], "description": t["description"],
                  "parameters": t["input_schema"]} for t in TOOLS]
        kw = dict(instructions="Use tools.", tools=tools, input=QUESTION)
        got = await o.responses.input_tokens.count(model="tiny", **kw)
        assert got.object == "response.input_tokens" and "resp" not in gw.store.sessions
        r = await o.responses.create(model="tiny", max_output_tokens=64, **kw)
        assert r.usage.input_tokens == got.input_tokens
        follow = dict(instructions="Use tools.", tools=tools, input="And Bob?", previous_response_id=r.id)
        n2 = (await o.responses.input_tokens.count(**follow)).input_tokens  # no model: the served one
        r2 = await o.responses.create(model="tiny", max_output_tokens=64, **follow)
        assert r2.usage.input_tokens == n2 > got.input_tokens
        try:  # another session may not count against this session's history
            await other.responses.input_tokens.count(**follow)
            raise AssertionError("counted another session's response")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and "belongs to session 'resp'" in str(e)
        assert "other" not in gw.store.sessions
    finally:
        await o.close()
        await other.close()
        await gw.stop()


async def test_gemini_count_tokens_contents_or_a_whole_generate_content_request(qwen3):
    gw, eng = await serve(qwen3, [ANSWER], max_model_len=4096)
    try:
        c = gclient(gw, "gem")
        contents = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
        n = (await c.aio.models.count_tokens(model="tiny", contents=contents)).total_tokens
        assert "gem" not in gw.store.sessions and eng.calls == []
        r = await c.aio.models.generate_content(model="tiny", contents=contents,
                                                config=types.GenerateContentConfig(max_output_tokens=64))
        assert r.usage_metadata.prompt_token_count == n > 0
        # the REST form with the whole request (system instruction and tools count too), then bad input
        body = {"generateContentRequest": {
            "contents": [{"role": "user", "parts": [{"text": QUESTION}]}], "systemInstruction": {"parts": [{"text": "x"}]},
            "tools": [{"functionDeclarations": [LOOKUP.model_dump(exclude_none=True, mode="json")]}]}}
        async with aiohttp.ClientSession() as s:
            url = f"{gw.url}/s/gem2/v1beta/models/tiny:countTokens"
            async with s.post(url, json=body) as resp:
                assert resp.status == 200 and (await resp.json())["totalTokens"] > n
            for bad, field in (({"contents": "hi"}, "contents"), ({"generateContentRequest": [1]},
                                                                   "generateContentRequest")):
                async with s.post(url, json=bad) as resp:
                    err = (await resp.json())["error"]
                    assert resp.status == 400 and field in err["message"], err
        assert "gem2" not in gw.store.sessions
    finally:
        await gw.stop()
