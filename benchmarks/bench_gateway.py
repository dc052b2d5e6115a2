"""Gateway throughput against the native agent loop on the same episodes, per dialect (target: >= 0.95x native).

For the figures (per dialect, streamed and not, with each dialect's official client; ~10 minutes on 2 quiet
cores, see below)::

    nice -n 5 .venv/bin/python benchmarks/bench_gateway.py --sides all --repeats 7 --json /tmp/bench_gateway_sides.json

Every side runs the same episodes on one real vLLM engine (the tiny CPU model by default) through
``agentrl.manager.EnvManager``: ``--episodes`` episodes at once (seeds 0..episodes-1), ``--turns`` turns each, every
turn generating exactly ``--tokens`` tokens (the engine ignores end-of-sequence on every side: equal work) at
temperature 1.0, every env turn adding the same short user message.

- **native**: ``AgentLoopPolicy`` on an in-process env that replies with that message (token-in/token-out loop).
- **gateway sides** (``--sides``): ``HarnessPolicy``; each episode's harness is a user-style loop that sends the
  whole conversation to the gateway each turn, as harnesses do, in one dialect:

  - ``aiohttp``: ``POST /v1/chat/completions`` with a bare aiohttp client, not streamed (the default: what is
    measured is the gateway itself); ``aiohttp-messages``, ``aiohttp-responses``, ``aiohttp-gemini`` and the
    ``-stream`` sides of all four (``aiohttp-chat-stream``, ...): the same bare client in the other dialects, the
    JSON posted and the server-sent events read raw (``--sides bare``: the gateway's own cost per dialect, without
    an SDK's);
  - ``chat``, ``messages``, ``responses``: chat completions with the ``openai`` client, Anthropic Messages with the
    ``anthropic`` client, OpenAI Responses with the ``openai`` client (``instructions`` + ``input`` items);
  - ``chat-stream``, ``messages-stream``, ``responses-stream``: the same, streamed (``stream=True``, the text read
    from the deltas); the time to the first streamed text delta (TTFT) is reported for these.

  ``--sides dialects`` is the six official-client sides, ``--sides bare`` the eight bare ones, ``--sides all`` both.
  One client (one
  connection pool) per library is shared by all episodes, built before the timed run (building one loads the CA
  bundle, ~0.15 s of CPU). The official clients add their own per-request cost (request-body transformation,
  response models), which a harness using them pays too. The gateway renders, matches the session, samples, parses,
  answers in the dialect. Client and gateway share this process's two cores with the engine, so the client's cost
  counts too. The native loop does not stream: the engine's own TTFT is ``benchmarks/bench_dialects.py``'s.

Each repeat runs, for every gateway side, the native side and then that side (so each ratio compares two runs a few
seconds apart: the machine's load drifts less between them); a warm-up of each side comes first. Reported per
side: generated tokens per second (median over repeats), the ratio to native (median of the paired ratios, and
median tok/s over median native tok/s), TTFT median and p90 (streamed sides), the driver process's CPU time per
turn (``time.process_time``: the manager, the agent loop or the gateway and its client, vLLM's front end; not the
engine core, its own process), the gateway's drift rate (0: every request extended its session), and the load
average before and after (the machine is shared).

``--engine instant``: an engine that returns ``--tokens`` tokens at once instead of vLLM, so only the per-turn CPU
of each side is left (what bounds the driver when the engine is fast, e.g. on a GPU). ``--smoke``: 2 episodes x 2
turns x 8 tokens, 1 repeat, every side (checks that each side runs end to end; no figures).

Run::

    .venv/bin/python benchmarks/bench_gateway.py                       # 64 episodes x 4 turns x 32 tokens, 3 repeats
    .venv/bin/python benchmarks/bench_gateway.py --episodes 16 --repeats 1   # quick
    .venv/bin/python benchmarks/bench_gateway.py --engine instant            # per-turn CPU, no model
    .venv/bin/python benchmarks/bench_gateway.py --engine instant --smoke     # every side end to end, seconds

Time: a native or gateway run is 64 x 4 x 32 = 8,192 tokens, ~3-4 s at the ~2,500 tok/s of the tiny model on two
quiet cores; ``--sides all --repeats 7`` is 7 x 7 x 2 such runs plus warm-ups and the engine's start, ~10 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

from agentrl import gcheap
from agentrl.core import Env

ENV_REPLY = "Lower than 9. 3 guesses left."
DIALECT_SIDES = ("chat", "chat-stream", "messages", "messages-stream", "responses", "responses-stream")
# the gateway itself per dialect: bare aiohttp clients that post the dialect's JSON and read its SSE events raw
BARE_SIDES = ("aiohttp", "aiohttp-chat-stream", "aiohttp-messages", "aiohttp-messages-stream", "aiohttp-responses",
              "aiohttp-responses-stream", "aiohttp-gemini", "aiohttp-gemini-stream")
SIDES = BARE_SIDES + DIALECT_SIDES


def opening(seed: Any) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Guess my secret integer between 1 and 16."},
            {"role": "user", "content": f"Guess the number. Game {seed}."}]


class FixedTurnsEnv(Env):
    """Replies ``ENV_REPLY`` to every action; terminates after ``turns`` steps. Async, zero latency."""

    def __init__(self, turns: int = 4):
        super().__init__()
        self.turns, self.t = turns, 0

    async def areset(self, *, seed=None, options=None):
        self.t = 0
        return opening(seed), {}

    async def astep(self, action: str):
        self.t += 1
        return [{"role": "user", "content": ENV_REPLY}], 0.0, self.t >= self.turns, False, {}


class InstantEngine:
    """Returns ``max_tokens`` tokens of fixed ordinary text at once (log-prob -0.1, version 0): no model cost.
    Streamed, it tells the first, then ``stream_interval`` at a time (every streamed side gets deltas)."""

    def __init__(self, tok, max_model_len: int):
        ids = tok(" I guess the number is eight, then nine.", add_special_tokens=False)["input_ids"]
        self.ids, self.max_model_len, self.model_path, self.version = ids * 64, max_model_len, None, 0

    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        from agentrl.inference.base import Generation

        out = self.ids[: params.max_tokens]
        await asyncio.sleep(0)
        return Generation(out, [-0.1] * len(out), [0] * len(out), "length")

    async def generate_streaming(self, prompt_ids, params, *, request_id, session_id=None, on_tokens):
        gen = await self.generate(prompt_ids, params, request_id=request_id, session_id=session_id)
        ids, k = gen.token_ids, params.stream_interval  # the first at once, then k at a time (vLLM's rule)
        for chunk in [ids[:1]] + [ids[i:i + k] for i in range(1, len(ids), k)]:
            if chunk:
                on_tokens(chunk)
        return gen

    async def abort(self, request_id):
        pass

    async def close(self):
        pass


def exact_length(engine: Any) -> Any:
    """``engine`` with every request's end-of-sequence ignored (equal work on every side, whatever a dialect can
    ask for: only chat completions has ``ignore_eos``)."""
    from agentrl.inference.base import InferenceEngine

    class Exact(InferenceEngine):
        max_model_len, model_path = engine.max_model_len, engine.model_path

        async def generate(self, prompt_ids, params, **kw):
            return await engine.generate(prompt_ids, dataclasses.replace(params, ignore_eos=True), **kw)

        async def generate_streaming(self, prompt_ids, params, **kw):
            return await engine.generate_streaming(prompt_ids, dataclasses.replace(params, ignore_eos=True), **kw)

        async def update_weights(self, state_dict, version):
            return await engine.update_weights(state_dict, version)

        @property
        def version(self):
            return engine.version

        async def abort(self, request_id):
            await engine.abort(request_id)

        async def close(self):
            await engine.close()

    return Exact()


GC = {"s": 0.0, "full": 0, "t0": 0.0}  # the cyclic garbage collector's time in this process, and its full passes


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        GC["t0"] = time.perf_counter()
    else:
        GC["s"] += time.perf_counter() - GC["t0"]
        GC["full"] += info["generation"] == 2


LAG: list[tuple[float, float]] = []  # (when, how late) of a 10 ms sleep in this event loop
LATENCY: list[float] = []  # each gateway request's round trip, as the harness sees it
TTFT: list[float] = []  # each streamed request's time to its first text delta


async def lag_sentinel() -> None:
    """Records how late the event loop wakes a 10 ms sleep: the process's own scheduling delay (machine load), to
    tell a slow request caused by it from one caused by the gateway."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        LAG.append((now, now - t - 0.01))


