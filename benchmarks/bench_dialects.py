"""Streamed throughput and time to first token per gateway dialect, against the engine directly, in one run.

One real vLLM engine (the tiny CPU model by default). Every side runs ``--concurrency`` clients at once, each
sending ``--requests`` streamed requests for the same short conversation, every completion exactly ``--tokens``
tokens long (the engine is wrapped so that every request ignores end-of-sequence: equal work on every side):

- **engine**: :meth:`VLLMEngine.generate_streaming` on the gateway's rendering of the conversation (no HTTP);
- **chat**: ``POST /v1/chat/completions`` with ``stream: true``;
- **messages**: ``POST /v1/messages`` (Anthropic) with ``stream: true``;
- **responses**: ``POST /v1/responses`` (OpenAI Responses) with ``stream: true``;
- **gemini**: ``POST /v1beta/models/tiny:streamGenerateContent?alt=sse`` (Google's Gemini).

Clients are bare aiohttp readers of the SSE stream (what is measured is the gateway, not a client library); each
request is its own session, as a harness's first turn. Reported per side: generated tokens per second (all tokens /
wall time of the side), the ratio to the engine, and the time to first token (TTFT: request sent -> first text
delta received; engine: -> first ``on_tokens``) as median and p90. Sides alternate ``--repeats`` times after a
warm-up; medians over repeats. The load average before and after is printed (the machine is shared).

The same dialects against agentrl's native agent loop on the same episodes, with each dialect's official client,
streamed and not: ``benchmarks/bench_gateway.py --sides all`` (this script measures the gateway against the engine
it serves; that one against the training loop it stands in for).

Run::

    .venv/bin/python benchmarks/bench_dialects.py                        # 8 clients x 4 requests x 64 tokens, 3 repeats
    .venv/bin/python benchmarks/bench_dialects.py --concurrency 4 --requests 2 --repeats 1   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import aiohttp

from bench_gateway import exact_length, loadavg  # this directory is on sys.path when a script here runs

MESSAGES = [{"role": "system", "content": "You are a storyteller."},
            {"role": "user", "content": "Tell me a story about a lighthouse keeper."}]
SIDES = ("engine", "chat", "messages", "responses", "gemini")
# chat: content or reasoning_content (the tiny model's family may open with reasoning), the opening empty one aside
TEXT_EVENTS = {"chat": b'content": "', "messages": b'"type": "content_block_delta"',
               "responses": b'"type": "response.output_text.delta"', "gemini": b'"parts": [{"text": "'}


def body(side: str, tokens: int) -> tuple[str, dict[str, Any]]:
    if side == "chat":
        return "/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": tokens, "stream": True}
    if side == "messages":
        return "/v1/messages", {"model": "tiny", "system": MESSAGES[0]["content"], "messages": MESSAGES[1:],
                                "max_tokens": tokens, "stream": True}
    if side == "gemini":
        return "/v1beta/models/tiny:streamGenerateContent?alt=sse", {
            "systemInstruction": {"parts": [{"text": MESSAGES[0]["content"]}]},
            "contents": [{"role": "user", "parts": [{"text": MESSAGES[1]["content"]}]}],
            "generationConfig": {"maxOutputTokens": tokens}}
    return "/v1/responses", {"model": "tiny", "instructions": MESSAGES[0]["content"],
                             "input": MESSAGES[1]["content"], "max_output_tokens": tokens, "stream": True}


async def one_http(http: aiohttp.ClientSession, url: str, side: str, args: argparse.Namespace, sid: str) -> float:
    """Sends one streamed request; returns its TTFT (seconds)."""
    path, payload = body(side, args.tokens)
    t0 = time.perf_counter()
    ttft = None
    async with http.post(f"{url}/s/{sid}{path}", json=payload) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if ttft is None and TEXT_EVENTS[side] in line and (side != "chat" or b'content": ""' not in line):
                ttft = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError(f"{side}: no text delta came")
    return ttft


async def one_engine(engine: Any, prompt: list[int], args: argparse.Namespace, rid: str) -> float:
    from agentrl.inference.base import SamplingParams

    t0 = time.perf_counter()
    first: list[float] = []
    gen = await engine.generate_streaming(prompt, SamplingParams(max_tokens=args.tokens, temperature=1.0),
                                          request_id=rid, on_tokens=lambda ids: first or first.append(
                                              time.perf_counter() - t0))
    assert len(gen.token_ids) == args.tokens
    return first[0]


async def run_side(side: str, engine: Any, gw: Any, prompt: list[int], args: argparse.Namespace, tag: str) -> dict:
    ttfts: list[float] = []

    async def client(c: int, http: aiohttp.ClientSession | None) -> None:
        for r in range(args.requests):
            sid = f"{tag}-{side}-{c}-{r}"
            ttfts.append(await (one_engine(engine, prompt, args, sid) if http is None else
                                one_http(http, gw.url, side, args, sid)))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, None if side == "engine" else http) for c in range(args.concurrency)))
        wall = time.perf_counter() - t0
    for sid in list(gw.store.sessions):
        gw.close_session(sid)
    n = args.concurrency * args.requests
    ttfts.sort()
    return {"tokens_per_s": n * args.tokens / wall, "ttft_median_s": statistics.median(ttfts),
            "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))], "wall_s": wall}


async def main_async(args: argparse.Namespace) -> dict:
    from agentrl.chat import load_tokenizer
    from agentrl.gateway import Gateway, GatewayConfig
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.vllm_engine import VLLMEngine
    from agentrl.models import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    vllm = await VLLMEngine.create(EngineConfig(model=model, max_model_len=2048, seed=0))
    engine = exact_length(vllm)
    out: dict[str, Any] = {"load_before": loadavg(), "args": vars(args), "runs": {s: [] for s in SIDES}}
    try:
        async with Gateway(engine, load_tokenizer(model), GatewayConfig(port=0, max_tokens=4096),
                           model_name="tiny") as gw:
            prompt = gw.renderer.prompt(MESSAGES)[1]
            warm = argparse.Namespace(**{**vars(args), "requests": 1})
            for side in SIDES:
                await run_side(side, engine, gw, prompt, warm, "warm")
            for rep in range(args.repeats):
                for side in SIDES:
                    res = await run_side(side, engine, gw, prompt, args, f"r{rep}")
                    out["runs"][side].append(res)
                    print(f"repeat {rep} {side}: {res['tokens_per_s']:.1f} tok/s, TTFT median "
                          f"{res['ttft_median_s'] * 1000:.0f} ms (load {loadavg()})", file=sys.stderr)
            assert not gw.errors.get("stream_mismatch")
    finally:
        await vllm.close()
    out["load_after"] = loadavg()
    return out


def table(out: dict) -> str:
    runs = out["runs"]
    base = statistics.median(r["tokens_per_s"] for r in runs["engine"])
    lines = ["| side | tokens/s (median) | vs engine | TTFT median | TTFT p90 |", "|---|---|---|---|---|"]
    for side in SIDES:
        tps = statistics.median(r["tokens_per_s"] for r in runs[side])
        lines.append(f"| {side} | {tps:.1f} | {tps / base:.3f}x | "
                     f"{statistics.median(r['ttft_median_s'] for r in runs[side]) * 1000:.0f} ms | "
                     f"{statistics.median(r['ttft_p90_s'] for r in runs[side]) * 1000:.0f} ms |")
    lines.append(f"\nload average before {out['load_before']}, after {out['load_after']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=4, help="streamed requests per client, one after another")
    p.add_argument("--tokens", type=int, default=64, help="generated tokens per request (exact)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    out = asyncio.run(main_async(args))
    print(table(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
