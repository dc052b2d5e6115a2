"""The remote backend against a real ``python -m vllm.entrypoints.openai.api_server --enable-scale-out`` process on
127.0.0.1 (started here with the tiny model, killed at the end): token ids, log-probs and per-token weight versions
as the server reports them, sticky and least-in-flight routing, abort with partial tokens, failover, and a real
weight reload over HTTP. Plus unit tests of the stream handling against a small fake server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.base import SamplingParams
from agentrl.inference import WORKER_EXTENSION, EngineConfig, make_engine
from agentrl.inference.remote import RemoteEngine, RemoteEngineError, versions_from_spans
from agentrl.testing.vllm_server import free_port, vllm_server


engine = pytest.mark.engine


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    args = ["--no-enable-chunked-prefill", "--gpu-memory-utilization", "0.5",
            "--worker-extension-cls", WORKER_EXTENSION, "--enable-scale-out"]
    with vllm_server(str(tiny_model_dir), args, {"VLLM_SERVER_DEV_MODE": "1"}) as port:
        yield f"http://127.0.0.1:{port}", port


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _prompt(tok, text="What is 2 + 2?"):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


async def _until_tokens(eng, request_id, timeout_s=300.0):
    """Waits until the server has streamed some tokens of ``request_id`` (a loaded machine may take seconds)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        req = eng._inflight.get(request_id)
        if req is not None and req.token_ids:
            return
        assert asyncio.get_running_loop().time() < deadline, f"no tokens of {request_id} after {timeout_s} s"
        await asyncio.sleep(0.05)


def _hf_token_logprobs(model_dir, state_dict, prompt, gen):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=False)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + gen])).logits[0].float(), dim=-1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(gen)]


@engine
async def test_remote_generate_tokens_and_logprobs(server, tok, tiny_model_dir):
    url, _ = server
    eng = make_engine(EngineConfig(backend="remote", urls=[url], model=str(tiny_model_dir), max_model_len=2048))
    try:
        p = _prompt(tok)
        gen = await eng.generate(p, SamplingParams(max_tokens=20, ignore_eos=True, seed=3), request_id="r-basic", session_id="s")
        assert gen.finish_reason == "length"
        assert len(gen.token_ids) == len(gen.logprobs) == len(gen.versions) == 20
        assert gen.versions == [0] * 20
        ref = _hf_token_logprobs(tiny_model_dir, None, p, gen.token_ids)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-4
        again = await eng.generate(p, SamplingParams(max_tokens=20, ignore_eos=True, seed=3), request_id="r-basic2")
        assert again.token_ids == gen.token_ids
        stop_tok = gen.token_ids[5]
        s = await eng.generate(p, SamplingParams(max_tokens=20, ignore_eos=True, seed=3, stop_token_ids=[stop_tok]), request_id="r-stop")
        assert s.finish_reason == "stop" and s.token_ids == gen.token_ids[: gen.token_ids.index(stop_tok) + 1]
        with pytest.raises(ValueError, match="max_model_len"):
            await eng.generate([5] * 2048, SamplingParams(max_tokens=2), request_id="r-long")
        with pytest.raises(ValueError, match="rejected"):
            await eng.generate([5, 99999], SamplingParams(max_tokens=2), request_id="r-bad-id")
    finally:
        await eng.close()


@engine
async def test_sticky_sessions_and_least_inflight(server, tok):
    url, port = server
    # Two entries that reach the same real server under different names: routing treats them as two servers.
    a, b = url, f"http://localhost:{port}"
    eng = RemoteEngine([a, b])
    try:
        p = _prompt(tok)
        gens = await asyncio.gather(*[
            eng.generate(p, SamplingParams(max_tokens=16, ignore_eos=True), request_id=f"r-lb-{i}", session_id=f"traj-{i}")
            for i in range(8)
        ])
        assert all(len(g.token_ids) == 16 for g in gens)
        pins = [eng.server_for(f"traj-{i}") for i in range(8)]
        assert pins.count(a) == 4 and pins.count(b) == 4  # spread by in-flight count
        # Later turns of a trajectory go where its first turn went, even when that server is busier.
        busy = asyncio.create_task(eng.generate(p, SamplingParams(max_tokens=150, ignore_eos=True), request_id="r-busy",
                                                session_id="traj-0"))
        await _until_tokens(eng, "r-busy")
        for i in range(8):
            await eng.generate(p, SamplingParams(max_tokens=2), request_id=f"r-turn2-{i}", session_id=f"traj-{i}")
            assert eng.server_for(f"traj-{i}") == pins[i]
        await busy
        eng.end_session("traj-0")
        assert eng.server_for("traj-0") is None
    finally:
        await eng.close()


