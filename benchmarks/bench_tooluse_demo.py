"""The tool-use demo learns (issue 20): ``configs/tooluse.yaml`` end to end, one run per seed, one run at a time.

Each seed runs ``agentrl train configs/tooluse.yaml`` in a child process (warm start on noisy scripted
ToolLookup-v0 episodes, held-out evaluation, RL, held-out evaluation) with ``seed``, ``trainer.seed``,
``engine.seed`` and ``env.seed_start`` derived from the seed; the held-out seeds (>= 1,000,000) are the same for every
run and never trained on. The load average is sampled every 15 s during each run. Then it prints a markdown table
per seed (held-out success and reward before/after RL, tool-call parse errors and invalid actions per episode
before/after, wall times), writes ``OUT/results.json`` and the reward-curve plot ``OUT/tooluse_curves.png``
(:func:`plot`). The model is built before the first run and its build time is reported apart (set-up).

    nice -n 10 .venv/bin/python benchmarks/bench_tooluse_demo.py                    # 2 seeds, runs/bench-tooluse
    .venv/bin/python benchmarks/bench_tooluse_demo.py --report-only --runs runs/bench-tooluse/seed0 runs/x/seed1

Extra ``key=value`` arguments after ``--`` go to every run (e.g. ``-- steps=10 eval.episodes=32`` for a quick try).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _tree_cpu(root: int, seen: dict[int, float]) -> None:
    """Records in ``seen`` the CPU seconds (user + system) of ``root`` and every live descendant (the driver, Ray's
    processes, the trainer actor, vLLM's engine core), so that the largest value seen per pid survives its exit.
    Processes that live between two samples are missed: the sum is a lower bound."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(fields[1])
        cpu[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    for p in tree:
        if p in cpu:
            seen[p] = max(seen.get(p, 0.0), cpu[p])


def watch(pid: int, stop: threading.Event, every_s: float = 15.0) -> tuple[list[float], dict[int, float]]:
    """Samples the load average and the CPU time of ``pid``'s process tree every ``every_s`` until ``stop``;
    returns ``(load samples, {pid: cpu seconds})`` (filled in place while it runs)."""
    samples, seen = [_loadavg()], {}

    def loop() -> None:
        while True:
            _tree_cpu(pid, seen)
            if stop.wait(every_s):
                break
            samples.append(_loadavg())
        samples.append(_loadavg())

    threading.Thread(target=loop, daemon=True).start()
    return samples, seen


def run_seed(config: str, seed: int, run_dir: Path, extra: list[str]) -> dict:
    """Runs one seed to completion (or resumes it if ``run_dir`` holds a partial run); returns the load samples and
    the command."""
    cmd = [str(ROOT / ".venv" / "bin" / "agentrl"), "train", config, f"run_dir={run_dir}", f"seed={seed}",
           f"trainer.seed={seed}", f"engine.seed={seed}", f"env.seed_start={seed * 100_000}", "progress=false", *extra]
    if (run_dir / "metrics.jsonl").exists():
        cmd.insert(2, "--resume")
    stop = threading.Event()
    t0 = time.perf_counter()
    with open(run_dir.parent / f"{run_dir.name}.log", "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        samples, seen = watch(proc.pid, stop)
        rc = proc.wait()
    stop.set()
    time.sleep(0.5)
    if rc != 0:
        raise SystemExit(f"seed {seed}: `{' '.join(cmd)}` exited {rc}; see {run_dir.parent / (run_dir.name + '.log')}")
    return {"cmd": " ".join(cmd), "process_s": time.perf_counter() - t0, "load_samples": samples,
            "cpu_s": sum(seen.values())}


def read_run(run_dir: Path) -> dict:
    """The summary, the warm start's record and the per-step rows of a finished run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = {"run_dir": str(run_dir), "summary": json.loads((run_dir / "summary.json").read_text()), "rows": rows}
    ws = run_dir / "warmstart" / "warmstart.json"
    if ws.exists():
        out["warmstart"] = json.loads(ws.read_text())
    s, model = out["summary"], run_dir / "warmstart" / "model"
    if "rl_wall_s" not in s and model.exists():  # a run from before summary.json had its phases: file times
        s["rl_wall_s"] = (run_dir / "summary.json").stat().st_mtime - model.stat().st_mtime
    meta = run_dir / "bench.json"
    if meta.exists():
        out.update(json.loads(meta.read_text()))
    return out


def lookup_name_accuracy(run_dir: Path, steps: tuple[int, int]) -> tuple[int, int]:
    """``(right, calls)``: of the ``lookup`` calls in the trained batches of steps ``steps[0]..steps[1]``, how many
    name the person the question asks about (the copy a warm-started policy must have before RL can find rewards)."""
    from agentrl.tools import parse_tool_calls

    path, right, calls = run_dir / "trajectories.jsonl", 0, 0
    if not path.exists():
        return 0, 0
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not steps[0] <= rec.get("step", -1) <= steps[1]:
            continue
        msgs = rec["trajectory"]["messages"]
        question = next((m["content"] for m in msgs if m["role"] == "user"), "")
        for m in msgs:
            if m["role"] != "assistant":
                continue
            for c in parse_tool_calls(m["content"]).calls:
                if c.name == "lookup":
                    calls += 1
                    name = str(c.arguments.get("name", "")).strip()
                    right += bool(name) and f" {name} " in f" {question} ".replace("?", " ")
    return right, calls


def table(runs: list[dict]) -> str:
    """A markdown table, one row per run."""
    head = ("| seed | held-out success: warm start → after RL (gain) | held-out reward | parse errors / episode | "
            "invalid actions / episode | lookups naming the asked person, first → last 2 RL steps | RL steps | RL phase (evals incl.) | warm start | whole run | load avg "
            "(min–max, mean) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in runs:
        s = r["summary"]
        b, a = s.get("eval_before", {}), s.get("eval_after", {})
        load = r.get("load_samples") or [float("nan")]
        lines.append(
            f"| {r.get('seed', '?')} | {b.get('success', float('nan')):.3f} → **{a.get('success', float('nan')):.3f}** "
            f"({a.get('success', 0) - b.get('success', 0):+.3f}) | {b.get('reward', float('nan')):.3f} → "
            f"{a.get('reward', float('nan')):.3f} | {b.get('parse_errors_per_episode', float('nan')):.3f} → "
            f"{a.get('parse_errors_per_episode', float('nan')):.3f} | "
            f"{b.get('invalid_actions_per_episode', float('nan')):.3f} → "
            f"{a.get('invalid_actions_per_episode', float('nan')):.3f} | "
            f"{'/'.join(map(str, r.get('lookup_name_first2', ('?', '?'))))} → "
            f"{'/'.join(map(str, r.get('lookup_name_last2', ('?', '?'))))} | {s.get('steps')} | "
            f"{s.get('rl_wall_s', float('nan')) / 60:.1f} min | {s.get('warm_start_s', float('nan')) / 60:.1f} min | "
            f"{s.get('wall_s', float('nan')) / 60:.1f} min (≥ {r.get('cpu_s', float('nan')):.0f} CPU-s) | "
            f"{min(load):.1f}–{max(load):.1f}, "
            f"{sum(load) / len(load):.1f} |")
    return "\n".join(lines)


def _smooth(values: list[float], k: int = 5) -> list[float]:
    return [sum(values[max(0, i - k + 1): i + 1]) / len(values[max(0, i - k + 1): i + 1]) for i in range(len(values))]


def plot(runs: list[dict], out: Path) -> Path:
    """Writes the curves of ``runs`` to ``out`` (PNG): per seed, the batch reward of each RL step (5-step moving
    average) and the held-out reward before RL, at the ``eval.every`` points and after RL; and the tool-call parse
    errors per episode of each batch. The x axis is the RL phase's wall time in minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, r in enumerate(runs):
        rows, s, color = r["rows"], r["summary"], f"C{i}"
        if not rows:
            continue
        t0 = rows[0]["wall_s"] - rows[0]["time/step_s"]
        minutes = [(row["wall_s"] - t0) / 60 for row in rows]
        label = f"seed {r.get('seed', i)}"
        axes[0].plot(minutes, _smooth([row["reward"] for row in rows]), color=color, alpha=0.6,
                     label=f"{label}: batch reward (5-step mean)")
        held = [(0.0, s["eval_before"]["reward"])] if "eval_before" in s else []
        held += [(m, row["eval/reward"]) for m, row in zip(minutes, rows) if "eval/reward" in row]
        if "eval_after" in s:
            held.append((minutes[-1], s["eval_after"]["reward"]))
        if held:
            axes[0].plot(*zip(*held), color=color, marker="o", linestyle="--", label=f"{label}: held-out reward")
        axes[1].plot(minutes, _smooth([row.get("tool/parse_errors_per_episode", float("nan")) for row in rows]),
                     color=color, label=f"{label}: parse errors / episode (batch, 5-step mean)")
        if "eval_before" in s and "eval_after" in s:
            axes[1].plot([0.0, minutes[-1]], [s["eval_before"].get("parse_errors_per_episode", float("nan")),
                                              s["eval_after"].get("parse_errors_per_episode", float("nan"))],
                         color=color, marker="o", linestyle="--", label=f"{label}: held-out")
    for ax, ylabel in zip(axes, ("reward", "tool-call parse errors per episode")):
        ax.set_xlabel("RL wall time, minutes (warm start before 0)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.suptitle("configs/tooluse.yaml: RL on ToolLookup-v0 after a noisy warm start (CPU, tiny-tool model)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/tooluse.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default="runs/bench-tooluse", help="run directories OUT/seedN, results.json, the PNG")
    ap.add_argument("--report-only", action="store_true", help="read finished runs (--runs or OUT/seedN), run none")
    ap.add_argument("--runs", nargs="*", default=None, help="with --report-only: the run directories to report")
    ap.add_argument("--png", default=None, help="plot path (default OUT/tooluse_curves.png)")
    args, extra = ap.parse_known_args(argv)
    extra = [e for e in extra if e != "--"]
    out = Path(args.out)
    dirs = [Path(p) for p in args.runs] if args.runs else [out / f"seed{s}" for s in args.seeds]
    if not args.report_only:
        from agentrl.inference.config import EngineConfig
        from agentrl.controller.run import load_config

        cfg = load_config(args.config, extra)
        t0 = time.perf_counter()
        EngineConfig(model=cfg.engine.model).resolved_model()  # set-up: the model build, timed apart
        print(f"model {cfg.engine.model}: ready in {time.perf_counter() - t0:.1f} s (set-up)", flush=True)
        for seed, d in zip(args.seeds, dirs):
            d.parent.mkdir(parents=True, exist_ok=True)
            print(f"seed {seed}: {d} (load {_loadavg():.1f})", flush=True)
            meta = {"seed": seed, **run_seed(args.config, seed, d, extra)}
            (d / "bench.json").write_text(json.dumps(meta, indent=2))
    runs = [read_run(d) for d in dirs]
    for d, r in zip(dirs, runs):
        r["lookup_name_first2"] = lookup_name_accuracy(d, (1, 2))
        r["lookup_name_last2"] = lookup_name_accuracy(d, (max(1, len(r["rows"]) - 1), len(r["rows"])))
    for seed, r in zip(args.seeds, runs):
        r.setdefault("seed", seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(runs, indent=2))
    png = plot(runs, Path(args.png) if args.png else out / "tooluse_curves.png")
    print(table(runs))
    print(f"\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