def stalls(t0: float, t1: float) -> dict[str, float]:
    lags = [x for when, x in LAG if t0 <= when <= t1] or [0.0]
    return {"loop_lag_max_s": max(lags), "request_max_s": max(LATENCY, default=0.0)}


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


async def run_native(engine, tok, args, tag: str) -> dict:
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig

    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=args.tokens, ignore_eos=True, max_turns=args.turns + 1,
                        max_context_tokens=4096)
    policy = AgentLoopPolicy(engine, tok, cfg)
    specs = [EpisodeSpec(f"{__name__}:FixedTurnsEnv", env_kwargs={"turns": args.turns}, seed=i)
             for i in range(args.episodes)]
    t0, c0, g0 = time.perf_counter(), time.process_time(), dict(GC)
    async with EnvManager(ManagerConfig(max_concurrency=args.episodes, max_turns=args.turns + 1), policy) as mgr:
        trajs = await mgr.run_episodes(specs)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    bad = [t.error for t in trajs if t.termination != "terminated"]
    if bad:
        raise RuntimeError(f"native episodes failed: {bad[:2]}")
    n = sum(t.num_generated for t in trajs)
    return {"tokens": n, "wall_s": dt, "tok_per_s": n / dt, "cpu_ms_per_turn": 1e3 * cpu / (args.episodes * args.turns),
            **gc_since(g0)}


