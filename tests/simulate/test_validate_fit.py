"""The simulator validation's trainer fit (benchmarks/bench_simulate_validate.py): least squares with every
coefficient >= 0, refitted without the ones the free fit makes negative."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = importlib.import_module("bench_simulate_validate")


def _rows(fn, shapes):
    return {name: {"padded": p, "real": r, "step_s": fn(p, r)} for name, (p, r) in shapes.items()}


SHAPES = {"a": (7680, 7680), "b": (20480, 20480), "c": (20480, 4100), "d": (20480, 9920), "e": (12800, 12800)}


def test_an_exact_linear_cost_is_recovered():
    fit = bench.fit_trainer(_rows(lambda p, r: 0.05 + 4e-5 * p + 2e-5 * r, SHAPES))
    assert fit["step_overhead_s"] == pytest.approx(0.05, abs=1e-9)
    assert fit["s_per_padded_token"] == pytest.approx(4e-5, rel=1e-6)
    assert fit["s_per_real_token"] == pytest.approx(2e-5, rel=1e-6)


def test_a_negative_intercept_is_refitted_away_not_clamped():
    # Cost per token that grows with length (attention) makes the free fit's intercept negative, as measured on the
    # CPU trainer; clamping it to 0 afterwards put every prediction above every measurement.
    rows = _rows(lambda p, r: 3e-5 * p + 2e-5 * r + 1e-9 * p * p / 64, SHAPES)
    fit = bench.fit_trainer(rows)
    assert fit["step_overhead_s"] == 0.0
    assert min(fit.values()) >= 0
    resid = [fit["s_per_padded_token"] * r["padded"] + fit["s_per_real_token"] * r["real"] - r["step_s"]
             for r in rows.values()]
    assert min(resid) < 0 < max(resid)  # a fit passes between the points, not above all of them


def test_rounds_pool_by_variant_whatever_order_each_round_ran_them():
    def row(v, real, sim):
        return {"variant": v, "real_step_s": real, "sim_step_s": sim}

    pooled = bench.pool([[row("sync", 4.0, 5.0), row("tail", 2.0, 2.0)],
                         [row("tail", 6.0, 4.0), row("sync", 6.0, 4.0)]])
    assert [p["variant"] for p in pooled] == ["sync", "tail"]
    assert pooled[0]["real"] == [4.0, 6.0] and pooled[0]["sim"] == [5.0, 4.0]
    assert pooled[0]["error_of_means"] == pytest.approx(-0.1)  # 4.5 predicted against 5.0
    assert pooled[1]["error_of_means"] == pytest.approx(-0.25) and pooled[1]["real_spread"] == pytest.approx(1.0)
