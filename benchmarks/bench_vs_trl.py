"""agentrl against trl on the same work, one after the other on the same cores (issue 30).

One command::

    nice -n 5 .venv/bin/python benchmarks/bench_vs_trl.py --budget-s 480 --seeds 0 1

Flow (per task of ``vs_trl_common.TASKS``: the multi-turn ToolLookup task and reasoning-gym's single-turn
family_relationships and aiw):

1. trl's venv: ``~/.cache/agentrl/bench-trl-venv`` (or ``--venv``) is made on first use with ``torch==2.13.0``,
   ``trl==TRL_VERSION``, gymnasium, pyyaml and reasoning-gym (agentrl's version); trl never enters agentrl's own
   environment.
2. One warm start (agentrl's, ``warm_start`` of the task's config, seed 0) is made once and is the starting weights
   of every run, both frameworks, every seed.
3. The held-out set: agentrl's content-keyed evaluation set of ``--heldout`` distinct tasks; both frameworks train
   on agentrl's training seed map (``env.seed_start = seed * 100000``), which skips every held-out task.
4. Runs, one at a time, each for ``--budget-s`` seconds of wall time from its process start (set-up included), in
   the order seed 0: agentrl-sync, agentrl-async, trl; seed 1: ...: ``agentrl train`` with its defaults
   (``async_ratio: 0`` for sync, the config's ``async_ratio: 1`` for async), checkpointing every
   ``--ckpt-every`` steps; ``trl_side.py`` in the trl venv, checkpointing every ``--trl-ckpt-s`` seconds. A watcher
   samples the process tree's CPU time, resident memory and the load average every 2 s.
5. Scoring: the warm start (time 0 for all) and each run's checkpoints on a ``--score-grid-s`` grid of wall time,
   then, once the threshold is known, more checkpoints bisecting each run's first crossing of it, by
   ``vs_trl_common.score`` (one greedy scorer for both), after the runs, so scoring never shares the cores with
   training.
6. ``OUT/results.json``, ``OUT/vs_trl.png`` (held-out success against wall time) and a markdown table on stdout.

``--report-only`` redoes 5-6 from the run directories (scores are cached in ``OUT/scores.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vs_trl_common as common  # noqa: E402

TRL_VERSION = "1.16.0"
TORCH_VERSION = "2.13.0"  # the machine's local CPU wheel (PLATFORM.md); plain `torch` would pull CUDA wheels
MODES = ("agentrl-sync", "agentrl-async", "trl")


# ------------------------------------------------------------------------------------------------------ set-up
def ensure_venv(venv: Path) -> Path:
    """Makes (once) the venv the trl side runs in; returns its python."""
    py = venv / "bin" / "python"
    marker = venv / f"bench-trl-{TRL_VERSION}-agentrl-rg.ok"
    if not marker.exists():
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # reasoning-gym: the single-turn task's env is played on the trl side too (its prompts and its reward)
        subprocess.run([str(py), "-m", "pip", "install", "-q", f"torch=={TORCH_VERSION}", f"trl=={TRL_VERSION}",
                        "gymnasium", "pyyaml", f"reasoning-gym=={_installed('reasoning-gym')}"], check=True)
        # agentrl itself, without its dependencies: the trl side plays agentrl's env and loads the tokenizer with
        # agentrl's loader; a plain PYTHONPATH would not map agentrl.envs to envs/ (pyproject's package-dir).
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
        marker.write_text("ok\n")
    return py


def _installed(dist: str) -> str:
    """The version of ``dist`` in agentrl's own environment (both sides play the same env code)."""
    import importlib.metadata

    return importlib.metadata.version(dist)


def venv_versions(py: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('trl', 'torch', 'transformers', 'accelerate', 'datasets', 'reasoning-gym')}))")
    return json.loads(subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout)


def make_warm_start(task: common.Task, out: Path, heldout: int, overrides: list[str] = ()) -> Path:
    """agentrl's warm start for ``task`` (its config, seed 0, demonstrations that avoid the held-out tasks), made
    once under ``out/warmstart``; returns the model directory."""
    import asyncio

    from agentrl.controller.config import load_config
    from agentrl.controller.run import run_tokenizer, warm_start
    from agentrl.inference.config import EngineConfig

    ws = out / "warmstart"
    if not (ws / "model").is_dir():
        cfg = load_config(ROOT / task.config, [f"eval.episodes={heldout}", "seed=0", *overrides])
        held = common.heldout(task, heldout)
        try:
            asyncio.run(warm_start(cfg, Path(EngineConfig(model=cfg.engine.model).resolved_model()), ws,
                                   run_tokenizer(cfg.engine), held))
        finally:
            held.close()
    return ws / "model"


