"""Credit assignment on multi-turn envs (issue 28): episode-level GRPO against ``turn_return`` and ``gigpo``.

For each env (``tooluse``: ``configs/tooluse.yaml``, ToolLookup-v0, reward earned over 2-3 tool turns with a
penalty per invalid turn; ``lake``: ``configs/quickstart.yaml``, 3x3 FrozenLake, reward at the goal after 2-4
moves) and each seed, one ``agentrl train`` run per estimator (``trainer.advantage.estimator``), every other setting
the config's. All runs of one env start from ONE warm-started policy (the first run's ``warmstart/``, copied into
the others' run directories before they start; the controller reuses a run directory's warm start): the estimators
and seeds then differ only in RL. Seeds set ``seed``, ``trainer.seed``, ``engine.seed`` and ``env.seed_start``
(``seed * 100,000``: other training tasks per seed). Every run has the same number of RL steps (the estimators cost
the same per step, so equal steps are an equal wall-time budget: the table reports both).

Held-out success is the controller's own evaluation (``eval_before``, ``eval/success`` every ``eval.every`` steps,
``eval_after`` in ``summary.json``): ``eval.episodes`` distinct tasks held out by content (no training or
warm-start episode plays one; :mod:`agentrl.controller.heldout`), the same tasks for every run of an env. Held out
by content is only true for the reused warm start when its run had the same ``eval.episodes``: this script passes
the same value to every run.

    nice -n 5 python benchmarks/bench_credit.py --out runs/bench-credit --steps 30 --eval-every 10 --parallel 2
    python benchmarks/bench_credit.py --out runs/bench-credit --report-only

Writes ``OUT/credit.json`` (every run's curve, the per-estimator aggregates) and ``OUT/credit.png`` (held-out success
against RL step, mean over seeds with a +-1 sd band, one panel per env), and prints the markdown table.
Extra ``key=value`` arguments after ``--`` go to every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENVS = {"tooluse": "configs/tooluse.yaml", "lake": "configs/quickstart.yaml"}
ESTIMATORS = ("grpo", "turn_return", "gigpo")


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _agentrl() -> list[str]:
    """The CLI of the interpreter running this script (a worktree has no .venv of its own)."""
    exe = Path(sys.executable).with_name("agentrl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "agentrl.cli"]


# ------------------------------------------------------------------------------------------------ aggregation
def curve(summary: dict, rows: list[dict], steps: int) -> list[tuple[int, float]]:
    """Held-out success of one run against its RL step: ``(0, eval_before)``, ``(step, eval/success)`` of each
    in-between evaluation, ``(steps, eval_after)``; points the run lacks are left out."""
    pts: list[tuple[int, float]] = []
    if "success" in summary.get("eval_before", {}):
        pts.append((0, float(summary["eval_before"]["success"])))
    pts += [(int(r["step"]), float(r["eval/success"])) for r in rows if "eval/success" in r]
    if "success" in summary.get("eval_after", {}):
        pts.append((steps, float(summary["eval_after"]["success"])))
    return sorted(dict(pts).items())


def mean_sd(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0 for one value, NaN for none)."""
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    if len(xs) == 1:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def first_reaching(points: list[tuple[int, float]], threshold: float) -> int | None:
    """The first evaluated step whose held-out success is >= ``threshold`` (None: never)."""
    return next((s for s, v in points if v >= threshold), None)


