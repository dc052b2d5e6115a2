"""``agentrl train CONFIG [key=value ...]`` and ``agentrl train --resume RUN_DIR [key=value ...]``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy with RL (sync or async)", description=__doc__)
    p.add_argument("config", nargs="?", help="YAML training config (e.g. configs/quickstart.yaml)")
    p.add_argument("overrides", nargs="*", help="config overrides, key.sub=value")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import os

    # vLLM logs every pause/resume of a weight update at INFO; the progress bar and metrics.jsonl say more.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    from agentrl.config import ConfigError
    from agentrl.controller.run import load_config, train

    overrides = list(args.overrides)
    if args.resume:
        if args.config:  # `agentrl train --resume DIR key=value`: argparse puts the first override in `config`
            overrides.insert(0, args.config)
        path = Path(args.resume) / "config.yaml"
        if not path.exists():
            raise ConfigError(f"{path}: no such file (is {args.resume} a run directory?)")
        overrides.append(f"run_dir={args.resume}")
    elif args.config:
        path = Path(args.config)
    else:
        print("agentrl train: give a CONFIG or --resume RUN_DIR")
        return 2
    cfg = load_config(path, overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    summary = asyncio.run(train(cfg, resume=bool(args.resume)))
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    print(json.dumps(summary, indent=2))
    if before and after:
        print(f"held-out reward: {before['reward']:.3f} before RL -> {after['reward']:.3f} after "
              f"{summary['steps']} steps ({summary['wall_s']:.0f} s); run dir {cfg.run_dir}")
    return 0
