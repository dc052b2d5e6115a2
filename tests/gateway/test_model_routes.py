"""The served model as each official client lists and retrieves it: ``openai`` (``models.list`` /
``models.retrieve``), ``anthropic`` (``models.list`` / ``models.retrieve``, which read other fields of the same
routes) and ``google-genai`` (``models.list`` / ``models.get``, Gemini's own form); an alias the gateway serves is
found, any other name is a 404 that says what is served."""

from __future__ import annotations

import sys
from pathlib import Path

import anthropic
import openai
import pytest
from google.genai import errors

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
from test_anthropic import aclient, qwen3  # noqa: E402,F401
from test_gateway import serve  # noqa: E402
from test_gemini import gclient  # noqa: E402

from agentrl.gateway import GatewayConfig  # noqa: E402


async def test_every_official_client_lists_and_retrieves_the_served_model(qwen3):
    gw, eng = await serve(qwen3, ["ok"], cfg=GatewayConfig(port=0, model_aliases=["claude-*"]), max_model_len=4096)
    o = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    try:
        assert [m.id for m in (await o.models.list()).data] == ["tiny"]
        assert (await o.models.retrieve("tiny")).owned_by == "agentrl"
        with pytest.raises(openai.NotFoundError, match="this gateway serves 'tiny'"):
            await o.models.retrieve("gpt-9")

        a = aclient(gw, "models")
        page = await a.models.list()
        assert [(m.id, m.type, m.display_name) for m in page.data] == [("tiny", "model", "tiny")]
        assert not page.has_more
        got = await a.models.retrieve("claude-sonnet-9")  # an alias: found under the name asked for
        assert (got.id, got.type) == ("claude-sonnet-9", "model") and got.created_at.year == 1970
        with pytest.raises(anthropic.NotFoundError):
            await a.models.retrieve("gpt-9")

        g = gclient(gw, "models")
        listed = [m async for m in await g.aio.models.list()]
        assert [m.name for m in listed] == ["models/tiny"]
        one = await g.aio.models.get(model="tiny")
        assert one.input_token_limit == 4096 and "countTokens" in one.supported_actions
        with pytest.raises(errors.ClientError, match="404"):
            await g.aio.models.get(model="gemini-9")
        assert gw.store.sessions == {}  # looking a model up opens no session
    finally:
        await o.close()
        await gw.stop()
