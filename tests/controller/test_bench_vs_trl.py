"""The pure parts of benchmarks/bench_vs_trl.py, without trl: the threshold and ratio maths, one scorer for both
frameworks' checkpoints, held-out tasks kept out of both frameworks' training seeds, and the trl-side env wrapper
paying the same episode reward as the agentrl env for the same actions."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
common = importlib.import_module("vs_trl_common")
bench = importlib.import_module("bench_vs_trl")
trl_side = importlib.import_module("trl_side")

pytestmark = pytest.mark.timeout(120)
TOOLUSE = common.TASKS["tooluse"]


def test_crossing_time_is_the_first_checkpoint_at_or_above_the_threshold_in_time_order():
    pts = [(90.0, 0.7), (30.0, 0.4), (60.0, 0.55), (120.0, 0.5)]
    assert common.crossing_time(pts, 0.55) == 60.0
    assert common.crossing_time(pts, 0.7) == 90.0
    assert common.crossing_time(pts, 0.71) is None
    assert common.crossing_time([], 0.1) is None
    assert common.crossing_time([(float("nan"), 1.0), (5.0, 0.2)], 0.5) is None  # a point without a time is dropped


def test_no_threshold_when_no_run_beat_the_warm_start():
    assert common.default_threshold(0.30, 0.70) == pytest.approx(0.5)
    assert common.default_threshold(0.0, 0.0) is None and common.default_threshold(0.4, 0.3) is None
    assert common.crossing_time([(10.0, 0.0)], None) is None  # not "reached at the first checkpoint"


def test_a_halfway_threshold_that_is_a_success_rate_of_the_held_out_set_is_reached_by_that_rate():
    """aiw, 128 held-out questions: warm start 59/128, best 81/128, halfway 70/128 = 0.546875. Rounded to 0.547 it
    asked for 71 right, and a run that reached 70/128 first did not count as reaching it."""
    threshold = common.default_threshold(59 / 128, 81 / 128)
    assert common.crossing_time([(37.0, 70 / 128), (219.0, 71 / 128)], threshold) == 37.0


def test_success_at_equal_wall_time_is_the_newest_checkpoint_scored_by_then():
    pts = [(30.0, 0.4), (60.0, 0.55), (90.0, 0.3)]
    assert common.success_at(pts, 29.9) is None
    assert common.success_at(pts, 60.0) == 0.55
    assert common.success_at(pts, 89.0) == 0.55
    assert common.success_at(pts, 1e9) == 0.3  # the last one shown, not the best


def test_cpu_at_interpolates_the_runs_cpu_samples():
    timeline = [(0.0, 0.0), (10.0, 15.0), (20.0, 35.0)]
    assert common.cpu_at(timeline, 5.0) == 7.5
    assert common.cpu_at(timeline, 15.0) == 25.0
    assert common.cpu_at(timeline, 99.0) == 35.0  # past the last sample: what it had used by then
    assert common.cpu_at(timeline, None) is None and common.cpu_at([], 3.0) is None


def test_ratio_and_mean_say_none_when_a_run_never_got_there():
    assert common.ratio(300.0, 100.0) == 3.0
    assert common.ratio(None, 100.0) is None and common.ratio(300.0, None) is None
    assert common.mean([100.0, 300.0]) == 200.0
    assert common.mean([100.0, None]) is None


def test_summary_ratio_is_trl_time_over_agentrl_time_at_the_same_threshold():
    def run(mode, seed, points):
        return {"mode": mode, "seed": seed, "points": points, "cpu_s": 200.0, "wall_s": 100.0,
                "cpu_timeline": [(0.0, 0.0), (300.0, 600.0)],
                "peak_rss_mib": 1.0, "load_min": 0.0, "load_max": 1.0, "load_mean": 0.5}

    runs = [run("agentrl-async", 0, [(50.0, 0.6)]), run("agentrl-async", 1, [(70.0, 0.6)]),
            run("trl", 0, [(100.0, 0.5), (240.0, 0.6)]), run("trl", 1, [(120.0, 0.65)])]
    s = bench.summarise(runs, ws_score=0.4, threshold=0.6, budget_s=300.0)
    assert s["modes"]["trl"]["time_to_threshold_s"] == [240.0, 120.0]
    assert s["modes"]["agentrl-async"]["cpu_to_threshold_s"] == [100.0, 140.0]  # 2 CPU-s per wall second
    assert s["trl_over_agentrl_time_to_threshold"]["agentrl-async"] == pytest.approx(180.0 / 60.0)
    assert s["modes"]["trl"]["success_at_budget"] == [0.6, 0.65]


def test_both_frameworks_checkpoints_go_through_the_one_scorer(tmp_path, monkeypatch):
    # agentrl's layout: checkpoints/step_N/model with step_N.json written after it; trl's: checkpoints.jsonl
    ag = tmp_path / "agentrl"
    (ag / "checkpoints" / "step_000005" / "model").mkdir(parents=True)
    (ag / "checkpoints" / "step_000005.json").write_text("{}")
    tr = tmp_path / "trl"
    tr.mkdir()
    (tr / "checkpoints.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "dir": str(tr / "ckpt" / "0000"), "t": 4.0},  # the warm start again: not a trl point
        {"step": 7, "dir": str(tr / "ckpt" / "0001"), "t": 40.0}]))
    t0 = (ag / "checkpoints" / "step_000005.json").stat().st_mtime - 12.5
    runs = [{"mode": "agentrl-async", "checkpoints": bench.checkpoints("agentrl-async", ag, t0)},
            {"mode": "trl", "checkpoints": bench.checkpoints("trl", tr, 0.0)}]
    assert runs[0]["checkpoints"] == [(pytest.approx(12.5), str(ag / "checkpoints" / "step_000005" / "model"), 5)]
    assert runs[1]["checkpoints"] == [(40.0, str(tr / "ckpt" / "0001"), 7)]

    calls = []

    def fake_score(model_dir, tokenizer_dir, task, seeds, batch=64):
        calls.append((model_dir, tokenizer_dir, task.name, tuple(seeds)))
        return {"success": 0.5, "reward": 0.5, "episodes": float(len(seeds)), "distinct_tasks": float(len(seeds))}

    monkeypatch.setattr(common, "score", fake_score)
    monkeypatch.setattr(bench, "base_model_dir", lambda task: "TOK")
    scores = bench.score_all(TOOLUSE, tmp_path, runs, tmp_path / "ws", [1, 2, 3])
    assert sorted(c[0] for c in calls) == sorted([str(tmp_path / "ws"), runs[0]["checkpoints"][0][1],
                                                   runs[1]["checkpoints"][0][1]])
    assert {c[1:] for c in calls} == {("TOK", "tooluse", (1, 2, 3))}  # same tokenizer, task and held-out seeds
    bench.score_all(TOOLUSE, tmp_path, runs, tmp_path / "ws", [1, 2, 3])
    assert len(calls) == 3 and len(scores) == 3  # cached: a report rerun scores nothing again


def test_training_seeds_of_both_sides_avoid_every_held_out_task():
    held = common.heldout(TOOLUSE, 32)
    try:
        assert len(held.eval_seeds) == 32 and len(held.eval_keys) == 32  # distinct tasks
        seeds = common.train_seeds(TOOLUSE, 32, 200, seed_start=100_000)
        assert seeds[0] >= 100_000 and len(set(seeds)) == 200
        assert not {held.key(s) for s in seeds} & held.eval_keys
    finally:
        held.close()


def test_trl_side_env_pays_the_agentrl_episode_reward_for_the_same_actions():
    from agentrl.envs.tool_lookup import ToolLookupEnv, solve
    from agentrl.tools import parse_tool_calls

    for seed in range(6):
        env, wrapped = ToolLookupEnv(), trl_side.ToolLookupTRL()
        conv, _ = env.reset(seed=seed)
        wrapped.reset(seed=seed)
        total, done = 0.0, False
        actions = ['<tool_call>{"name": "lookup", "arguments": {"name": "Nobody"}}</tool_call>']  # invalid: -0.1
        while not done:
            action = actions.pop(0) if actions else solve(conv)
            obs, r, done, _, _ = env.step(action)
            total += r
            conv = conv + [{"role": "assistant", "content": action}, *obs]
            calls = parse_tool_calls(action).calls
            if done:
                got = trl_side.episode_reward([[{"role": "assistant", "content": action}]], [wrapped])[0]
            elif calls:
                getattr(wrapped, calls[0].name)(**calls[0].arguments)  # what trl's tool loop calls
        assert got == pytest.approx(total) == pytest.approx(0.9)


@pytest.mark.timeout(600)  # a few greedy generate calls: seconds on a quiet machine
def test_scorer_plays_distinct_held_out_tasks_with_a_real_model(tiny_model_dir):
    held = common.heldout(TOOLUSE, 3)
    seeds = list(held.eval_seeds)
    held.close()
    out = common.score(str(tiny_model_dir), str(tiny_model_dir), TOOLUSE, seeds, batch=4)
    assert out["episodes"] == 3.0 and out["distinct_tasks"] == 3.0
    assert 0.0 <= out["success"] <= 1.0 and -1.0 <= out["reward"] <= 1.0


def test_every_race_task_plays_the_env_its_agentrl_config_trains_on():
    from agentrl.controller.config import load_config

    for task in common.TASKS.values():
        env = load_config(ROOT / task.config).env
        assert (task.env_id, dict(task.env_kwargs)) == (env.id, dict(env.kwargs)), task.name
        assert task.max_turns == load_config(ROOT / task.config).rollout.max_turns, task.name


def test_trl_single_turn_reward_is_the_agentrl_envs_reward_for_the_same_answer():
    import agentrl

    task = common.TASKS["family"]
    reward = trl_side.SingleTurnReward(task.env_id, dict(task.env_kwargs))
    env = agentrl.make(task.env_id, **task.env_kwargs)
    seeds = [3, 17, 40, 41]
    golds, answers = [], []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        assert reward.prompt(s) == [dict(m) for m in obs]  # trl's prompt is the env's first observation
        golds.append(env.unwrapped.solve(list(obs)))
    answers = [golds[0], "<answer>nobody</answer>", "no answer block", golds[3]]
    expected = []
    for s, a in zip(seeds, answers):
        env.reset(seed=s)
        expected.append(env.step(a)[1])
    # trl hands the completions as conversations (its chat format) and the dataset's seed column as a keyword
    got = reward([[{"role": "assistant", "content": a}] for a in answers], seed=seeds)
    assert got == pytest.approx(expected)
    assert got[0] == got[3] == 1.0 and got[1] < 1.0


def test_checkpoints_are_scored_on_a_time_grid_then_bisected_at_the_threshold_crossing():
    cks = [(float(t), f"c{t}", t) for t in range(5, 200, 5)]  # a checkpoint every 5 s
    grid = common.grid_pick(cks, 30.0)
    assert grid == ["c30", "c60", "c90", "c120", "c150", "c180", "c195"]  # every 30 s, and the last
    assert common.grid_pick([(12.0, "a", 1), (75.0, "b", 2)], 30.0) == ["b"]  # one per reached grid point
    truth = {d: (0.2 if t < 70 else 0.6) for t, d, _ in cks}  # first reached 0.5 at 70 s
    scored = {d: truth[d] for d in grid}
    picked = []
    while (d := common.refine_pick(cks, scored, 0.5)) is not None:
        picked.append(d)
        scored[d] = truth[d]
    assert common.crossing_time([(t, scored[d]) for t, d, _ in cks if d in scored], 0.5) == 70.0
    assert len(picked) <= 3  # a bisection of the 5 checkpoints between 60 s and 90 s, not all of them
    assert common.refine_pick(cks, {d: 0.1 for d in grid}, 0.5) is None  # never reached: nothing to refine
    assert common.refine_pick(cks, scored, None) is None
