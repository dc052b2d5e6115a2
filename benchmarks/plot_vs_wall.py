"""Held-out success against RL wall seconds for the runs of a ``bench_credit.py`` output directory (its ``--arm``
runs: LoRA against full fine-tuning, issue 29), and each run's success at equal wall time.

A run's RL clock is the sum of its steps' ``time/step_s`` (rollout wait, train, weight sync; the evaluations are
left out, since they cost every arm the same and are not training). The budget is the faster arm's longest run;
each run's success at the budget is its newest evaluation at or before it (a step function: what the run had to
show by then).

    .venv/bin/python benchmarks/plot_vs_wall.py runs/bench-lora        # prints the table, writes OUT/vs_wall.png
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl_common import success_at  # noqa: E402  (one step-function reading for both benchmarks)


def run_points(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((run / "summary.json").read_text())
    t, pts = 0.0, [(0.0, summary["eval_before"]["success"])]
    for r in rows:
        t += r["time/step_s"]
        if "eval/success" in r:
            pts.append((t, r["eval/success"]))
    pts.append((t, summary["eval_after"]["success"]))
    mean = lambda k: statistics.fmean(r.get(k, 0.0) for r in rows)  # noqa: E731
    return {"points": pts, "rl_s": t, "step_s": mean("time/step_s"), "train_s": mean("train/perf/step_s"),
            "wait_rollout_s": mean("time/wait_rollout_s"), "sync_s": mean("weights/sync_s"),
            "sync_bytes": rows[-1].get("weights/bytes")}


def main(out: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = {e.name: {} for e in sorted(out.iterdir()) if e.is_dir() and any(e.glob("*-seed*/summary.json"))}
    for env in envs:
        for run in sorted((out / env).glob("*-seed*")):
            if (run / "summary.json").exists():
                arm, _, seed = run.name.rpartition("-seed")
                envs[env].setdefault(arm, []).append({"seed": int(seed), **run_points(run)})
    if not envs:
        print(f"no finished run under {out}")
        return 1
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 4), squeeze=False)
    print("| env | arm | seeds | RL s per step (train / rollout wait / sync) | bytes per sync | success after all "
          "steps | success at equal wall (budget) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for ax, (env, arms) in zip(axes[0], envs.items()):
        budget = max(r["rl_s"] for r in min(arms.values(), key=lambda rs: statistics.fmean(r["rl_s"] for r in rs)))
        for i, (arm, runs) in enumerate(arms.items()):
            for j, r in enumerate(runs):
                xs, ys = zip(*r["points"])
                ax.step(xs, ys, where="post", color=f"C{i}", alpha=0.8, label=f"{arm}" if j == 0 else None)
            f = lambda k: statistics.fmean(r[k] for r in runs)  # noqa: E731
            after = [r["points"][-1][1] for r in runs]
            at = [success_at(r["points"], budget) for r in runs]
            print(f"| {env} | {arm} | {len(runs)} | {f('step_s'):.2f} ({f('train_s'):.2f} / {f('wait_rollout_s'):.2f} / "
                  f"{f('sync_s'):.3f}) | {runs[0]['sync_bytes']:,.0f} | {statistics.fmean(after):.3f} "
                  f"({', '.join(f'{a:.3f}' for a in after)}) | {statistics.fmean(at):.3f} ({budget:.0f} s) |")
        ax.axvline(budget, color="grey", ls=":", lw=1)
        ax.set_title(env)
        ax.set_xlabel("RL wall seconds (evaluations excluded)")
        ax.set_ylabel("held-out success")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "vs_wall.png", dpi=110)
    print(f"\nplot: {out / 'vs_wall.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/bench-lora")))