def gc_since(g0: dict) -> dict[str, float]:
    return {"gc_s": GC["s"] - g0["s"], "gc_full": GC["full"] - g0["full"]}


# -- the harnesses: one user-style loop, one way to ask per side ------------------------------------------------------
def _raw_request(dialect: str, ctx, msgs, args, stream: bool) -> tuple[str, dict]:
    """(path, body) of one request in ``dialect``'s own JSON, as a harness without an SDK sends it."""
    if dialect == "chat":
        return "/chat/completions", {"model": ctx.model, "messages": msgs, "max_tokens": args.tokens}
    if dialect == "gemini":  # streaming is in the path, not the body
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/models/{ctx.model}:{method}", {
            "systemInstruction": {"parts": [{"text": msgs[0]["content"]}]},
            "contents": [{"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]}
                         for m in msgs[1:]],
            "generationConfig": {"maxOutputTokens": args.tokens}}
    if dialect == "messages":
        return "/messages", {"model": ctx.model, "system": msgs[0]["content"], "messages": msgs[1:],
                             "max_tokens": args.tokens}
    return "/responses", {"model": ctx.model, "instructions": msgs[0]["content"], "max_output_tokens": args.tokens,
                          "input": [{"role": m["role"], "content": m["content"]} for m in msgs[1:]]}


def _gemini_text(r: dict) -> str:
    return "".join(p.get("text", "") for c in r.get("candidates") or [] for p in c["content"]["parts"]
                   if not p.get("thought"))


def _raw_text(dialect: str, r: dict) -> str:
    if dialect == "chat":
        return r["choices"][0]["message"]["content"]
    if dialect == "gemini":
        return _gemini_text(r)
    if dialect == "messages":
        return "".join(b.get("text", "") for b in r["content"] if b.get("type") == "text")
    return "".join(c.get("text", "") for item in r["output"] if item.get("type") == "message"
                   for c in item["content"] if c.get("type") == "output_text")


def _raw_delta(dialect: str, ev: dict) -> str:
    if dialect == "chat":
        return "".join((c.get("delta") or {}).get("content") or "" for c in ev.get("choices") or [])
    if dialect == "gemini":
        return _gemini_text(ev)
    if dialect == "messages":
        d = ev.get("delta") or {}
        return d.get("text", "") if ev.get("type") == "content_block_delta" and d.get("type") == "text_delta" else ""
    return ev.get("delta", "") if ev.get("type") == "response.output_text.delta" else ""


def ask_raw(dialect: str):
    async def ask(http, ctx, msgs, args, stream):
        path, body = _raw_request(dialect, ctx, msgs, args, stream)
        t0, parts = time.perf_counter(), []
        streamed = {**body, "stream": True} if stream and dialect != "gemini" else body
        async with http.post(ctx.base_url + path, json=streamed) as resp:
            if resp.status != 200 or not stream:
                r = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(r)
                return _raw_text(dialect, r)
            async for line in resp.content:  # server-sent events: the JSON of each `data:` line
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                part = _raw_delta(dialect, json.loads(line[5:]))
                if part:
                    if not parts:
                        TTFT.append(time.perf_counter() - t0)
                    parts.append(part)
        return "".join(parts)

    return ask


