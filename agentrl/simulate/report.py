"""Sweeps of simulated runs, their speed-ups against a baseline, and the table and plot that show them.

:func:`sweep` runs one simulation per point of the grid of ``--sweep KEY=V1,V2`` axes (the product of the axes, in
order); a point's speed-up is its baseline's wall time over its own, where the baseline is the point with the same
values on every axis except those ``baseline`` names (``KEY=VALUE`` each, e.g. ``run.async_ratio=0``: synchronous
training; with ``hardware.trainer_gpus=0`` too: on the same GPUs, co-located), which replace its own; without a
baseline every point is held against the grid's first point.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable


def parse_axes(specs: list[str]) -> list[tuple[str, list[str]]]:
    axes = []
    for spec in specs:
        key, sep, vals = spec.partition("=")
        if not sep or not key or not vals:
            raise ValueError(f"--sweep must be KEY=V1,V2,..., got {spec!r}")
        axes.append((key, vals.split(",")))
    return axes


def sweep(run_one: Callable[[list[str]], dict[str, Any]], axes: list[tuple[str, list[str]]],
          baseline: list[str] | None = None) -> list[dict[str, Any]]:
    """Runs ``run_one(overrides)`` for every point of the grid (and for each point's baseline, once); returns one
    row per grid point: the point's axis values, its figures and ``speedup``."""
    keys = [k for k, _ in axes]
    base_at: dict[str, str] = {}
    for b in baseline or []:
        key, sep, val = b.partition("=")
        if not sep or not key:
            raise ValueError(f"--baseline must be KEY=VALUE, got {b!r}")
        base_at[key] = val
    cache: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}

    def at(point: dict[str, str]) -> dict[str, Any]:
        ident = tuple(sorted(point.items()))
        if ident not in cache:
            cache[ident] = run_one([f"{k}={v}" for k, v in point.items()])
        return cache[ident]

    rows = []
    first = None
    for values in itertools.product(*[v for _, v in axes]) if axes else [()]:
        point = dict(zip(keys, values))
        r = at(point)
        if base_at:
            base = at({**point, **base_at})
        else:
            first = first or r
            base = first
        r = {k: v for k, v in r.items() if k != "tasks"}
        rows.append({**point, **r, "speedup": base["wall_s"] / r["wall_s"] if r["wall_s"] else float("inf")})
    return rows


def _hist(st: dict[Any, float]) -> str:
    return " ".join(f"{k}:{v:.2f}" for k, v in st.items())


def table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """A Markdown table: the axes, wall time, speed-up, engine and trainer utilisation, staleness."""
    head = [*keys, "wall (s)", "speed-up", "engine util", "trainer util", "staleness (share by age)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [str(r.get(k, "-")) for k in keys] + [
            f"{r['wall_s']:.1f}", f"{r['speedup']:.2f}x", f"{r['engine_busy_frac']:.2f}",
            f"{r['trainer_busy_frac']:.2f}", _hist(r["staleness"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], keys: list[str], path: str, title: str = "") -> None:
    """Speed-up against the first axis, one line per combination of the other axes; utilisation below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, rest = keys[0], keys[1:]
    series: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(tuple(str(r[k]) for k in rest), []).append(r)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for label, rs in series.items():
        xs = [str(r[x_key]) for r in rs]
        name = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(rest, label)) or "speed-up"
        ax1.plot(xs, [r["speedup"] for r in rs], marker="o", label=name)
        ax2.plot(xs, [r["engine_busy_frac"] for r in rs], marker="o", label=f"engine {name}")
        ax2.plot(xs, [r["trainer_busy_frac"] for r in rs], marker="s", linestyle="--", label=f"trainer {name}")
    ax1.axhline(1.0, color="grey", linewidth=0.8)
    ax1.set_ylabel("speed-up vs baseline")
    ax1.legend(fontsize=7)
    ax1.set_title(title or "agentrl simulate")
    ax2.set_ylabel("utilisation")
    ax2.set_xlabel(x_key)
    ax2.set_ylim(0, 1.05)
    ax2.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