def base_model_dir(task: common.Task) -> str:
    from agentrl.controller.config import load_config
    from agentrl.inference.config import EngineConfig

    return EngineConfig(model=load_config(ROOT / task.config).engine.model).resolved_model()


# ------------------------------------------------------------------------------------------------- the watcher
def _tree(root: int) -> dict[int, tuple[float, int]]:
    """``{pid: (cpu seconds, rss bytes)}`` of ``root`` and its live descendants."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    parent, info = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(fields[1])
        info[int(d.name)] = ((int(fields[11]) + int(fields[12])) / tick, int(fields[21]) * page)
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return {p: info[p] for p in tree if p in info}


class Watcher:
    """Samples every ``every_s``: the CPU seconds of each process of the tree (the largest seen per pid survives
    its exit: a lower bound for processes that live between samples), the tree's summed RSS (its peak) and the
    1-minute load average."""

    def __init__(self, pid: int, every_s: float = 2.0):
        self.pid, self.every_s, self.t0 = pid, every_s, time.time()
        self.cpu: dict[int, float] = {}
        self.starts: dict[int, str] = {}  # pid -> start time (clock ticks), to tell a reused pid apart
        self.timeline: list[tuple[float, float]] = []  # (seconds since start, tree CPU seconds so far)
        self.peak_rss, self.load = 0, [_loadavg()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            tree = _tree(self.pid)
            for p, (c, _) in tree.items():
                self.cpu[p] = max(self.cpu.get(p, 0.0), c)
                if p not in self.starts:
                    try:
                        self.starts[p] = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[19]
                    except OSError:
                        pass
            self.peak_rss = max(self.peak_rss, sum(r for _, r in tree.values()))
            self.timeline.append((time.time() - self.t0, sum(self.cpu.values())))
            self.load.append(_loadavg())
            self._stop.wait(self.every_s)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.load.append(_loadavg())
        return {"cpu_s": sum(self.cpu.values()), "peak_rss_mib": self.peak_rss / 2**20, "cpu_timeline": self.timeline,
                "load_min": min(self.load), "load_max": max(self.load), "load_mean": sum(self.load) / len(self.load)}


def _tree_pids_of(watch: "Watcher") -> set[int]:
    """The watched pids still alive whose start time is unchanged (not a reused pid)."""
    alive = set()
    for pid, start in watch.starts.items():
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] == start:
                alive.add(pid)
        except OSError:
            pass
    return alive


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_for(cmd: list[str], budget_s: float, log: Path, env: dict | None = None) -> dict:
    """Runs ``cmd`` in its own session until it exits or ``budget_s`` passes (then SIGTERM, SIGKILL 30 s later, to
    its process group only); returns its start time, wall time, exit code and the watcher's figures."""
    t0 = time.time()
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        watch = Watcher(proc.pid)
        at_budget = False
        try:
            rc = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            at_budget = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        time.sleep(3)  # let the tree's own shutdown finish before reaping what is left
        for pid in list(watch.cpu):  # descendants that left the process group (e.g. Ray's daemons): ours to end
            if pid != proc.pid and Path(f"/proc/{pid}").exists() and pid in _tree_pids_of(watch):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return {"t0": t0, "wall_s": time.time() - t0, "rc": rc, "stopped_at_budget": at_budget, "cmd": " ".join(cmd),
            **watch.stop()}


# ------------------------------------------------------------------------------------------------------- runs
def run_agentrl(task: common.Task, mode: str, seed: int, run_dir: Path, ws_model: Path, a: argparse.Namespace) -> dict:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "warmstart").mkdir(parents=True)
    os.symlink(ws_model.resolve(), run_dir / "warmstart" / "model")  # the shared warm start: no warm start here
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(ROOT / task.config), f"run_dir={run_dir}",
           f"seed={seed}", f"trainer.seed={seed}", f"engine.seed={seed}", f"env.seed_start={seed * 100_000}",
           f"eval.episodes={a.heldout}", "eval.every=0", f"steps={a.max_steps}", f"checkpoint_every={a.ckpt_every}",
           "progress=false"]
    if mode == "agentrl-sync":
        cmd.append("async_ratio=0")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return run_for(cmd, a.budget_s, run_dir.with_suffix(".log"), env)


