"""Validation of an SWE suite: every instance must be resolved by its gold patch and not by the empty patch.

    python -m agentrl.envs.swe.validate [--instances FILE] [--repos-dir DIR] [--env-specs FILE] [--ids ID ...]
                                        [--concurrency N] [--backend docker|bwrap|auto] [--image IMAGE] [--episodes]
                                        [--json OUT]

Grades the gold and the empty patch of every instance (in fresh sandboxes, ``--concurrency`` instances at a time),
prints a table and exits 1 if any instance fails (2 on a usage or setup error). With ``--episodes`` it also plays
every instance through :class:`SWEEnv` with the oracle policy (reward must be 1) and the empty policy (reward must
be 0), which checks the tools and the diff-taking end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from agentrl.policy import EpisodeMeta, Policy, ScriptedPolicy

from .envspec import EnvSpecError, EnvSpecs
from .grader import GradeResult, grade
from .images import ImageBuilder
from .instances import SWEInstance, load_instances
from .repos import SUITE_INSTANCES, RepoStore


@dataclass
class EpisodeResult:
    """One played episode: the final reward, whether it ended by submit, and the final info."""

    instance_id: str
    reward: float
    terminated: bool
    truncated: bool
    turns: int
    info: dict[str, Any]
    duration: float


async def run_episode(env: Any, policy: Policy, instance_id: str, *, max_steps: int = 1000) -> EpisodeResult:
    """Plays one episode of ``env`` (an :class:`SWEEnv`, started on ``instance_id``) with ``policy``.

    A minimal loop for validation and tests; training and ``agentrl eval`` use the environment manager.
    The env is not closed (call ``aclose``); its sandbox is released when the episode ends.
    """
    t0 = time.monotonic()
    obs, info = await env.areset(options={"instance_id": instance_id})
    session = policy.session(EpisodeMeta(trajectory_id=uuid.uuid4().hex, group_id="validate", env_id="agentrl/SWE-v0",
                                         seed=None, task={"instance_id": instance_id}))
    reward, terminated, truncated, turns = 0.0, False, False, 0
    try:
        new = list(obs)
        while not (terminated or truncated) and turns < max_steps:
            action = await session.act(new)
            new, reward, terminated, truncated, info = await env.astep(action.text)
            new = list(new)
            turns += 1
    finally:
        await session.aclose()
    return EpisodeResult(instance_id, float(reward), terminated, truncated, turns, info, time.monotonic() - t0)


@dataclass
class ValidationRow:
    """The checks of one instance; ``ok`` iff gold resolves, empty does not (and the episodes, when run, agree)."""

    instance_id: str
    gold: GradeResult | None = None
    empty: GradeResult | None = None
    oracle_reward: float | None = None
    empty_reward: float | None = None
    problems: list[str] = field(default_factory=list)
    duration: float = 0.0
    attempts: int = 1
    retry_reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def validate_instance(
    inst: SWEInstance, *, images: ImageBuilder, episodes: bool, env_factory: Callable[[], Any] | None
) -> ValidationRow:
    retried: list[str] = []
    for attempt in range(2):  # an infrastructure failure (engine hiccup, container killed from outside) is retried once
        row = await _validate_once(inst, images=images, episodes=episodes, env_factory=env_factory)
        infra = [p for p in row.problems if p.startswith("SandboxError")]
        if not infra:
            break
        retried += infra
    row.attempts = attempt + 1
    row.retry_reasons = retried
    return row


async def _validate_once(
    inst: SWEInstance, *, images: ImageBuilder, episodes: bool, env_factory: Callable[[], Any] | None
) -> ValidationRow:
    t0 = time.monotonic()
    row = ValidationRow(inst.instance_id)
    try:
        await asyncio.to_thread(images.prepare, inst)  # build the image once, before both grades need it
        row.gold, row.empty = await asyncio.gather(grade(inst, inst.patch, images=images),
                                                   grade(inst, "", images=images))
        if not row.gold.resolved:
            row.problems.append(f"gold patch not resolved: {row.gold.reason}")
        if row.empty.resolved:
            row.problems.append("empty patch resolved the instance")
        if episodes and env_factory is not None:
            from .env import empty_policy_fn, oracle_policy_fn

            for name, fn, want in (("oracle", oracle_policy_fn([inst]), 1.0), ("empty", empty_policy_fn, 0.0)):
                env = env_factory()
                try:
                    res = await run_episode(env, ScriptedPolicy(fn), inst.instance_id)
                finally:
                    await env.aclose()
                setattr(row, f"{name}_reward", res.reward)
                if res.reward != want:
                    row.problems.append(f"{name} episode reward {res.reward} (expected {want}): {res.info.get('grade', {}) and res.info['grade'].get('reason')}")
    except Exception as e:  # one broken instance must not hide the others' results
        row.problems.append(f"{type(e).__name__}: {e}")
    row.duration = time.monotonic() - t0
    return row


async def validate_instances(
    instances: Sequence[SWEInstance],
    *,
    spec: Any = None,
    repo_store: RepoStore | None = None,
    env_specs: EnvSpecs | None = None,
    concurrency: int = 4,
    episodes: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    progress: Callable[[ValidationRow], None] | None = None,
) -> list[ValidationRow]:
    """Validates ``instances`` with at most ``concurrency`` instances in flight (each uses 2 sandboxes at once);
    returns one row per instance, in input order. ``progress`` is called as each row finishes."""
    from .env import SWEEnv

    store = repo_store or RepoStore()
    if spec is None:
        from .grader import default_spec

        spec = default_spec()
    images = ImageBuilder(spec, store, env_specs)
    sem = asyncio.Semaphore(max(1, concurrency))

    def env_factory() -> Any:
        return SWEEnv(list(instances), images=images, **dict(env_kwargs or {}, sandbox=spec))

    async def one(inst: SWEInstance) -> ValidationRow:
        async with sem:
            row = await validate_instance(inst, images=images, episodes=episodes, env_factory=env_factory)
        if progress is not None:
            progress(row)
        return row

    return list(await asyncio.gather(*(one(i) for i in instances)))


def format_table(rows: Sequence[ValidationRow], episodes: bool) -> str:
    """A markdown table: one line per instance, then the totals."""
    head = ["instance", "gold", "empty", "F2P", "P2P"] + (["oracle ep", "empty ep"] if episodes else []) + ["time s", "ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        g, e = r.gold, r.empty
        cells = [
            r.instance_id,
            "-" if g is None else ("resolved" if g.resolved else "UNRESOLVED"),
            "-" if e is None else ("RESOLVED" if e.resolved else "unresolved"),
            "-" if g is None else str(len(g.fail_to_pass)),
            "-" if g is None else str(len(g.pass_to_pass)),
        ]
        if episodes:
            cells += ["-" if r.oracle_reward is None else f"{r.oracle_reward:g}", "-" if r.empty_reward is None else f"{r.empty_reward:g}"]
        cells += [f"{r.duration:.1f}", "ok" if r.ok else "FAIL"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Adds the validation options to ``parser`` (or a new one); the CLI's ``eval validate-swe`` reuses this."""
    p = parser or argparse.ArgumentParser(prog="python -m agentrl.envs.swe.validate", description=__doc__.splitlines()[0])
    p.add_argument("--instances", default=str(SUITE_INSTANCES), help="SWE-bench-format JSONL (default: the shipped suite)")
    p.add_argument("--repos-dir", default=None, help="directory of repositories (default: the suite's)")
    p.add_argument("--env-specs", default=None, help="YAML/JSON env specs per repository and version")
    p.add_argument("--cache-dir", default=None, help="where working copies are built (default ~/.cache/agentrl/swe)")
    p.add_argument("--ids", nargs="*", default=None, help="validate only these instance ids")
    p.add_argument("--concurrency", type=int, default=4, help="instances validated at once (2 sandboxes each)")
    p.add_argument("--backend", default="docker", choices=["docker", "bwrap", "auto"])
    p.add_argument("--image", default=None, help="sandbox image (default agentrl-base:latest)")
    p.add_argument("--episodes", action="store_true", help="also play oracle and empty episodes through SWEEnv")
    p.add_argument("--json", default=None, help="write the per-instance results as JSON here")
    return p


