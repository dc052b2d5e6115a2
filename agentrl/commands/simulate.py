"""``agentrl simulate CONFIG [key=value ...] [--sweep KEY=V1,V2,... ...] [--baseline KEY=V] [--json] [--plot PNG]``:
runs the real training controller on a virtual clock with cost models for the engine, the trainer and the envs
(:mod:`agentrl.simulate`), and prints the run's simulated wall time, the engine's and the trainer's utilisation, the
staleness histogram and, with ``--sweep`` (repeatable: a grid), each point's speed-up over its baseline (the same
point with ``--baseline``'s values, e.g. ``run.async_ratio=0``; else the grid's first point) as a Markdown table;
``--plot`` draws the speed-ups and utilisations. ``configs/simulate/`` has the papers' settings."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a training run's schedule on a virtual clock (cost models)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="YAML: run (TrainConfig fields), hardware, engine, trainer, response")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. run.async_ratio=2 engine.sync_s=5")
    p.add_argument("--sweep", action="append", default=[],
                   help="KEY=V1,V2,...: one simulation per value; repeat for a grid (e.g. run.async_ratio=0,1,2)")
    p.add_argument("--baseline", action="append", default=[],
                   help="KEY=VALUE (repeatable): each point's speed-up is over the point with these values "
                        "(e.g. run.async_ratio=0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON line per simulation")
    p.add_argument("--plot", help="write a PNG of the speed-ups and utilisations here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from agentrl.config import ConfigError, load
    from agentrl.simulate.report import parse_axes, plot, sweep, table
    from agentrl.simulate.run import SimulationConfig, simulate

    def one(over: list[str]) -> dict:
        return simulate(load(SimulationConfig, args.config, list(args.overrides) + over), seed=args.seed)

    try:
        axes = parse_axes(args.sweep)
        rows = sweep(one, axes, args.baseline)
    except (ConfigError, ValueError) as e:
        print(f"agentrl simulate: {e}")
        return 2
    keys = [k for k, _ in axes]
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(table(rows, keys))
    if args.plot:
        plot(rows, keys or ["run.async_ratio"], args.plot, title=args.config)
        print(f"plot: {args.plot}")
    return 0