def run_trl(task: common.Task, seed: int, run_dir: Path, ws_model: Path, py: Path, a: argparse.Namespace) -> dict:
    from agentrl.controller.config import load_config

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cfg = load_config(ROOT / task.config)
    per_step = cfg.manager.num_groups * cfg.manager.group_size
    spec = {"out": str(run_dir), "seed": seed, "tokenizer": base_model_dir(task), "model": str(ws_model.resolve()),
            "train_seeds": common.train_seeds(task, a.heldout, a.max_steps * cfg.manager.num_groups, seed * 100_000),
            "ckpt_every_s": a.trl_ckpt_s, "budget_s": a.budget_s - 20, "episodes_per_step": per_step,
            "group_size": cfg.manager.group_size, "lr": cfg.trainer.optimizer.lr,
            "temperature": cfg.rollout.temperature, "max_turns": task.max_turns, "env_id": task.env_id,
            "env_kwargs": dict(task.env_kwargs), "t0": time.time(),
            # trl has one budget for the whole completion: every turn's, plus room for the tool results
            "max_completion_length": task.max_turns * task.max_tokens_per_turn + (96 if task.max_turns > 1 else 0)}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = run_for([str(py), str(ROOT / "benchmarks" / "trl_side.py"), str(run_dir / "spec.json")], a.budget_s,
                  run_dir.with_suffix(".log"), env)
    out["t0"] = spec["t0"]
    return out


# --------------------------------------------------------------------------------------------- reading runs
def checkpoints(mode: str, run_dir: Path, t0: float) -> list[tuple[float, str, int]]:
    """``(seconds since the run's start, model dir, step)`` of every complete checkpoint of a run."""
    if mode == "trl":
        path = run_dir / "checkpoints.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return [(r["t"], r["dir"], r["step"]) for r in rows if r["step"] > 0]
    out = []
    for meta in sorted((run_dir / "checkpoints").glob("step_*.json")):
        step = int(meta.stem.split("_")[1])
        out.append((meta.stat().st_mtime - t0, str(meta.with_suffix("") / "model"), step))
    return out


def throughput(mode: str, run_dir: Path) -> dict:
    """Generated tokens per second of the training loop, and tokens the trainer processed per second of update."""
    if mode == "trl":
        path = run_dir / "result.json"
        if not path.exists():
            return {}
        r = json.loads(path.read_text())
        return {"steps": r["steps"], "gen_tokens_per_s": r["gen_tokens"] / max(r["step_s"], 1e-9),
                "trainer_tokens_per_s": r["trained_tokens"] / max(r["train_s"], 1e-9), "gen_tokens": r["gen_tokens"]}
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    if not rows:
        return {}
    gen = sum(r["throughput/gen_tokens_per_s"] * r["time/step_s"] for r in rows)
    loop_s = sum(r["time/step_s"] for r in rows)
    trained = sum(r.get("train/batch/num_tokens", 0.0) for r in rows)
    return {"steps": len(rows), "gen_tokens_per_s": gen / max(loop_s, 1e-9), "gen_tokens": gen,
            "trainer_tokens_per_s": trained / max(sum(r["time/train_s"] for r in rows), 1e-9)}


