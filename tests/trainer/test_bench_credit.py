"""benchmarks/bench_credit.py's aggregation: curves from a run's files, mean and sd over seeds per step, the first
step reaching the threshold, and the report from a directory of finished runs (no training here)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_credit", ROOT / "benchmarks" / "bench_credit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_curve_takes_before_every_eval_row_and_after(bench):
    summary = {"eval_before": {"success": 0.25}, "eval_after": {"success": 0.75}}
    rows = [{"step": 1, "reward": 0.1}, {"step": 2, "eval/success": 0.5}, {"step": 3}, {"step": 4, "eval/success": 0.6}]
    assert bench.curve(summary, rows, 6) == [(0, 0.25), (2, 0.5), (4, 0.6), (6, 0.75)]
    assert bench.curve({}, rows, 6) == [(2, 0.5), (4, 0.6)]  # a run without its evaluations: only what it has


def test_mean_sd_is_the_sample_sd(bench):
    assert bench.mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert bench.mean_sd([0.5]) == (0.5, 0.0)
    assert all(math.isnan(x) for x in bench.mean_sd([]))


def test_first_reaching(bench):
    pts = [(0, 0.2), (10, 0.29), (20, 0.3), (30, 0.1)]
    assert bench.first_reaching(pts, 0.3) == 20
    assert bench.first_reaching(pts, 0.31) is None


def test_aggregate_per_step_over_seeds_and_threshold_from_the_shared_start(bench):
    runs = [
        {"env": "lake", "estimator": "grpo", "seed": 0, "points": [(0, 0.4), (10, 0.5), (20, 0.6)], "wall_s": 60.0},
        {"env": "lake", "estimator": "grpo", "seed": 1, "points": [(0, 0.4), (10, 0.7), (20, 0.8)], "wall_s": 120.0},
        {"env": "lake", "estimator": "gigpo", "seed": 0, "points": [(0, 0.6), (10, 0.6)]},  # stopped early
    ]
    agg = bench.aggregate(runs, gain=0.1)
    # Threshold: mean of the three step-0 values (0.4, 0.4, 0.6) + 0.1 = 0.5667.
    assert list(agg["lake"]) == ["grpo", "gigpo"]  # the shipped order, not the order seen
    g = agg["lake"]["grpo"]
    assert g["threshold"] == pytest.approx(0.4666667 + 0.1)
    assert g["seeds"] == [0, 1]
    assert [(p["step"], p["n"]) for p in g["curve"]] == [(0, 2), (10, 2), (20, 2)]
    assert g["curve"][1]["mean"] == pytest.approx(0.6) and g["curve"][1]["sd"] == pytest.approx(math.sqrt(0.02))
    assert g["before"] == (0.4, 0.0)
    assert g["after"][0] == pytest.approx(0.7) and g["gain"][0] == pytest.approx(0.3)
    assert g["first_step_reaching"] == [20, 10]
    gi = agg["lake"]["gigpo"]
    assert gi["first_step_reaching"] == [0] and gi["after"] == (0.6, 0.0) and gi["gain"] == (0.0, 0.0)


def test_collect_report_and_plot_from_run_directories(bench, tmp_path):
    for est, seed, after in (("grpo", 0, 0.5), ("grpo", 1, 0.7), ("gigpo", 0, 0.9)):
        d = tmp_path / "tooluse" / f"{est}-seed{seed}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({
            "steps": 4, "rl_wall_s": 120.0,
            "eval_before": {"success": 0.25, "tasks": 64.0}, "eval_after": {"success": after, "tasks": 64.0}}))
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
            {"step": 1, "train/loss": 0.1, "train/adv/std": 1.0}, {"step": 2, "train/loss": float("nan"), "eval/success": 0.3},
            {"step": 3, "train/adv/std": 0.5}, {"step": 4})))
        (d / "bench.json").write_text(json.dumps({"cmd": "agentrl train ...", "load_start": 1.0, "load_end": 2.0}))
    (tmp_path / "tooluse" / "gigpo-seed1").mkdir()  # unfinished: no summary.json, left out
    runs, tasks = bench.collect(tmp_path, ["tooluse"])
    assert tasks == {"tooluse": 64}
    assert sorted((r["estimator"], r["seed"]) for r in runs) == [("gigpo", 0), ("grpo", 0), ("grpo", 1)]
    r = next(r for r in runs if r["estimator"] == "gigpo")
    assert r["points"] == [(0, 0.25), (2, 0.3), (4, 0.9)] and r["nonfinite_steps"] == 1
    assert r["mean_train/adv/std"] == 0.75 and r["mean_train/grad_norm"] is None
    assert r["load_start"] == 1.0 and r["load_end"] == 2.0
    agg = bench.aggregate(runs, gain=0.1)
    text = bench.table(agg, tasks)
    assert "| tooluse | grpo | 2 | 64 | 0.250 ± 0.000 | **0.600 ± 0.141** |" in text
    assert "| tooluse | gigpo | 1 | 64 |" in text and "≥ 0.350: 4" in text
    png = bench.plot(agg, tmp_path / "credit.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_step_group_stats_counts_what_gigpo_can_compare(bench):
    def traj(group, rewards, keys, step=1):
        return {"group_id": group, "rewards": rewards, "info": {"state_keys": keys}, "_step": step}

    trajs = [
        traj("a", [0.0, 1.0], ["s", "x"]),         # from s: return 1; from x: 1
        traj("a", [0.0, 0.0, 0.0], ["s", "x", "y"]),  # from s: 0; from x: 0; y alone
        traj("a", [1.0], ["s", "end"]),            # from s: 1 (the extra terminal key is not a turn)
        traj("b", [0.0], ["s"]),                   # another group: never compared with group a
        traj("a", [0.0], [None], step=2),          # the same group id at another step: its own batch, no key
    ]
    assert bench.step_group_stats(trajs) == {"turns": 8, "keyed": 7, "grouped": 5, "with_signal": 5}
    same = [traj("c", [1.0], ["s"]), traj("c", [1.0], ["s"])]
    assert bench.step_group_stats(same) == {"turns": 2, "keyed": 2, "grouped": 2, "with_signal": 0}


def test_a_claimed_cell_is_left_to_the_process_that_claimed_it(bench, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "_run_claimed", lambda *a: ran.append(a[:3]) or {"rc": 0})
    run_dir = tmp_path / "lake" / "gigpo-seed1"
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "gigpo-seed1.claim").touch()  # another grid process holds it
    assert bench.run_one("lake", "gigpo", 1, run_dir, None, [], None) == {} and ran == []
    (tmp_path / "lake" / "gigpo-seed1.claim").unlink()
    assert bench.run_one("lake", "gigpo", 1, run_dir, None, [], None) == {"rc": 0}
    assert ran == [("lake", "gigpo", 1)] and not (tmp_path / "lake" / "gigpo-seed1.claim").exists()


def test_arms_replace_the_estimators_with_their_own_overrides(bench, tmp_path, monkeypatch):
    cmds = []

    class Done:
        returncode = 0

    def fake_run(cmd, **kw):
        cmds.append(cmd)
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setattr(bench, "demos_in_eval_set", lambda *a: 0)
    (tmp_path / "ws" / "warmstart" / "model").mkdir(parents=True)
    rc = bench.main(["--out", str(tmp_path / "out"), "--envs", "lake", "--seeds", "0",
                     "--warm-start", f"lake={tmp_path / 'ws'}",
                     "--arm", "full=", "--arm", "lora=trainer.lora.rank=16,trainer.optimizer.lr=1e-3"])
    assert rc == 1  # the fake runs finished nothing: reported, not a crash in the plot
    by_dir = {next(a for a in c if a.startswith("run_dir=")).rpartition("/")[2]: c for c in cmds}
    assert set(by_dir) == {"full-seed0", "lora-seed0"}
    assert not any("estimator" in a or "lora" in a for a in by_dir["full-seed0"])
    assert {"trainer.lora.rank=16", "trainer.optimizer.lr=1e-3"} <= set(by_dir["lora-seed0"])
    with pytest.raises(SystemExit, match="--arm"):
        bench.main(["--out", str(tmp_path / "out"), "--arm", "no-overrides"])