@engine
async def test_abort_keeps_partial_tokens(server, tok):
    url, _ = server
    eng = RemoteEngine([url])
    try:
        async def episode():
            # The agent loop awaits generate() inside its own task: an abort must end the turn, not the task.
            g = await eng.generate(_prompt(tok), SamplingParams(max_tokens=1500, ignore_eos=True), request_id="r-abort")
            return "continued", g

        task = asyncio.create_task(episode())
        await _until_tokens(eng, "r-abort")
        await eng.abort("r-abort")
        what, gen = await asyncio.wait_for(task, 120)
        assert what == "continued" and gen.finish_reason == "abort"
        assert 0 < len(gen.token_ids) < 1500 and len(gen.logprobs) == len(gen.token_ids)
    finally:
        await eng.close()


@engine
async def test_dead_server_fails_over(server, tok):
    url, _ = server
    dead = f"http://127.0.0.1:{free_port()}"
    eng = RemoteEngine([dead, url], max_retries=2)
    try:
        gen = await eng.generate(_prompt(tok), SamplingParams(max_tokens=3), request_id="r-failover", session_id="t")
        assert len(gen.token_ids) == 3 and eng.server_for("t") == url
        only_dead = RemoteEngine([dead], max_retries=1)
        with pytest.raises(RemoteEngineError, match="no server answered"):
            await only_dead.generate([1, 2, 3], SamplingParams(max_tokens=2), request_id="r-dead")
        # Servers may come back: dead() only once none has answered for DEAD_AFTER_S (a run then stops instead of
        # giving up its tasks one failed episode after another).
        assert only_dead.dead() is None
        only_dead.DEAD_AFTER_S = eng.DEAD_AFTER_S = 0.0
        assert only_dead.dead().startswith(f"no server answered for 0 s ({dead})")
        assert eng.dead() is None  # its failover answered
        await only_dead.close()
    finally:
        await eng.close()


@engine
async def test_weight_update_over_http(server, tok, tiny_model_dir):
    url, _ = server
    eng = RemoteEngine([url], model_path=str(tiny_model_dir), weight_sync="http", pause_mode="abort")
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    p = _prompt(tok)
    try:
        await eng.update_weights(perturbed, 1)
        assert eng.version == 1 and await eng.server_versions() == ["1"]
        gen = await eng.generate(p, SamplingParams(max_tokens=16, ignore_eos=True, seed=9), request_id="r-w1")
        assert gen.versions == [1] * 16
        new_ref = _hf_token_logprobs(tiny_model_dir, perturbed, p, gen.token_ids)
        old_ref = _hf_token_logprobs(tiny_model_dir, None, p, gen.token_ids)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, new_ref)) < 1e-4
        assert max(abs(a - b) for a, b in zip(gen.logprobs, old_ref)) > 0.1
        with pytest.raises(ValueError, match="missing tensors"):
            await eng.update_weights({"model.norm.weight": original["model.norm.weight"]}, 2)
        assert eng.version == 1
    finally:
        await eng.update_weights(original, 2)
        await eng.close()


@engine
async def test_versions_are_the_servers_labels(server, tok):
    """A token's version is the server's weight-version label for the step that sampled it, also when something
    other than this client relabelled the server (a trainer pushing weights over NCCL calls
    finish_weight_update(weight_version) on the server itself). The client's own counter plays no part."""
    url, _ = server
    eng = RemoteEngine([url], weight_sync="version_only", pause_mode="keep")
    p = _prompt(tok)
    try:
        await eng._post(eng.servers[0], "/update_weight_version", {"new_version": "5"})
        gen = await eng.generate(p, SamplingParams(max_tokens=6, ignore_eos=True), request_id="r-v5")
        assert eng.version == 0 and gen.versions == [5] * 6
        # keep mode: a request spanning a relabel carries the old label, then the new one, split where the server
        # switched: after the tokens already streamed, and (1,000 tokens against one round trip) before the end.
        n = 1000
        task = asyncio.create_task(eng.generate(p, SamplingParams(max_tokens=n, ignore_eos=True), request_id="r-keep"))
        await _until_tokens(eng, "r-keep")
        await eng.update_weights({}, 6)
        g = await asyncio.wait_for(task, 900)
        k = g.versions.count(5)
        assert g.finish_reason == "length" and 0 < k < n and g.versions == [5] * k + [6] * (n - k)
        # Aborted: the tokens so far, with the versions the server reported.
        task = asyncio.create_task(eng.generate(p, SamplingParams(max_tokens=1500, ignore_eos=True), request_id="r-ab2"))
        await _until_tokens(eng, "r-ab2")
        await eng.abort("r-ab2")
        g = await asyncio.wait_for(task, 300)
        assert g.finish_reason == "abort" and 0 < len(g.token_ids) < 1500 and g.versions == [6] * len(g.token_ids)
    finally:
        await eng._post(eng.servers[0], "/update_weight_version", {"new_version": "0"})
        await eng.close()


def test_versions_from_spans():
    spans = [{"version": "default", "start": 0, "end": 2}, {"version": "3", "start": 2, "end": 5}]
    assert versions_from_spans(spans, 5, default_version=7) == [7, 7, 3, 3, 3]
    assert versions_from_spans(spans, 6, default_version=0) is None  # a token without a version
    assert versions_from_spans(None, 0, default_version=0) == []
    with pytest.raises(RemoteEngineError, match="not an integer"):
        versions_from_spans([{"version": "step-a", "start": 0, "end": 1}], 1, default_version=0)


