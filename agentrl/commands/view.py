"""``agentrl view PATH [--host H] [--port P] [--tokenizer DIR]``: serve a local page over a run directory (or a
trajectories .jsonl file): the run's curves, the trajectory list, and each trajectory token by token.

PATH is a training run directory (``metrics.jsonl``, ``trajectories.jsonl``, ``trainer_logprobs.jsonl``), an
``agentrl eval`` output directory, or one trajectories file (``agentrl rollout``'s, ``agentrl eval``'s). The server
binds 127.0.0.1 unless ``--host`` says otherwise, reads only those files, and runs until Ctrl-C. Requests must
name an allowed host (default: the loopback names and ``--host``; add names with ``--allowed-host``), so a web page
that rebinds its DNS name to this machine cannot read the run (see README's Security section).
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="browse a run's curves and trajectories in a local web page",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="run directory, eval output directory, or trajectories .jsonl file")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; anything else exposes the run's data to that network)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a host name the page is reached by, beyond the loopback names and --host (repeatable; "
                        "'*' accepts any)")
    p.add_argument("--tokenizer", help="tokenizer directory or tokenizer.json for token text (default: found "
                                       "in the run directory's checkpoints or config.yaml)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import ipaddress

    from agentrl.netguard import LOOPBACK_NAMES, default_hosts
    from agentrl.viewer.server import RunData, start

    try:
        data = RunData(args.path, args.tokenizer)
    except FileNotFoundError as e:
        print(f"agentrl view: {e}", file=sys.stderr)
        return 2
    try:
        if not ipaddress.ip_address(args.host).is_loopback:
            print(f"agentrl view: warning: binding {args.host} serves this run's data to every host that can reach "
                  "it (no authentication)", file=sys.stderr)
    except ValueError:
        pass

    async def main() -> None:
        try:
            allowed = None
            if args.allowed_host:
                allowed = [*(default_hosts(args.host) or LOOPBACK_NAMES), *args.allowed_host]
            runner, url = await start(data, args.host, args.port, allowed_hosts=allowed)
        except OSError as e:
            raise SystemExit(f"agentrl view: cannot listen on {args.host}:{args.port}: {e.strerror} "
                             "(try --port 0 for a free port)") from None
        for note in data.notes:
            print(f"agentrl view: {note}", file=sys.stderr)
        print(f"agentrl view: serving {data.root} at {url}  (Ctrl-C stops)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return 0
