"""``agentrl simulate CONFIG [key=value ...] [--sweep KEY=V1,V2,...] [--json]``: runs the real training controller on
a virtual clock with cost models for the engine, the trainer and the envs (:mod:`agentrl.simulate`), and prints the
run's simulated wall time, the trainer's and the engine's busy fractions, the staleness histogram and, with
``--sweep``, each value's speed-up over the first. ``configs/simulate_env_latency.yaml`` is an example."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a training run's schedule on a virtual clock (cost models)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="YAML: run (TrainConfig fields), engine, trainer, response (the cost models)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. run.async_ratio=2 engine.sync_s=5")
    p.add_argument("--sweep", help="KEY=V1,V2,...: one simulation per value (e.g. run.async_ratio=0,1,2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON line per simulation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from agentrl.config import ConfigError, load
    from agentrl.simulate.run import SimulationConfig, simulate

    values: list[str | None] = [None]
    key = None
    if args.sweep:
        key, sep, vals = args.sweep.partition("=")
        if not sep or not key or not vals:
            print(f"agentrl simulate: --sweep must be KEY=V1,V2,..., got {args.sweep!r}")
            return 2
        values = vals.split(",")
    results = []
    for v in values:
        over = list(args.overrides) + ([f"{key}={v}"] if key else [])
        try:
            sim = load(SimulationConfig, args.config, over)
            r = simulate(sim, seed=args.seed)
        except (ConfigError, ValueError) as e:
            print(f"agentrl simulate: {e}")
            return 2
        r = {**({key: v} if key else {}), **r}
        results.append(r)
        if args.json:
            print(json.dumps(r))
    if not args.json:
        base = results[0]["wall_s"]
        print(f"{'value':>10} {'wall (s)':>10} {'speed-up':>9} {'trainer busy':>13} {'engine busy':>12}  staleness")
        for r in results:
            hist = " ".join(f"{k}:{v:.2f}" for k, v in r["staleness"].items())
            print(f"{str(r.get(key, '-')):>10} {r['wall_s']:>10.1f} {base / r['wall_s']:>8.2f}x "
                  f"{r['trainer_busy_frac']:>13.2f} {r['engine_busy_frac']:>12.2f}  {hist}")
    return 0