def aggregate(runs: list[dict], gain: float) -> dict[str, dict[str, dict]]:
    """``{env: {estimator: stats}}`` over the seeds of each (env, estimator). ``runs``: dicts with ``env``,
    ``estimator``, ``seed`` and ``points`` (:func:`curve`), optionally ``wall_s``. The threshold of an env is the
    mean held-out success at step 0 over all its runs (one shared warm start) plus ``gain``. Stats: the curve's mean
    and sd per step over the seeds that evaluated that step (``n``), before/after/gain mean and sd, the first step
    reaching the threshold per seed (None: not within the run), the seeds and the wall times."""
    out: dict[str, dict[str, dict]] = {}
    for env in sorted({r["env"] for r in runs}):
        env_runs = [r for r in runs if r["env"] == env]
        starts = [r["points"][0][1] for r in env_runs if r["points"] and r["points"][0][0] == 0]
        threshold = mean_sd(starts)[0] + gain
        out[env] = {}
        for est in [e for e in ESTIMATORS if any(r["estimator"] == e for r in env_runs)] + sorted(
                {r["estimator"] for r in env_runs} - set(ESTIMATORS)):
            rs = sorted((r for r in env_runs if r["estimator"] == est), key=lambda r: r["seed"])
            by_step: dict[int, list[float]] = {}
            for r in rs:
                for s, v in r["points"]:
                    by_step.setdefault(s, []).append(v)
            before = [r["points"][0][1] for r in rs if r["points"] and r["points"][0][0] == 0]
            after = [r["points"][-1][1] for r in rs if r["points"]]
            gains = [r["points"][-1][1] - r["points"][0][1] for r in rs if len(r["points"]) >= 2 and r["points"][0][0] == 0]
            out[env][est] = {
                "seeds": [r["seed"] for r in rs],
                "threshold": threshold,
                "curve": [{"step": s, "mean": mean_sd(v)[0], "sd": mean_sd(v)[1], "n": len(v)}
                          for s, v in sorted(by_step.items())],
                "before": mean_sd(before), "after": mean_sd(after), "gain": mean_sd(gains),
                "first_step_reaching": [first_reaching(r["points"], threshold) for r in rs],
                "wall_s": [r.get("wall_s") for r in rs],
                "adv_std": mean_sd([r["mean_train/adv/std"] for r in rs if r.get("mean_train/adv/std") is not None]),
                "step_groups": {k: sum((r.get("step_groups") or {}).get(k, 0) for r in rs)
                                for k in ("turns", "keyed", "grouped", "with_signal")},
            }
    return out


def step_group_stats(trajectories: list[dict]) -> dict[str, int]:
    """What gigpo's step level can use in logged trajectories (``trajectories.jsonl`` records' ``trajectory``):
    ``turns``; ``keyed`` (turns with a state key); ``grouped`` (turns whose state another turn of the same group,
    trained at the same step, also acted from: a step group of two or more); ``with_signal`` (grouped turns whose
    step group's undiscounted returns-to-go are not all equal, so the step-level advantage is not zero)."""
    groups: dict[tuple, list[dict]] = {}
    for t in trajectories:
        groups.setdefault((t.get("_step"), t["group_id"]), []).append(t)
    out = {"turns": 0, "keyed": 0, "grouped": 0, "with_signal": 0}
    for members in groups.values():
        by_key: dict[str, list[float]] = {}
        for t in members:
            rewards = [float(r) for r in t.get("rewards") or []]
            keys = (t.get("info") or {}).get("state_keys") or []
            out["turns"] += len(rewards)
            for k in range(len(rewards)):
                key = keys[k] if k < len(keys) else None
                if key is not None:
                    out["keyed"] += 1
                    by_key.setdefault(json.dumps(key, sort_keys=True), []).append(sum(rewards[k:]))
        for rets in by_key.values():
            if len(rets) >= 2:
                out["grouped"] += len(rets)
                out["with_signal"] += len(rets) * (max(rets) > min(rets))
    return out


def read_trajectories(run_dir: Path) -> list[dict]:
    """The trained trajectories a run logged, each tagged with its step (``_step``)."""
    path, out = run_dir / "trajectories.jsonl", []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            out.append({**rec["trajectory"], "_step": rec.get("step")})
    return out


def _pm(ms: tuple[float, float]) -> str:
    return "n/a" if math.isnan(ms[0]) else f"{ms[0]:.3f} ± {ms[1]:.3f}"


def _share(sg: dict[str, int]) -> str:
    if not sg.get("turns"):
        return "n/a"
    return f"{sg['grouped'] / sg['turns']:.2f} / {sg['with_signal'] / sg['turns']:.2f}"