def _sse_chunk(tokens, final=False, version="4"):
    """One chunk of vLLM's token-out SSE stream; the final one carries the finish reason and the version spans."""
    choice = {"index": 0, "token_ids": tokens, "finish_reason": "length" if final else None,
              "logprobs": {"content": [{"token_id": t, "logprob": -1.0} for t in tokens]},
              "weight_versions": [{"version": version, "start": 0, "end": 3}] if final else None}
    return ("data: " + json.dumps({"request_id": "srv-x", "choices": [choice]}) + "\n\n").encode()


@contextlib.asynccontextmanager
async def _fake_server(first, rest):
    """A stand-in for vLLM's ``/inference/v1/generate`` that writes ``first`` ids, then awaits ``rest(body)`` for
    the rest of the stream (None: the stream is cut there); yields a RemoteEngine on it (no retries)."""
    from aiohttp import web

    async def handler(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_sse_chunk(first))
        tail = await rest(body)
        if tail is not None:
            await resp.write(tail + b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/inference/v1/generate", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    eng = RemoteEngine([f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"], max_retries=0)
    try:
        yield eng
    finally:
        await eng.close()
        await runner.cleanup()


async def test_stream_cut_before_final_chunk_returns_no_tokens():
    """A stream that ends without its final chunk (no version spans) returns no tokens, so no token ever leaves
    the client without the version the server gave it; a final chunk with spans returns them all."""

    async def rest(body):
        return _sse_chunk([13], final=True) if body["request_id"] == "whole" else None

    async with _fake_server([11, 12], rest) as eng:
        cut = await eng.generate([1, 2], SamplingParams(max_tokens=3), request_id="cut")
        assert cut.finish_reason == "abort" and cut.token_ids == [] and cut.versions == []
        whole = await eng.generate([1, 2], SamplingParams(max_tokens=3), request_id="whole")
        assert whole.token_ids == [11, 12, 13] and whole.versions == [4, 4, 4] and whole.logprobs == [-1.0] * 3


async def test_a_stream_line_that_is_not_json_is_the_servers_error_named():
    """A proxy's HTML page or a torn line in the SSE stream raised a bare JSONDecodeError out of generate()."""

    async def rest(body):
        return b"data: <html>502 Bad Gateway</html>\n\n"

    async with _fake_server([11], rest) as eng:
        with pytest.raises(RemoteEngineError, match="not JSON.*502 Bad Gateway"):
            await eng.generate([1, 2], SamplingParams(max_tokens=3), request_id="garbled")


async def test_streaming_tells_each_chunk_as_the_server_sends_it():
    """``generate_streaming`` over SSE: the server holds its final chunk until the first ids were told (a client
    that told only at the end would hang here, so the stream is live), what was told is the generation, and a
    stream cut after ids were told is an error, not a silent empty generation."""
    told_first = asyncio.Event()
    told: list[list[int]] = []

    async def rest(body):
        if body["request_id"] != "live":
            return None
        await asyncio.wait_for(told_first.wait(), 60)
        return _sse_chunk([23], final=True, version="2")

    def on_tokens(ids):
        told.append(list(ids))
        told_first.set()

    async with _fake_server([21, 22], rest) as eng:
        gen = await asyncio.wait_for(eng.generate_streaming([1, 2], SamplingParams(max_tokens=3), request_id="live",
                                                            on_tokens=on_tokens), 60)
        assert told == [[21, 22], [23]] and gen.token_ids == [21, 22, 23] and gen.versions == [2, 2, 2]
        with pytest.raises(RemoteEngineError, match="cut after 2 streamed tokens"):
            await eng.generate_streaming([1, 2], SamplingParams(max_tokens=3), request_id="cut", on_tokens=told.append)


async def test_the_server_is_asked_for_the_chunks_and_the_text_the_caller_reads():
    """vLLM's ``stream_interval``: a whole answer is asked in one chunk after its first token (``max_tokens``), a
    streamed one in the caller's interval; the default interval sends no field (every step, the server's default)."""
    bodies = []

    async def rest(body):
        bodies.append(body)
        return _sse_chunk([12, 13], final=True)

    async with _fake_server([11], rest) as eng:
        await eng.generate([1, 2], SamplingParams(max_tokens=3), request_id="whole")
        await eng.generate_streaming([1, 2], SamplingParams(max_tokens=3, stream_interval=2), request_id="two",
                                     on_tokens=lambda ids: None)
        await eng.generate_streaming([1, 2], SamplingParams(max_tokens=3), request_id="each",
                                     on_tokens=lambda ids: None)
        await eng.generate([1, 2], SamplingParams(max_tokens=3, stop=["x"]), request_id="stop")
    assert [b["sampling_params"].get("stream_interval") for b in bodies] == [3, 2, None, 3]
    # text is decoded by the server only where stop strings need it
    assert [b["sampling_params"].get("detokenize", True) for b in bodies] == [False, False, False, True]
