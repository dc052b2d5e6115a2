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


def stopped(run_dir: str, error: BaseException) -> int:
    """Reports a run that stopped on ``error`` (an engine or trainer process that died, a full disk, ...): the
    traceback goes to ``RUN_DIR/error.log``, the terminal gets the error, what the run dir keeps and the command that
    continues it. Returns the exit status, 1."""
    import sys
    import time
    import traceback

    from agentrl.controller.run import RunFiles

    files = RunFiles(run_dir)
    log_path = files.root / "error.log"
    try:
        files.root.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            f.write("".join(traceback.format_exception(error)))
        where = f"traceback in {log_path}"
    except OSError as e:
        traceback.print_exception(error)
        where = f"traceback above; {log_path} could not be written: {e.strerror}"
    msg = str(error).strip().splitlines()
    print(f"agentrl train: the run stopped: {type(error).__name__}: {msg[0][:300] if msg else ''} ({where})",
          file=sys.stderr)
    step = 0
    try:
        with open(files.metrics, encoding="utf-8") as f:
            for line in f:
                try:
                    step = max(step, int(json.loads(line).get("step", 0)))
                except (ValueError, TypeError, AttributeError):
                    continue
    except OSError:
        pass
    latest = files.latest_checkpoint()
    if latest is None:
        print(f"agentrl train: {run_dir} has metrics up to step {step} and no checkpoint yet: a new run starts over",
              file=sys.stderr)
    else:
        print(f"agentrl train: {run_dir} has metrics up to step {step}; continue from the checkpoint of step "
              f"{latest[0]} with: agentrl train --resume {run_dir}", file=sys.stderr)
    return 1


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
    try:
        summary = asyncio.run(train(cfg, resume=bool(args.resume)))
    except ConfigError:
        raise  # found before the run started (a run dir in use): the command line's config error, exit 2
    except Exception as e:  # noqa: BLE001 (the command's last word: what stopped, what is kept, how to go on)
        return stopped(cfg.run_dir, e)
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    print(json.dumps(summary, indent=2))
    if before and after:
        print(f"held-out reward: {before['reward']:.3f} before RL -> {after['reward']:.3f} after "
              f"{summary['steps']} steps ({summary['wall_s']:.0f} s); run dir {cfg.run_dir}")
    return 0