async def ask_chat(c, ctx, msgs, args, stream):
    if not stream:
        r = await c.chat.completions.create(model=ctx.model, messages=msgs, max_tokens=args.tokens)
        return r.choices[0].message.content
    return await _read(c.chat.completions.create(model=ctx.model, messages=msgs, max_tokens=args.tokens, stream=True),
                       lambda ch: "".join(d.delta.content or "" for d in ch.choices))


async def ask_messages(c, ctx, msgs, args, stream):
    kw = dict(model=ctx.model, system=msgs[0]["content"], messages=msgs[1:], max_tokens=args.tokens)
    if not stream:
        r = await c.messages.create(**kw)
        return "".join(b.text for b in r.content if b.type == "text")
    return await _read(c.messages.create(stream=True, **kw), lambda ev: ev.delta.text if (
        ev.type == "content_block_delta" and ev.delta.type == "text_delta") else "")


async def ask_responses(c, ctx, msgs, args, stream):
    kw = dict(model=ctx.model, instructions=msgs[0]["content"], max_output_tokens=args.tokens,
              input=[{"role": m["role"], "content": m["content"]} for m in msgs[1:]])
    if not stream:
        return (await c.responses.create(**kw)).output_text
    return await _read(c.responses.create(stream=True, **kw),
                       lambda ev: ev.delta if ev.type == "response.output_text.delta" else "")


async def _read(request, text_of) -> str:
    """The text of a streamed reply (its deltas); the time from sending ``request`` (the client's not yet awaited
    call, which returns once the response's headers came) to the first non-empty delta goes to ``TTFT``."""
    t0, parts = time.perf_counter(), []
    async for ev in await request:
        part = text_of(ev)
        if part:
            if not parts:
                TTFT.append(time.perf_counter() - t0)
            parts.append(part)
    return "".join(parts)


ASK = {"aiohttp": ask_raw("chat"), "aiohttp-chat": ask_raw("chat"), "aiohttp-messages": ask_raw("messages"),
       "aiohttp-responses": ask_raw("responses"), "aiohttp-gemini": ask_raw("gemini"), "chat": ask_chat,
       "messages": ask_messages, "responses": ask_responses}


class SideClient:
    """A side's HTTP client: for the official libraries one client (one connection pool) shared by all episodes,
    built by :meth:`open` before the timed run (building one loads the CA bundle, ~0.15 s of CPU: the harness's
    start-up, not the gateway's cost), each episode using it with its own session key; for ``aiohttp`` a session per
    episode."""

    def __init__(self, dialect: str):
        self.dialect, self.shared = dialect, None

    def _base(self, url: str) -> str:  # the Anthropic client adds /v1 itself
        return url.removesuffix("/v1") if self.dialect == "messages" else url

    @property
    def bare(self) -> bool:
        return self.dialect.startswith("aiohttp")

    def open(self, base_url: str) -> None:
        if self.dialect == "messages":
            import anthropic

            self.shared = anthropic.AsyncAnthropic(base_url=self._base(base_url), api_key="-", max_retries=0)
        elif not self.bare:
            import openai

            self.shared = openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0)

    def for_episode(self, ctx) -> Any:
        if self.shared is None:
            import aiohttp

            key = {"x-api-key": ctx.api_key} if self.dialect == "aiohttp-messages" else \
                {"x-goog-api-key": ctx.api_key} if self.dialect == "aiohttp-gemini" else \
                {"Authorization": f"Bearer {ctx.api_key}"}
            return aiohttp.ClientSession(headers=key)
        return contextlib.nullcontext(self.shared.with_options(base_url=self._base(ctx.base_url), api_key=ctx.api_key))

    async def close(self) -> None:
        if self.shared is not None:
            await self.shared.close()


def make_harness(side: str, args) -> tuple[Any, SideClient]:
    """The episode's harness for one side (the whole conversation sent each turn in the side's dialect) and its
    client (open it once the gateway's URL is known, close it after the run)."""
    dialect, stream = side.removesuffix("-stream"), side.endswith("-stream")
    ask, client = ASK[dialect], SideClient(dialect)

    async def harness(ctx):
        msgs = opening(ctx.seed)
        async with client.for_episode(ctx) as c:
            for _ in range(args.turns):
                t = time.perf_counter()
                text = await ask(c, ctx, msgs, args, stream)
                LATENCY.append(time.perf_counter() - t)
                msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": ENV_REPLY}]
        return 0.0

    return harness, client


