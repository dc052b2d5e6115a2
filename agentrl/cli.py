"""The ``agentrl`` command. Each subcommand lives in ``agentrl/commands/<name>.py`` and exposes
``add_parser(subparsers)``, which registers its parser and sets ``func(args) -> int``. Heavy imports (torch,
vLLM, Ray) happen inside ``func``, so ``agentrl envs list`` stays fast."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = ("envs", "sandboxes", "models", "rollout", "train", "eval", "view", "gateway", "simulate")


def build_parser() -> argparse.ArgumentParser:
    import agentrl

    parser = argparse.ArgumentParser(prog="agentrl", description="RL for LLM agents on multi-turn environments.")
    parser.add_argument("--version", action="version", version=f"agentrl {agentrl.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"agentrl.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"agentrl.commands.{name}":
                continue  # not built in this checkout
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from agentrl import childwatch
    from agentrl.config import ConfigError

    childwatch.install()  # every subprocess asyncio starts (sandboxes, MCP servers) watched without a thread each

    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"agentrl: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentrl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`agentrl envs list | head`): no traceback, and none at exit's flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