def score_all(task: common.Task, out: Path, runs: list[dict], ws_model: Path, seeds: list[int],
              only: list[str] | None = None) -> dict:
    """Scores the warm start and the checkpoints (all, or those in ``only``) not yet in ``out/scores.json`` (a
    cache keyed by model dir)."""
    cache_path = out / "scores.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    tok = base_model_dir(task)
    todo = [str(ws_model)] + [d for r in runs for _, d, _ in r["checkpoints"] if only is None or d in only]
    for d in todo:
        if d not in cache:
            t = time.perf_counter()
            cache[d] = common.score(d, tok, task, seeds)
            print(f"scored {d}: {cache[d]['success']:.3f} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
            cache_path.write_text(json.dumps(cache, indent=1))
    return cache


def summarise(runs: list[dict], ws_score: float, threshold: float, budget_s: float) -> dict:
    """Per mode (over seeds): time to ``threshold`` (wall, and the process tree's CPU seconds by then),
    success at equal wall time, throughput, peak memory; and the trl/agentrl ratios."""
    by_mode: dict[str, dict] = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        if not rs:
            continue
        cross = [common.crossing_time(r["points"], threshold) for r in rs]
        by_mode[mode] = {
            "seeds": [r["seed"] for r in rs],
            "ended": ["budget" if r.get("stopped_at_budget") else f"exit {r.get('rc')}" for r in rs],
            "time_to_threshold_s": cross,
            "cpu_to_threshold_s": [common.cpu_at(r.get("cpu_timeline", []), c) for c, r in zip(cross, rs)],
            "mean_time_to_threshold_s": common.mean(cross),
            "success_at_budget": [common.success_at(r["points"], budget_s) for r in rs],
            "success_at_half_budget": [common.success_at(r["points"], budget_s / 2) for r in rs],
            "best_success": [max([s for _, s in r["points"]] or [ws_score]) for r in rs],
            "gen_tokens_per_s": [r.get("gen_tokens_per_s") for r in rs],
            "trainer_tokens_per_s": [r.get("trainer_tokens_per_s") for r in rs],
            "steps": [r.get("steps") for r in rs], "cpu_s": [r["cpu_s"] for r in rs],
            "wall_s": [r["wall_s"] for r in rs], "peak_rss_mib": [r["peak_rss_mib"] for r in rs],
            "load": [(r["load_min"], r["load_max"], r["load_mean"]) for r in rs],
        }
    trl_t = by_mode.get("trl", {}).get("mean_time_to_threshold_s")
    ratios = {m: common.ratio(trl_t, v["mean_time_to_threshold_s"]) for m, v in by_mode.items() if m != "trl"}
    return {"threshold": threshold, "warm_start_success": ws_score, "budget_s": budget_s, "modes": by_mode,
            "trl_over_agentrl_time_to_threshold": ratios}


def plot(task: str, runs: list[dict], ws_score: float, threshold: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cx) = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    colors = {"agentrl-sync": "C0", "agentrl-async": "C2", "trl": "C3"}
    for r in runs:
        pts = [(0.0, ws_score)] + common.curve(r["points"])
        style = dict(marker="o", ms=3, color=colors[r["mode"]], linestyle=["-", "--", ":", "-."][r["seed"] % 4],
                     label=f"{r['mode']} seed {r['seed']}")
        ax.plot([t / 60 for t, _ in pts], [s for _, s in pts], **style)
        cpu = [common.cpu_at(r.get("cpu_timeline", []), t) for t, _ in pts]
        cx.plot([c / 60 if c is not None else float("nan") for c in cpu], [s for _, s in pts], **style)
    for a_, what in ((ax, "wall time"), (cx, "CPU time of the run's process tree")):
        if threshold is not None:
            a_.axhline(threshold, color="grey", linewidth=0.8, linestyle=":", label=f"threshold {threshold:.3f}")
        a_.set_xlabel(f"{what} since process start (min)")
    ax.set_ylabel("held-out success (greedy, shared scorer)")
    ax.set_title(f"{task}: agentrl vs trl from one warm start, one run at a time")
    cx.set_title("same, against CPU seconds (the machine is shared)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(task: str, s: dict) -> str:
    def f(v, fmt="{:.0f}"):
        return "—" if v is None else fmt.format(v)

    lines = [f"**{task}** — threshold {f(s['threshold'], '{:.3f}')} (warm start {s['warm_start_success']:.3f}), budget "
             f"{s['budget_s']:.0f} s per run", "",
             "| framework | seed | ended | wall s to threshold | CPU s to threshold | success at budget / at half | best | "
             "steps | gen tok/s | trainer tok/s | peak RSS MiB | CPU s (run) | load min–max |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode, m in s["modes"].items():
        for i, seed in enumerate(m["seeds"]):
            lines.append(
                f"| {mode} | {seed} | {m['ended'][i]} | {f(m['time_to_threshold_s'][i])} | {f(m['cpu_to_threshold_s'][i])} | "
                f"{f(m['success_at_budget'][i], '{:.3f}')} / {f(m['success_at_half_budget'][i], '{:.3f}')} | "
                f"{m['best_success'][i]:.3f} | {f(m['steps'][i])} | {f(m['gen_tokens_per_s'][i])} | "
                f"{f(m['trainer_tokens_per_s'][i])} | {m['peak_rss_mib'][i]:.0f} | {m['cpu_s'][i]:.0f} | "
                f"{m['load'][i][0]:.1f}–{m['load'][i][1]:.1f} |")
    lines.append("")
    for mode, r in s["trl_over_agentrl_time_to_threshold"].items():
        lines.append(f"- trl time / {mode} time to threshold (mean over seeds): {f(r, '{:.2f}')}x")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-vs-trl")
    p.add_argument("--tasks", nargs="+", default=list(common.TASKS))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--budget-s", type=float, default=480.0, help="wall seconds per run, set-up included")
    p.add_argument("--heldout", type=int, default=128, help="distinct held-out tasks")
    p.add_argument("--max-steps", type=int, default=400, help="agentrl steps (the budget stops it first)")
    p.add_argument("--ckpt-every", type=int, default=5, help="agentrl checkpoint period (steps)")
    p.add_argument("--trl-ckpt-s", type=float, default=30.0, help="trl checkpoint period (seconds)")
    p.add_argument("--score-grid-s", type=float, default=30.0,
                   help="score each run's checkpoints this many seconds apart, then bisect to each threshold crossing")
    p.add_argument("--threshold", type=float, default=None,
                   help="held-out success to reach (default: halfway from the warm start to the best run's best)")
    p.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "agentrl" / "bench-trl-venv")
    p.add_argument("--warm-start", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides for the warm start only (e.g. warm_start.steps=5 for a smoke run)")
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args()
    py = ensure_venv(a.venv)
    earlier = json.loads((a.out / "results.json").read_text()) if (a.out / "results.json").exists() else {}
    results = {"versions": {"trl_venv": venv_versions(py), "python": sys.version.split()[0]},
               "tasks": earlier.get("tasks", {}), "args": {**earlier.get("args", {})}}  # other tasks' results stay
    for name in a.tasks:
        results["args"][name] = {k: str(v) for k, v in vars(a).items()}
        task, out = common.TASKS[name], a.out / name
        out.mkdir(parents=True, exist_ok=True)
        ws_model = make_warm_start(task, out, a.heldout, a.warm_start)
        held = common.heldout(task, a.heldout)
        seeds, distinct = list(held.eval_seeds), len(held.eval_keys) if held.keyed else len(held.eval_seeds)
        held.close()
        log_path = out / "runs.json"
        runs = json.loads(log_path.read_text()) if log_path.exists() else []
        if not a.report_only:
            for seed in a.seeds:
                for mode in a.modes:
                    run_dir = out / f"{mode}-s{seed}"
                    print(f"{name} {mode} seed {seed}: load {_loadavg():.1f}", file=sys.stderr)
                    r = (run_trl(task, seed, run_dir, ws_model, py, a) if mode == "trl"
                         else run_agentrl(task, mode, seed, run_dir, ws_model, a))
                    runs = [x for x in runs if (x["mode"], x["seed"]) != (mode, seed)]
                    runs.append({"mode": mode, "seed": seed, "run_dir": str(run_dir), **r})
                    log_path.write_text(json.dumps(runs, indent=1))
        for r in runs:
            r["checkpoints"] = checkpoints(r["mode"], Path(r["run_dir"]), r["t0"])
            r.update(throughput(r["mode"], Path(r["run_dir"])))
        # scored: each run's checkpoints on a --score-grid-s grid, then, once the threshold is known, bisected
        # where each run first reached it (common.grid_pick, common.refine_pick)
        grid = [d for r in runs for d in common.grid_pick(r["checkpoints"], a.score_grid_s)]
        scores = score_all(task, out, runs, ws_model, seeds, grid)
        ws_score = scores[str(ws_model)]["success"]

        def points(r: dict) -> list[tuple[float, float]]:
            return [(t, scores[d]["success"]) for t, d, _ in r["checkpoints"] if d in scores]

        best = max([s for r in runs for _, s in points(r)] or [ws_score])
        threshold = a.threshold if a.threshold is not None else common.default_threshold(ws_score, best)
        for r in runs:
            while (d := common.refine_pick(r["checkpoints"], {k: v["success"] for k, v in scores.items()},
                                           threshold)) is not None:
                scores = score_all(task, out, runs, ws_model, seeds, [d])
        for r in runs:
            r["points"] = points(r)
        summary = summarise(runs, ws_score, threshold, a.budget_s)
        summary["heldout"] = {"episodes": len(seeds), "distinct_tasks": distinct,
                              "scored_distinct": scores[str(ws_model)]["distinct_tasks"]}
        summary["runs"] = runs
        results["tasks"][name] = summary
        plot(name, runs, ws_score, threshold, a.out / f"vs_trl_{name}.png")
        print(table(name, summary))
    (a.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