async def run_gateway(engine, tok, args, side: str, tag: str) -> dict:
    from agentrl.gateway import HARNESS_ENV_ID, GatewayConfig, HarnessPolicy
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig

    cfg = GatewayConfig(port=0, max_sessions=4 * args.episodes, sampling="config", temperature=1.0)
    if args.stream_interval is not None:
        cfg.stream_interval = args.stream_interval
    harness, client = make_harness(side, args)
    policy = HarnessPolicy(engine, tok, harness, cfg)
    specs = [EpisodeSpec(HARNESS_ENV_ID, seed=i) for i in range(args.episodes)]
    client.open((await policy.start()).url + "/v1")
    LATENCY.clear()
    TTFT.clear()
    try:
        t0, c0, g0 = time.perf_counter(), time.process_time(), dict(GC)
        async with EnvManager(ManagerConfig(max_concurrency=args.episodes, max_turns=args.turns + 2), policy) as mgr:
            trajs = await mgr.run_episodes(specs)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await policy.aclose()
        await client.close()
    bad = [t.error for t in trajs if t.termination != "terminated"]
    if bad:
        raise RuntimeError(f"gateway episodes ({side}) failed: {bad[:2]}")
    n = sum(t.num_generated for t in trajs)
    m = policy.metrics()
    ttft = sorted(TTFT)
    return {"tokens": n, "wall_s": dt, "tok_per_s": n / dt, "cpu_ms_per_turn": 1e3 * cpu / (args.episodes * args.turns),
            **stalls(t0, t0 + dt), **gc_since(g0), "drift_rate": m["gateway/drift_rate"],
            "segments_per_session": m["gateway/segments_per_session"], "streamed_requests": len(ttft),
            **({"ttft_median_s": statistics.median(ttft), "ttft_p90_s": ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))]}
               if ttft else {})}


async def main_async(args) -> dict:
    from agentrl.chat import load_tokenizer
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.models import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    tok = load_tokenizer(model)
    cfg = EngineConfig(model=model, max_model_len=max(1024, 96 + args.turns * (args.tokens + 48)),
                       max_num_seqs=max(args.episodes, 16))
    if args.engine == "instant":
        engine = exact_length(InstantEngine(tok, cfg.max_model_len))
    else:
        engine = exact_length(await asyncio.to_thread(make_engine, cfg))
    load_before = loadavg()
    gc.callbacks.append(_gc_timer)
    sentinel = asyncio.ensure_future(lag_sentinel())
    runs: dict[str, list[dict[str, Any]]] = {"native": [], **{s: [] for s in args.sides}}
    pairs: dict[str, list[float]] = {s: [] for s in args.sides}  # side / the native run just before it
    try:
        with gcheap.settled():  # the collector as `agentrl train` runs its RL phase, for every side
            warm = argparse.Namespace(**{**vars(args), "episodes": min(args.episodes, 8), "turns": 2})
            await run_native(engine, tok, warm, "warm-n")
            for side in args.sides:
                await run_gateway(engine, tok, warm, side, f"warm-{side}")
            for r in range(args.repeats):
                for side in args.sides:
                    native = await run_native(engine, tok, args, f"n{r}-{side}")
                    res = await run_gateway(engine, tok, args, side, f"g{r}-{side}")
                    runs["native"].append(native)
                    runs[side].append(res)
                    pairs[side].append(res["tok_per_s"] / native["tok_per_s"])
                    print(f"repeat {r} {side}: native {native['tok_per_s']:.0f} tok/s, gateway {res['tok_per_s']:.0f} "
                          f"tok/s, {pairs[side][-1]:.3f}x (load {loadavg()})", file=sys.stderr)
    finally:
        sentinel.cancel()
        gc.callbacks.remove(_gc_timer)
        await engine.close()
    med = {k: statistics.median(x["tok_per_s"] for x in v) for k, v in runs.items()}
    cpu = {k: statistics.median(x["cpu_ms_per_turn"] for x in v) for k, v in runs.items()}
    expected = args.episodes * args.turns * args.tokens
    return {"episodes": args.episodes, "turns": args.turns, "tokens_per_turn": args.tokens, "sides": list(args.sides),
            "engine": args.engine, "stream_interval": args.stream_interval, "runs": runs, "paired_ratios": pairs,
            "median_tok_per_s": med,
            "median_cpu_ms_per_turn": cpu,
            "all_lengths_exact": all(x["tokens"] == expected for v in runs.values() for x in v),
            "ratio_over_native": {s: statistics.median(pairs[s]) for s in args.sides},
            "ratio_of_medians": {s: med[s] / med["native"] for s in args.sides},
            "loadavg_before": load_before, "loadavg_after": loadavg()}


