"""Learning evidence for off-policy training on the CPU quickstart (3x3 FrozenLake, the tiny model), in one command.

Three experiments, every run from the same warm-started model (built once, like the quickstart's warm start):

- ``consistency``: α = 0, learning rate 1e-30 (the weights do not move), rollout temperature 0.7, fp32, 20 steps:
  every step's proximal policy is the behaviour policy, so the PPO clip fraction, the IS truncation fraction and
  KL(μ‖π_prox) must all be ~0 (issue 12, defect 9).
- ``async``: α = 0 against α = 2, the same number of trained steps, ``--seeds`` seeds each: held-out reward curves
  (``--eval-episodes`` boards every ``--eval-every`` steps, seeds ≥ 1,000,000 never trained on) and wall time.
- ``losses``: at α = 4, decoupled PPO (π_prox, IS weight min(π_prox/μ, 2)) against PPO-clip on μ
  (``ratio_base: behavior``), truncated IS (``tis``) and no correction (PPO-clip on π_prox, no behaviour weight).

Each run is ``agentrl train`` in a subprocess (its run directory under ``--out``); finished runs are reused, so an
interrupted benchmark resumes where it stopped. The script prints markdown tables, writes ``results.json`` and the
plots (``benchmarks/plot_offpolicy.py``) under ``--out``.

    .venv/bin/python benchmarks/bench_offpolicy_learning.py                       # everything (~1.5 h quiet)
    .venv/bin/python benchmarks/bench_offpolicy_learning.py --steps 4 --seeds 1 --eval-every 2 --eval-episodes 16 \\
        --warm-episodes 200 --warm-steps 20 --consistency-steps 3 --out /tmp/offpolicy-smoke     # a smoke run
    .venv/bin/python benchmarks/bench_offpolicy_learning.py --finished-only ...   # tables of what an interrupted run finished
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"

LOSSES = {
    "decoupled_ppo": ["trainer.loss.name=decoupled_ppo"],
    "ppo_on_mu": ["trainer.loss.name=ppo", "trainer.loss.ratio_base=behavior"],
    "tis": ["trainer.loss.name=tis"],
    "no_correction": ["trainer.loss.name=ppo", "trainer.loss.ratio_base=proximal"],
}


def _cli(args: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log, "a") as f:  # appended: a retried run keeps the log of the attempt that failed
        f.write(f"\n==== {time.strftime('%H:%M:%S')} agentrl train {' '.join(args)}\n")
        f.flush()
        p = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", *args], cwd=ROOT, env=env, stdout=f,
                           stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise RuntimeError(f"agentrl train failed (exit {p.returncode}); see {log}")


def warm_model(args) -> Path:
    """Builds (once) the warm-started model every run starts from: the quickstart's warm start, then 0 RL steps."""
    d = Path(args.out) / "warmstart"
    model = d / "warmstart" / "model"
    if not model.is_dir():
        d.mkdir(parents=True, exist_ok=True)
        # steps=1 with eval off: the warm start runs, then one RL step whose checkpoint is ignored
        _cli([str(QUICKSTART), f"run_dir={d / 'warmstart_run'}", "steps=1", "eval.episodes=0", "progress=false",
              "tensorboard=false", f"warm_start.episodes={args.warm_episodes}", f"warm_start.steps={args.warm_steps}",
              "checkpoint_every=1"], d / "warmstart.log")
        (d / "warmstart_run" / "warmstart").rename(d / "warmstart")
    return model


def run(args, name: str, overrides: list[str], steps: int) -> dict | None:
    """Runs (or reuses) one training run; returns its per-step rows and summary (None: not run, ``--finished-only``)."""
    run_dir = Path(args.out) / "runs" / name
    if args.finished_only and not (run_dir / "bench.json").exists():
        print(f"  {name}: not finished, left out", flush=True)
        return None
    for attempt in range(1, 4):
        if (run_dir / "summary.json").exists():
            break
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        try:
            _cli([str(QUICKSTART), f"run_dir={run_dir}", f"steps={steps}", f"engine.model={args.model}",
                  "warm_start.episodes=0", "progress=false", "tensorboard=false", f"checkpoint_every={steps}",
                  *overrides], Path(args.out) / "runs" / f"{name}.log")
        except RuntimeError as e:  # e.g. Ray's node start timing out on an overloaded machine: try again
            if attempt == 3:
                raise
            print(f"  {name}: attempt {attempt} failed ({e}); retrying", flush=True)
            continue
        (run_dir / "bench.json").write_text(json.dumps({"wall_s": time.perf_counter() - t0, "load_start": load0,
                                                        "load_end": os.getloadavg()[0]}))
        print(f"  {name}: done", flush=True)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    bench = json.loads((run_dir / "bench.json").read_text())
    evals = [(0, summary["eval_before"]["reward"])] if "eval_before" in summary else []
    evals += [(r["step"], r["eval/reward"]) for r in rows if "eval/reward" in r]
    if "eval_after" in summary:
        evals.append((rows[-1]["step"], summary["eval_after"]["reward"]))
    return {"name": name, "rows": rows, "evals": evals, "wall_s": bench["wall_s"], "load": [bench["load_start"],
            bench["load_end"]], "train_s": sum(r["time/step_s"] for r in rows)}


