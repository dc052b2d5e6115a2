"""Plots bench_fleet.py's JSON outputs against the fleet size, one line per backend (fault runs as crosses).

    .venv/bin/python benchmarks/plot_fleet.py OUT.png RUN1.json RUN2.json ...

Panels: time to bring the fleet up and p99 sandbox start; p50 / p99 env step latency; env steps/s with the ideal
(cores / the step command's own CPU time) as a share; the load average of each run is written beside its point.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    out, files = sys.argv[1], sys.argv[2:]
    runs = [json.load(open(f)) for f in files]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"bwrap": "tab:blue", "docker": "tab:orange"}
    for backend in ("bwrap", "docker"):
        for faulty in (False, True):
            rs = sorted((r for r in runs if r["backend"] == backend
                         and bool(sum(r["fleet"]["faults"].values())) == faulty), key=lambda r: r["count"])
            if not rs:
                continue
            x = [r["count"] for r in rs]
            f = [r["fleet"] for r in rs]
            style = dict(color=colors[backend], marker="x" if faulty else "o", linestyle=":" if faulty else "-")
            tag = f"{backend}{' + faults' if faulty else ''}"
            axes[0].plot(x, [v["bring_up_s"] for v in f], label=f"{tag}: bring-up", **style)
            axes[0].plot(x, [v["start_p99_s"] for v in f], label=f"{tag}: start p99", alpha=0.5, **style)
            axes[1].plot(x, [v["step_p50_s"] for v in f], label=f"{tag}: p50", **style)
            axes[1].plot(x, [v["step_p99_s"] for v in f], label=f"{tag}: p99", alpha=0.5, **style)
            axes[2].plot(x, [v["steps_per_s"] for v in f], label=tag, **style)
            for xi, v, r in zip(x, f, rs):
                axes[2].annotate(f"{100 * (v['of_ideal'] or 0):.0f}% ideal\nload {r['loadavg_before'][0]:.0f}",
                                 (xi, v["steps_per_s"]), fontsize=7, textcoords="offset points", xytext=(4, 4))
    for ax, title, unit in zip(axes, ("bring the fleet up / sandbox start", "env step latency", "env steps/s"),
                               ("seconds", "seconds", "steps/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sandboxes alive at once")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("bench_fleet.py on a shared 2-core, 24 GiB machine (load average beside each run)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