def table(out: dict) -> str:
    rows = ["| side | median tok/s | runs (tok/s) | gateway / native (median of pairs; of medians) | TTFT median / p90 "
            "| driver CPU ms per turn (median) | drift rate | tokens per run |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for k in ("native", *out["sides"]):
        v = out["runs"][k]
        each = ", ".join(f"{x['tok_per_s']:.0f}" for x in v)
        ratio = "1" if k == "native" else \
            f"**{out['ratio_over_native'][k]:.3f}x**; {out['ratio_of_medians'][k]:.3f}x"
        ttft = f"{statistics.median(x['ttft_median_s'] for x in v) * 1e3:.0f} / " \
               f"{statistics.median(x['ttft_p90_s'] for x in v) * 1e3:.0f} ms" if v and "ttft_median_s" in v[0] else "-"
        drift = f"{max(x['drift_rate'] for x in v):.2f}" if k != "native" else "-"
        rows.append(f"| {k} | {out['median_tok_per_s'][k]:.0f} | {each} | {ratio} | {ttft} | "
                    f"{out['median_cpu_ms_per_turn'][k]:.2f} | {drift} | {v[0]['tokens']} |")
    rows.append("")
    rows.append("slowest request / event loop's worst scheduling lag per gateway run (s): " + "; ".join(
        f"{k} " + ", ".join(f"{x['request_max_s']:.2f} / {x['loop_lag_max_s']:.2f}" for x in out["runs"][k])
        for k in out["sides"]) + " (a slow request with as much lag is the machine's load, not the gateway)")
    rows.append("")
    rows.append("garbage collector, seconds (full passes) per run: " + "; ".join(
        f"{k} " + ", ".join(f"{x['gc_s']:.2f} ({x['gc_full']})" for x in out["runs"][k])
        for k in ("native", *out["sides"])))
    rows.append("")
    rows.append(f"{out['episodes']} episodes x {out['turns']} turns x {out['tokens_per_turn']} tokens, engine "
                f"{out['engine']}; stream_interval {out['stream_interval'] or 'default'}; exact lengths: "
                f"{out['all_lengths_exact']}; load average {out['loadavg_before']} -> {out['loadavg_after']}")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="generated tokens per turn (exact, ignore_eos)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sides", default="aiohttp",
                   help=f"comma-separated gateway sides among {', '.join(SIDES)}; 'dialects': the official-client "
                        f"ones; 'bare': the bare aiohttp ones (the gateway itself, per dialect); 'all': every side "
                        f"(default: aiohttp, chat completions)")
    p.add_argument("--engine", choices=("vllm", "instant"), default="vllm",
                   help="instant: no model, tokens returned at once (measures each side's per-turn CPU)")
    p.add_argument("--smoke", action="store_true",
                   help="2 episodes x 2 turns x 8 tokens, 1 repeat, every side: each runs end to end (no figures)")
    p.add_argument("--stream-interval", type=int, default=None,
                   help="the gateway's stream_interval (tokens per streamed delta after the first); default: its own")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.episodes, args.turns, args.tokens, args.repeats, args.sides = 2, 2, 8, 1, "all"
    named = {"dialects": DIALECT_SIDES, "bare": BARE_SIDES, "all": SIDES}
    args.sides = named.get(args.sides) or tuple(x.strip() for x in args.sides.split(",") if x.strip())
    unknown = [x for x in args.sides if x not in SIDES]
    if unknown or not args.sides:
        p.error(f"--sides: unknown side(s) {unknown}; choose among {', '.join(SIDES)}, 'dialects' or 'all'")
    return args


def main() -> int:
    args = parse_args()
    out = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=2) + "\n")
    print(table(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
