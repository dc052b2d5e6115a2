"""The table of benchmarks/bench_schedulers.py: it renders the rows its runs produce, held-out evaluation or not."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = importlib.import_module("bench_schedulers")


def _row(name: str, step_s: float, before: float | None, after: float | None) -> dict:
    return {"name": name, "mean_step_s": step_s, "trainer_idle": 0.6, "rollout_idle": 0.4, "long_rounds": None,
            "short_rounds": None, "deferred_total": None, "staleness_max": 0.0, "gen_p50": 18, "gen_p90": 54,
            "gen_max": 96, "eval_before": before, "eval_after": after, "load_start": 2.0, "load_end": 2.5}


def test_a_run_without_held_out_evaluation_renders_a_dash_not_a_crash():
    # `--eval 0` ran every variant and wrote the JSON, then the table raised formatting the missing rewards.
    lines = bench.table([_row("sync", 8.0, 0.5, 0.75), _row("alpha2", 6.0, None, None)]).splitlines()
    assert "| 0.500 → 0.750 |" in lines[2]
    assert "| 1.33× |" in lines[3] and "| - → - |" in lines[3]
