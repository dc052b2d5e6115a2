"""benchmarks/bench_gateway.py's smoke mode end to end with the instant engine (no model): the native agent loop and
every gateway side (each dialect over a bare aiohttp client and over its official client, streamed and not) run
the same episodes to exact lengths without drift; the streamed sides time their first text delta; the report
renders. (The figures come from the full run on a quiet machine: the command in the script's docstring.)"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = importlib.import_module("bench_gateway")

pytestmark = pytest.mark.timeout(300)


async def test_smoke_runs_every_side_on_the_same_episodes():
    args = bench.parse_args(["--engine", "instant", "--smoke"])
    out = await bench.main_async(args)
    assert out["sides"] == list(bench.SIDES) and len(bench.SIDES) == 14
    per_run = args.episodes * args.turns * args.tokens
    assert out["all_lengths_exact"] and per_run == 2 * 2 * 8
    assert len(out["runs"]["native"]) == len(bench.SIDES)  # a native run paired with each side
    for side in bench.SIDES:
        (run,) = out["runs"][side]
        assert run["tokens"] == per_run and run["drift_rate"] == 0.0, (side, run)
        streamed = side.endswith("-stream")
        assert run["streamed_requests"] == (args.episodes * args.turns if streamed else 0), (side, run)
        assert ("ttft_median_s" in run) == streamed and run.get("ttft_median_s", 0.0) >= 0.0
        assert out["ratio_over_native"][side] > 0
    report = bench.table(out)
    assert all(f"| {s} |" in report for s in ("native", *bench.SIDES))


def test_sides_are_checked():
    assert bench.parse_args(["--sides", "dialects"]).sides == bench.DIALECT_SIDES
    assert bench.parse_args(["--sides", "bare"]).sides == bench.BARE_SIDES
    assert {s.removeprefix("aiohttp-") for s in bench.BARE_SIDES} - {"aiohttp"} == \
        set(bench.DIALECT_SIDES) - {"chat"} | {"gemini", "gemini-stream"}  # every dialect, streamed and not, bare
    assert bench.parse_args(["--sides", "chat, messages-stream"]).sides == ("chat", "messages-stream")
    assert bench.parse_args([]).sides == ("aiohttp",)  # the default measures the gateway itself, as before
    with pytest.raises(SystemExit):
        bench.parse_args(["--sides", "chat,grpc"])
