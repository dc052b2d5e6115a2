"""``agentrl sandboxes build-image [--base|--busybox|--all] [--force]``, ``agentrl sandboxes sweep [--run ID]
[--everything]`` and ``agentrl sandboxes list [--run ID]``.

build-image: runs the recipes of ``sandboxes/images/`` (debootstrap / busybox-static, needs root), keeps the rootfs in
the cache for the bwrap backend and imports it into Docker (skipped when the tag exists, unless --force).
sweep: removes leftover sandboxes: all of run ID with --run, every agentrl sandbox with --everything, otherwise only
orphans (expired, exited, or whose driver process on this host is gone).
list: prints the agentrl containers and bwrap sandboxes present on this host.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("sandboxes", help="build sandbox images, list and sweep sandboxes")
    sub = parser.add_subparsers(dest="sandboxes_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])

    p_build = sub.add_parser("build-image", help="build agentrl-base / agentrl-busybox offline (needs root)")
    which = p_build.add_mutually_exclusive_group()
    which.add_argument("--base", action="store_true", help="agentrl-base:latest (Debian minbase, python3, git)")
    which.add_argument("--busybox", action="store_true", help="agentrl-busybox:latest (static busybox)")
    which.add_argument("--all", action="store_true", help="both (the default)")
    p_build.add_argument("--force", action="store_true", help="rebuild even when the image exists")
    p_build.add_argument("--no-docker", action="store_true", help="only prepare the rootfs (for bwrap)")
    p_build.set_defaults(func=_build)

    p_sweep = sub.add_parser("sweep", help="remove leftover sandboxes (containers, bwrap dirs and cgroups)")
    p_sweep.add_argument("--run", help="remove every sandbox of this run id")
    p_sweep.add_argument("--everything", action="store_true", help="remove every agentrl sandbox on this host")
    p_sweep.add_argument("--backend", choices=["docker", "bwrap", "all"], default="all")
    p_sweep.set_defaults(func=_sweep)

    p_list = sub.add_parser("list", help="list agentrl sandboxes on this host")
    p_list.add_argument("--run", help="only this run id")
    p_list.set_defaults(func=_list)


def _build(args: argparse.Namespace) -> int:
    from agentrl.sandboxes import SandboxError, build_image

    keys = ["base"] if args.base else ["busybox"] if args.busybox else ["busybox", "base"]
    for key in keys:
        try:
            tag = build_image(key, force=args.force, docker_import=not args.no_docker)
        except SandboxError as e:
            print(f"agentrl sandboxes build-image: {e}", file=sys.stderr)
            return 1
        except Exception as e:  # docker engine unreachable etc.
            print(f"agentrl sandboxes build-image: {key}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"ok {tag}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from agentrl.sandboxes import sweep

    report = sweep(
        args.run, everything=args.everything, docker=args.backend in ("docker", "all"),
        bwrap=args.backend in ("bwrap", "all"),
    )
    for name in report.containers:
        print(f"removed container {name}")
    for name in report.bwrap:
        print(f"removed bwrap {name}")
    for err in report.errors:
        print(f"warning: {err}", file=sys.stderr)
    print(f"swept {len(report.containers)} containers, {len(report.bwrap)} bwrap sandboxes")
    return 0


def _list(args: argparse.Namespace) -> int:
    from agentrl.sandboxes.base import LABEL_EXPIRES, LABEL_RUN, LABEL_SANDBOX, state_root
    from agentrl.sandboxes.docker import docker_available, docker_client

    ok, why = docker_available()
    if ok:
        label = f"{LABEL_RUN}={args.run}" if args.run else LABEL_RUN
        for c in docker_client().api.containers(all=True, filters={"label": label}):
            lab = c.get("Labels") or {}
            print(f"docker {lab.get(LABEL_RUN)} {lab.get(LABEL_SANDBOX)} {c.get('State')} "
                  f"expires={lab.get(LABEL_EXPIRES)}")
    else:
        print(f"docker: unavailable ({why})", file=sys.stderr)
    root = state_root()
    if root.is_dir():
        for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            if args.run and run_dir.name != args.run:
                continue
            for sb in sorted(p for p in run_dir.iterdir() if p.is_dir()):
                print(f"bwrap {run_dir.name} {sb.name} {sb}")
    return 0