def _mean_sd(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def _col(rs: list[dict], key: str, agg=max) -> float:
    return agg(r.get(key, 0.0) for x in rs for r in x["rows"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench-offpolicy")
    ap.add_argument("--steps", type=int, default=60, help="trained steps of each async / losses run")
    ap.add_argument("--async-steps", type=int, default=None, help="trained steps of each async run (default: --steps)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-episodes", type=int, default=128)
    ap.add_argument("--num-groups", type=int, default=8,
                    help="groups of 8 per step in the async / losses runs (the quickstart's 8; fewer on a loaded machine)")
    ap.add_argument("--warm-episodes", type=int, default=2000)
    ap.add_argument("--warm-steps", type=int, default=150)
    ap.add_argument("--consistency-steps", type=int, default=20)
    ap.add_argument("--experiments", nargs="*", default=["consistency", "async", "losses"],
                    choices=["consistency", "async", "losses"])
    ap.add_argument("--model", default=None, help="start every run from this model (default: build a warm start)")
    ap.add_argument("--finished-only", action="store_true",
                    help="start no run: tabulate and plot the runs under --out that finished (an interrupted benchmark)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    t_all = time.perf_counter()
    if args.model is None:
        args.model = str(warm_model(args))
    common = [f"eval.every={args.eval_every}", f"eval.episodes={args.eval_episodes}",
              f"manager.num_groups={args.num_groups}"]
    async_steps = args.async_steps or args.steps
    results: dict = {"args": vars(args), "consistency": [], "async": {}, "losses": {}}

    if "consistency" in args.experiments:
        results["consistency"] = [x for x in [run(args, "consistency", [
            "async_ratio=0", "trainer.optimizer.lr=1e-30", "rollout.temperature=0.7", "trainer.dtype=float32",
            "eval.episodes=0"], args.consistency_steps)] if x]
    for seed in range(args.seeds):
        seeded = [f"seed={seed}", f"trainer.seed={seed}", f"engine.seed={seed}", f"env.seed_start={seed * 100_000}"]
        if "losses" in args.experiments:
            for loss, extra in LOSSES.items():
                if r := run(args, f"loss-{loss}-a4-s{seed}", ["async_ratio=4", *extra, *seeded, *common], args.steps):
                    results["losses"].setdefault(loss, []).append(r)
        if "async" in args.experiments:
            for alpha in (0, 2):
                if r := run(args, f"async-a{alpha}-s{seed}", [f"async_ratio={alpha}", *seeded, *common], async_steps):
                    results["async"].setdefault(alpha, []).append(r)
    results["total_wall_s"] = time.perf_counter() - t_all
    results["load_end"] = os.getloadavg()[0]
    (out / "results.json").write_text(json.dumps(results, indent=1))

    if results["consistency"]:
        c = results["consistency"]
        print(f"\n### Consistency: α = 0, lr 1e-30, temperature 0.7, fp32, {args.consistency_steps} steps\n")
        print("| max clip fraction | max IS truncation fraction | max KL(μ‖π_prox) k3 | max staleness | load |")
        print("| --- | --- | --- | --- | --- |")
        print(f"| {_col(c, 'train/ratio/clip_frac'):.2e} | {_col(c, 'train/is/truncated_frac'):.2e} | "
              f"{_col(c, 'train/mismatch/kl_k3'):.2e} | {_col(c, 'train/staleness/max'):.0f} | "
              f"{c[0]['load'][0]:.1f} → {c[0]['load'][1]:.1f} |")
    for title, groups, steps in (("Async: α = 0 vs α = 2", results["async"], async_steps),
                                 ("Losses at α = 4", results["losses"], args.steps)):
        if not groups:
            continue
        print(f"\n### {title}, {steps} steps of {args.num_groups} groups × 8, held-out "
              f"reward on {args.eval_episodes} boards\n")
        print("| run | held-out before | held-out after (mean ± sd) | held-out curve (mean) | batch reward, second half "
              "(mean ± sd) | train s/step | wall s | max staleness | mean IS truncated | mean KL(μ‖π_prox) | load |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for key, rs in groups.items():
            before = [x["evals"][0][1] for x in rs if x["evals"]]
            after = [x["evals"][-1][1] for x in rs if x["evals"]]
            sps = statistics.mean(x["train_s"] / len(x["rows"]) for x in rs)
            wall = statistics.mean(x["wall_s"] for x in rs)
            tr = [r["train/is/truncated_frac"] for x in rs for r in x["rows"] if "train/is/truncated_frac" in r]
            trunc = f"{statistics.mean(tr):.4f}" if tr else "— (no IS weight)"
            kl = statistics.mean(r.get("train/mismatch/kl_k3", 0.0) for x in rs for r in x["rows"])
            load = f"{min(x['load'][0] for x in rs):.0f}-{max(max(x['load']) for x in rs):.0f}"
            label = (f"α = {key}" if title.startswith("Async") else key) + f" ({len(rs)} seed{'s' if len(rs) > 1 else ''})"
            points = sorted(set.intersection(*({st for st, _ in x["evals"]} for x in rs)))
            curve = " ".join(f"{statistics.mean(dict(x['evals'])[p] for x in rs):.2f}" for p in points)
            # the second half's batch reward: every run of a seed trains on the same sequence of boards (task i has seed
            # seed_start + i), so within a seed the rows compare nearly pairwise
            batch = _mean_sd([statistics.mean(r["reward"] for r in x["rows"][len(x["rows"]) // 2:]) for x in rs])
            print(f"| {label} | {_mean_sd(before)} | {_mean_sd(after)} | {curve} (steps {' '.join(map(str, points))}) | "
                  f"{batch} | {sps:.2f} | {wall:.0f} | "
                  f"{_col(rs, 'train/staleness/max'):.0f} | {trunc} | {kl:.4f} | {load} |")
    try:
        sys.path.insert(0, str(Path(__file__).parent))
        from plot_offpolicy import plot

        for p in plot(out / "results.json", out):
            print(f"plot: {p}")
    except ImportError as e:
        print(f"no plots ({e}); install matplotlib", file=sys.stderr)
    print(f"\ntotal wall {results['total_wall_s']:.0f} s; load average at end {results['load_end']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
