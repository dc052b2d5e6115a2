"""Plots of ``bench_offpolicy_learning.py``'s ``results.json`` (matplotlib, PNG):

- ``offpolicy_async.png``: held-out reward against trained steps and against wall time, α = 0 vs α = 2;
- ``offpolicy_losses.png``: held-out reward and batch reward (5-step moving average) against steps at α = 4, per loss.

Each line is the mean over seeds; the band spans the seeds' minimum and maximum.

    .venv/bin/python benchmarks/plot_offpolicy.py runs/bench-offpolicy/results.json [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _curve(runs: list[dict], x_of):
    """Mean, min and max over runs of the held-out reward at the eval points shared by every run."""
    import numpy as np

    points = sorted(set.intersection(*({s for s, _ in r["evals"]} for r in runs)))
    ys = np.array([[dict(r["evals"])[s] for s in points] for r in runs])
    xs = np.array([[x_of(r, s) for s in points] for r in runs]).mean(0)
    return xs, ys.mean(0), ys.min(0), ys.max(0)


def _elapsed(run: dict, step: int) -> float:
    return sum(r["time/step_s"] for r in run["rows"] if r["step"] <= step)


def _smooth(values: list[float], k: int = 5) -> list[float]:
    return [sum(values[max(0, i - k + 1): i + 1]) / len(values[max(0, i - k + 1): i + 1]) for i in range(len(values))]


def plot(results_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Writes the PNGs for the experiments present in ``results_path``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    res = json.loads(Path(results_path).read_text())
    out_dir = Path(out_dir)
    written = []
    if res.get("async"):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for alpha, runs in res["async"].items():
            for ax, x_of, xlabel in ((axes[0], lambda r, s: s, "trained steps"),
                                     (axes[1], _elapsed, "training wall time, s (evaluation excluded)")):
                xs, mean, lo, hi = _curve(runs, x_of)
                ax.plot(xs, mean, marker="o", label=f"α = {alpha} ({len(runs)} seeds)")
                ax.fill_between(xs, lo, hi, alpha=0.2)
                ax.set_xlabel(xlabel)
                ax.set_ylabel("held-out reward")
        axes[0].legend()
        fig.suptitle("Synchronous (α = 0) against asynchronous (α = 2) training, CPU quickstart")
        fig.tight_layout()
        p = out_dir / "offpolicy_async.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    if res.get("losses"):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for loss, runs in res["losses"].items():
            xs, mean, lo, hi = _curve(runs, lambda r, s: s)
            line, = axes[0].plot(xs, mean, marker="o", label=f"{loss} ({len(runs)} seeds)")
            axes[0].fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
            batch = np.array([_smooth([r["reward"] for r in run["rows"]]) for run in runs])
            steps = [r["step"] for r in runs[0]["rows"]]
            axes[1].plot(steps, batch.mean(0), color=line.get_color(), label=loss)
        axes[0].set_xlabel("trained steps")
        axes[0].set_ylabel("held-out reward")
        axes[1].set_xlabel("trained steps")
        axes[1].set_ylabel("batch reward (5-step moving average)")
        axes[0].legend(fontsize=8)
        fig.suptitle("Off-policy corrections at α = 4, CPU quickstart")
        fig.tight_layout()
        p = out_dir / "offpolicy_losses.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    for path in plot(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else Path(sys.argv[1]).parent):
        print(path)