def run(args: argparse.Namespace) -> int:
    """Runs the validation described by ``args``; returns the exit code (0 all ok, 1 a failure, 2 setup error)."""
    from .env import _sandbox_spec
    from .instances import InstanceError

    try:
        instances = load_instances(args.instances, args.ids)
        spec = _sandbox_spec({"backend": args.backend, **({"image": args.image} if args.image else {})})
        env_specs = EnvSpecs.load(args.env_specs)
    except (InstanceError, EnvSpecError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    store = RepoStore(args.repos_dir, args.cache_dir) if args.repos_dir else RepoStore(cache_dir=args.cache_dir)
    t0 = time.monotonic()
    done = [0]

    def progress(row: ValidationRow) -> None:
        done[0] += 1
        print(f"[{done[0]}/{len(instances)}] {row.instance_id}: {'ok' if row.ok else 'FAIL: ' + '; '.join(row.problems)}",
              file=sys.stderr, flush=True)

    rows = asyncio.run(validate_instances(instances, spec=spec, repo_store=store, env_specs=env_specs,
                                          concurrency=args.concurrency, episodes=args.episodes, progress=progress))
    wall = time.monotonic() - t0
    print(format_table(rows, args.episodes))
    failed = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} instances ok; wall time {wall:.1f}s "
          f"(concurrency {args.concurrency}, backend {spec.backend})")
    for r in rows:
        if r.attempts > 1:
            print(f"retried {r.instance_id} after: {'; '.join(r.retry_reasons)[:300]}")
    for r in failed:
        print(f"FAIL {r.instance_id}: {'; '.join(r.problems)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"wall_s": wall, "rows": [
                {"instance_id": r.instance_id, "ok": r.ok, "problems": r.problems, "duration": r.duration,
                 "gold": r.gold.to_dict() if r.gold else None, "empty": r.empty.to_dict() if r.empty else None,
                 "oracle_reward": r.oracle_reward, "empty_reward": r.empty_reward, "attempts": r.attempts, "retry_reasons": r.retry_reasons} for r in rows]}, f, indent=1)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