def table(agg: dict[str, dict[str, dict]], tasks: dict[str, int]) -> str:
    """The markdown table: one row per (env, estimator)."""
    lines = ["| env | estimator | seeds | held-out tasks | success before RL | after RL | gain | first step ≥ threshold "
             "(per seed) | RL phase wall, mean | advantage sd per step, mean | turns in a step group / with unequal "
             "returns |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for env, ests in agg.items():
        for est, st in ests.items():
            walls = [w for w in st["wall_s"] if w is not None]
            wall = f"{sum(walls) / len(walls) / 60:.1f} min" if walls else "n/a"
            first = ", ".join("never" if s is None else str(s) for s in st["first_step_reaching"])
            lines.append(f"| {env} | {est} | {len(st['seeds'])} | {tasks.get(env, '?')} | {_pm(st['before'])} | "
                         f"**{_pm(st['after'])}** | {_pm(st['gain'])} | ≥ {st['threshold']:.3f}: {first} | {wall} | "
                         f"{_pm(st['adv_std'])} | {_share(st['step_groups'])} |")
    return "\n".join(lines)


def plot(agg: dict[str, dict[str, dict]], out: Path) -> Path:
    """Held-out success against RL step per estimator: the mean over seeds, a +-1 sd band; one panel per env."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(agg), figsize=(5.5 * len(agg), 4), squeeze=False)
    for ax, (env, ests) in zip(axes[0], agg.items()):
        for i, (est, st) in enumerate(ests.items()):
            xs = [p["step"] for p in st["curve"]]
            m = [p["mean"] for p in st["curve"]]
            sd = [p["sd"] for p in st["curve"]]
            ax.plot(xs, m, marker="o", color=f"C{i}", label=f"{est} ({len(st['seeds'])} seeds)")
            ax.fill_between(xs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], color=f"C{i}",
                            alpha=0.15)
        if ests:
            ax.axhline(next(iter(ests.values()))["threshold"], color="grey", linestyle=":", linewidth=1,
                       label="threshold")
        ax.set_title(f"{env} ({ENVS.get(env, '')})")
        ax.set_xlabel("RL step")
        ax.set_ylabel("held-out success (mean ± sd over seeds)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# -------------------------------------------------------------------------------------------------- the grid
def demos_in_eval_set(run_dir: Path, eval_episodes: int) -> int:
    """How many warm-start demonstrations of the run in ``run_dir`` (by its ``config.yaml``) play a task of the
    evaluation set of ``eval_episodes`` tasks: 0 is required before its warm start is reused (a run holds out only
    its own ``eval.episodes`` tasks from its demonstrations)."""
    from agentrl.controller.heldout import HeldOut
    from agentrl.controller.run import load_config

    cfg = load_config(str(run_dir / "config.yaml"), [])
    ws, ours = HeldOut(cfg.env, cfg.eval.episodes), HeldOut(cfg.env, eval_episodes)
    try:
        return sum(ours.is_held_out(ws.demos(i)) for i in range(cfg.warm_start.episodes))
    finally:
        ws.close()
        ours.close()


def run_one(env: str, est: str, seed: int, run_dir: Path, args: argparse.Namespace, extra: list[str],
            warm_from: Path | None) -> dict:
    """Runs one grid cell to completion (skipped when its summary.json exists); writes ``run_dir/bench.json`` with
    the command, the load average at start and end, the wall time of the process and the attempts. A process that
    fails before its first RL step (on a loaded machine: Ray's node start times out) is started again from nothing,
    up to ``args.retries`` times; a failure after it is the run's result."""
    if (run_dir / "summary.json").exists():
        return json.loads((run_dir / "bench.json").read_text()) if (run_dir / "bench.json").exists() else {}
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    claim = run_dir.parent / f"{run_dir.name}.claim"  # two grid processes on one OUT never run one cell twice
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        print(f"skip {env}/{est}/seed{seed}: {claim} exists (another grid process runs it)", flush=True)
        return {}
    try:
        return _run_claimed(env, est, seed, run_dir, args, extra, warm_from)
    finally:
        claim.unlink()


def _run_claimed(env: str, est: str, seed: int, run_dir: Path, args: argparse.Namespace, extra: list[str],
                 warm_from: Path | None) -> dict:
    cmd = ["nice", "-n", str(args.nice), *_agentrl(), "train", ENVS[env], f"run_dir={run_dir}", f"seed={seed}",
           f"trainer.seed={seed}", f"engine.seed={seed}", f"env.seed_start={seed * 100_000}",
           *args.arm_overrides[est], f"steps={args.steps}", f"eval.every={args.eval_every}",
           f"eval.episodes={args.eval_episodes}", "progress=false", *extra]
    failed_starts = []
    for attempt in range(args.retries + 1):
        if run_dir.exists():  # a half-finished run: start it again from nothing
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        if warm_from is not None:
            shutil.copytree(warm_from, run_dir / "warmstart")
        load0, t0 = _loadavg(), time.perf_counter()
        print(f"[{time.strftime('%H:%M:%S')}] start {env}/{est}/seed{seed} (load {load0:.2f})", flush=True)
        with open(run_dir.parent / f"{run_dir.name}.log", "ab") as log:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode
        meta = {"cmd": " ".join(cmd), "rc": rc, "process_s": time.perf_counter() - t0, "load_start": load0,
                "load_end": _loadavg(), "failed_starts": failed_starts}
        print(f"[{time.strftime('%H:%M:%S')}] end {env}/{est}/seed{seed} rc {rc} in {meta['process_s']:.0f} s "
              f"(load {meta['load_end']:.2f})", flush=True)
        if rc == 0 or (run_dir / "metrics.jsonl").exists():
            break
        failed_starts.append({"rc": rc, "process_s": meta["process_s"], "load_start": load0})
    (run_dir / "bench.json").write_text(json.dumps(meta, indent=2))
    return meta


def run_grid(args: argparse.Namespace, extra: list[str]) -> None:
    """Per env, the first cell (first estimator, first seed) warm-starts; the others wait for it and copy its
    ``warmstart/``. ``args.parallel`` cells run at a time."""
    out = Path(args.out)
    jobs = [(env, est, seed) for env in args.envs for seed in args.seeds for est in args.estimators]
    first = {env: (env, args.estimators[0], args.seeds[0]) for env in args.envs}
    done = {env: threading.Event() for env in args.envs}
    for spec in args.warm_start:  # ENV=RUN_DIR: that run's warm start instead of a new one
        env, _, src = spec.partition("=")
        if env not in first:
            raise SystemExit(f"--warm-start {spec!r}: {env!r} is not one of --envs {args.envs}")
        bad = demos_in_eval_set(Path(src), args.eval_episodes)
        if bad:
            raise SystemExit(f"--warm-start {spec!r}: {bad} of its demonstrations play held-out tasks of "
                             f"eval.episodes={args.eval_episodes}; warm-start again")
        print(f"{env}: reusing the warm start of {src} (none of its demonstrations plays a held-out task)", flush=True)
        done[env].set()
    lock = threading.Lock()
    queue = list(jobs)

    def cell_dir(env: str, est: str, seed: int) -> Path:
        return out / env / f"{est}-seed{seed}"

    def take() -> tuple[str, str, int] | None:
        with lock:
            for j in queue:  # a warm-starting cell first, then cells whose env's warm start is ready
                if j == first[j[0]] or done[j[0]].is_set():
                    queue.remove(j)
                    return j
            return queue.pop(0) if queue else None  # wait below for its warm start

    def worker() -> None:
        while (job := take()) is not None:
            env, est, seed = job
            warm = None
            reused = next((Path(w.partition("=")[2]) for w in args.warm_start if w.partition("=")[0] == env), None)
            if reused is not None:
                warm = reused / "warmstart"
            elif job != first[env]:
                done[env].wait()
                warm = cell_dir(*first[env]) / "warmstart"
            if warm is not None:
                if not (warm / "model").is_dir():
                    print(f"skip {env}/{est}/seed{seed}: no warm-started model in {warm}", flush=True)
                    continue
            try:
                run_one(env, est, seed, cell_dir(*job), args, extra, warm)
            finally:
                if job == first[env]:
                    done[env].set()

    threads = [threading.Thread(target=worker) for _ in range(args.parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _row_mean(rows: list[dict], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return sum(vals) / len(vals) if vals else None


def collect(out: Path, envs: list[str]) -> tuple[list[dict], dict[str, int]]:
    """Every finished cell under ``out`` (``env/estimator-seedN/summary.json``) as a run dict for :func:`aggregate`,
    and the number of distinct held-out tasks per env."""
    runs, tasks = [], {}
    for env in envs:
        for d in sorted((out / env).glob("*-seed*")):
            if not (d / "summary.json").exists():
                continue
            est, _, seed = d.name.rpartition("-seed")
            s = json.loads((d / "summary.json").read_text())
            rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
            meta = json.loads((d / "bench.json").read_text()) if (d / "bench.json").exists() else {}
            runs.append({"env": env, "estimator": est, "seed": int(seed), "run_dir": str(d),
                         "points": curve(s, rows, int(s.get("steps", len(rows)))), "wall_s": s.get("rl_wall_s"),
                         "eval_before": s.get("eval_before"), "eval_after": s.get("eval_after"),
                         "nonfinite_steps": sum(1 for r in rows if not all(
                             math.isfinite(r.get(k, 0.0)) for k in ("train/loss", "train/grad_norm"))),
                         **{f"mean_{k}": _row_mean(rows, k) for k in (
                             "train/adv/std", "train/adv/zero_frac", "train/grad_norm", "train/entropy", "reward")},
                         "step_groups": step_group_stats(read_trajectories(d)),
                         **{k: meta.get(k) for k in ("cmd", "load_start", "load_end", "process_s")}})
            tasks[env] = int((s.get("eval_after") or s.get("eval_before") or {}).get("tasks", 0))
    return runs, tasks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/bench-credit")
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-episodes", type=int, default=128)
    ap.add_argument("--gain", type=float, default=0.1, help="threshold = mean success at step 0 + gain")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--nice", type=int, default=5)
    ap.add_argument("--retries", type=int, default=2, help="restarts of a run that failed before its first step")
    ap.add_argument("--warm-start", action="append", default=[], metavar="ENV=RUN_DIR",
                    help="reuse RUN_DIR/warmstart for ENV (refused if its demonstrations met this held-out set)")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE...]",
                    help="compare these override sets (one per arm; NAME= for the config as it is) instead of "
                         "--estimators, e.g. --arm full= --arm lora=trainer.lora.rank=16")
    ap.add_argument("--report-only", action="store_true")
    args, extra = ap.parse_known_args(argv)
    extra = [e for e in extra if e != "--"]
    args.arm_overrides = {e: [f"trainer.advantage.estimator={e}"] for e in args.estimators}
    if args.arm:
        args.arm_overrides = {}
        for spec in args.arm:
            name, eq, rest = spec.partition("=")
            if not eq or not name or "-seed" in name or "/" in name:
                raise SystemExit(f"--arm {spec!r}: expected NAME=KEY=VALUE[,KEY=VALUE...] (NAME without '/' or "
                                 "'-seed'; NAME= for no overrides)")
            args.arm_overrides[name] = [kv for kv in rest.split(",") if kv]
        args.estimators = list(args.arm_overrides)
    out = Path(args.out)
    if not args.report_only:
        run_grid(args, extra)
    runs, tasks = collect(out, args.envs)
    agg = aggregate(runs, args.gain)
    out.mkdir(parents=True, exist_ok=True)
    (out / "credit.json").write_text(json.dumps({"runs": runs, "aggregate": agg, "tasks": tasks,
                                                  "gain": args.gain}, indent=2))
    if not runs:
        print(f"no finished run under {out} (each run's log: {out}/ENV/ARM-seedN.log)")
        return 1
    png = plot(agg, out / "credit.png")
    print(table(agg, tasks))
    print(f"\njson: {out / 'credit.json'}\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
