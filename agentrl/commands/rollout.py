"""``agentrl rollout``: roll out episodes of an env with a vLLM engine through the token-in/token-out agent loop and
write one trajectory (``agentrl.trajectory.Trajectory`` as JSON) per line.

    agentrl rollout --env agentrl/GuessNumber-v0 --episodes 16 --out traj.jsonl
    agentrl rollout --config configs/rollout.yaml --set rollout.temperature=0.7 --set manager.max_concurrency=8

Without ``--model`` (and without ``model:`` in the config) the tiny CPU model is used, built first if missing.
Episodes use seeds ``seed, seed+1, ...``. Trajectories are written in the order they finish. Exit status: 0 when
no episode ended in ``error``, 1 when some did or the engine died (the run stops there), 2 on a config error or an
unknown env id, 130 on Ctrl-C (the lines written so far are complete).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from agentrl.manager import ManagerConfig
from agentrl.agent.loop import RolloutConfig


@dataclass
class RolloutRunConfig:
    """``agentrl rollout``'s config file. ``engine`` holds ``agentrl.inference.EngineConfig`` fields (``model`` comes
    from ``model``), checked when the engine is built; ``rollout`` is the agent loop's :class:`RolloutConfig`;
    ``manager`` the :class:`~agentrl.manager.ManagerConfig` (``workers: 0`` keeps envs in this process)."""

    env: str = "agentrl/GuessNumber-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    episodes: int = 8
    seed: int = 0
    model: str | None = None  # a model directory; None or "tiny": the tiny CPU model (built if missing)
    out: str = "trajectories.jsonl"
    progress: bool = True
    engine: dict[str, Any] = field(default_factory=dict)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    manager: ManagerConfig = field(default_factory=lambda: ManagerConfig(max_concurrency=32))

    def validate(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if not self.out:
            raise ValueError("out must be a file path")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rollout",
        help="roll out episodes with a vLLM engine and write trajectories as JSONL",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="a YAML RolloutRunConfig (e.g. configs/rollout.yaml)")
    p.add_argument("--env", help="env id (default agentrl/GuessNumber-v0)")
    p.add_argument("--episodes", type=int, help="number of episodes")
    p.add_argument("--out", help="output JSONL file (overwritten)")
    p.add_argument("--model", help="model directory (default: the tiny model, built if missing)")
    p.add_argument("--seed", type=int, help="seed of the first episode")
    p.add_argument("--concurrency", type=int, help="episodes alive at once (manager.max_concurrency)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.set_defaults(func=_main)


def load_config(args: argparse.Namespace) -> RolloutRunConfig:
    """Returns the config from ``--config`` (or defaults), then ``--set`` overrides, then the flags."""
    from agentrl.config import apply_overrides, from_dict, load

    overrides = list(args.set)
    for flag, key in (("env", "env"), ("episodes", "episodes"), ("out", "out"), ("model", "model"),
                      ("seed", "seed"), ("concurrency", "manager.max_concurrency")):
        v = getattr(args, flag)
        if v is not None:
            overrides.append(f"{key}={v}" if not isinstance(v, str) else f"{key}={_yaml_str(v)}")
    if args.no_progress:
        overrides.append("progress=false")
    if args.config:
        return load(RolloutRunConfig, args.config, overrides)
    return from_dict(RolloutRunConfig, apply_overrides({}, overrides), "<command line>")


def _yaml_str(s: str) -> str:
    import json

    return json.dumps(s)  # a JSON string is a YAML string: no surprises with ':' or 'null'


def _main(args: argparse.Namespace) -> int:
    import asyncio

    cfg = load_config(args)
    return asyncio.run(run(cfg))


async def run(cfg: RolloutRunConfig, engine: Any = None) -> int:
    """Runs the rollout ``cfg`` describes; returns the exit status. ``engine``: an already started
    :class:`~agentrl.inference.base.InferenceEngine` serving ``cfg.model`` (then not closed here), else one is built
    from ``cfg.engine`` and closed at the end."""
    import asyncio
    import sys
    import time

    from agentrl.chat import load_tokenizer
    from agentrl.config import from_dict
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.manager import EnvManager, EpisodeSpec
    from agentrl.registration import check_make
    from agentrl.agent.loop import AgentLoopPolicy

    try:
        check_make(cfg.env, cfg.env_kwargs)  # an unknown id or a refused kwarg: said before minutes of engine start-up
    except ValueError as e:
        print(f"agentrl rollout: {e}", file=sys.stderr)
        return 2
    model = cfg.model
    if model in (None, "tiny"):
        from agentrl.models import ensure_tiny_model

        t = time.perf_counter()
        model = str(ensure_tiny_model())
        print(f"agentrl rollout: tiny model at {model} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
    tokenizer = load_tokenizer(model)
    t = time.perf_counter()
    own_engine = engine is None
    if own_engine:
        ecfg = from_dict(EngineConfig, {"model": model, **cfg.engine}, "engine")
        engine = await asyncio.to_thread(make_engine, ecfg)  # tens of seconds on a CPU
    counts: dict[str, int] = {}
    dead: str | None = None
    n_tokens = n_gen = 0
    rewards: list[float] = []
    try:
        policy = AgentLoopPolicy(engine, tokenizer, cfg.rollout)
        specs = [EpisodeSpec(cfg.env, env_kwargs=dict(cfg.env_kwargs), seed=cfg.seed + i) for i in range(cfg.episodes)]
        bar = None
        if cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.episodes, desc="episodes", unit="ep", file=sys.stderr)
        t_roll = time.perf_counter()
        with open(cfg.out, "w") as f:
            async with EnvManager(cfg.manager, policy) as mgr:
                async for _, traj in mgr.stream_episodes(specs):
                    if traj.termination == "error" and (dead := engine.dead()):
                        break  # every episode left would fail the same way
                    traj.validate()
                    f.write(traj.to_json() + "\n")
                    f.flush()
                    counts[traj.termination] = counts.get(traj.termination, 0) + 1
                    n_tokens += len(traj.token_ids)
                    n_gen += traj.num_generated
                    rewards.append(traj.reward)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(reward=f"{sum(rewards) / len(rewards):.2f}", gen_tok=n_gen)
        elapsed = time.perf_counter() - t_roll
        if bar is not None:
            bar.close()
    finally:
        if own_engine:
            await engine.close()
    if dead:
        print(f"agentrl rollout: stopped after {len(rewards)} of {cfg.episodes} episodes: {dead}", file=sys.stderr)
    mean_r = sum(rewards) / len(rewards) if rewards else 0.0
    print(f"agentrl rollout: {len(rewards)} trajectories -> {cfg.out} in {elapsed:.1f} s "
          f"(engine start-up {t_roll - t:.1f} s); mean reward {mean_r:.3f}; {n_gen} generated tokens "
          f"({n_gen / max(elapsed, 1e-9):.0f}/s) of {n_tokens}; " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
          file=sys.stderr)
    return 1 if counts.get("error") or dead else 0
