"""The training controller: one producer (EnvManager + agent loop on the engine) and one consumer (the trainer actor),
running concurrently, synchronous or asynchronous by one number.

Per step ``v`` (the policy version; it equals the number of RL updates so far, in the trainer, the engine and the
manager alike)::

    manager ──groups──> controller ──train_step──> TrainerActor ──state dict──> engine.update_weights(v+1)
       ▲                                                                              │
       └─────────────────────────── manager.set_version(v+1) ◄────────────────────────┘

- ``async_ratio: 0`` is strict on-policy: the manager admits only the ``B`` trajectories of version ``v`` (AReaL's
  rule ``accepted + running < (α + v + 1)·B`` with α = 0), so rollout for step ``v`` uses weights ``v`` only, and
  the version moves (unlocking the next batch) only after the engine holds the new weights.
- ``async_ratio: α ≥ 1``: rollout never stops; the same rule lets it run up to α batches ahead, the manager cancels
  (or drops) running episodes whose oldest token is older than ``v − α``, and the controller drops delivered groups
  that became too stale while queued, so the trainer never sees a token more than α versions old.

Run directory (``run_dir``): ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON line per step,
flushed and fsynced), ``tb/`` (TensorBoard events), ``warmstart/`` (the warm-started starting policy, if any),
``checkpoints/step_NNNNNN/`` (trainer checkpoint, written atomically by the trainer) with
``checkpoints/step_NNNNNN.json`` (controller state, written atomically after it), and ``summary.json``.
``resume`` continues from the newest step whose two parts are both complete: the trainer restores model, optimizer
and RNG, the engine receives those weights at that version, metrics lines of later steps are removed, and training
goes on at the next step, so no step is repeated or skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import ConfigError, from_dict, to_dict
from agentrl.inference.config import EngineConfig
from agentrl.manager import EpisodeSpec, ManagerConfig
from agentrl.rollout import RolloutConfig
from agentrl.trainer.config import TrainerConfig
from agentrl.trajectory import Group

log = logging.getLogger("agentrl.train")

EVAL_SEED_START = 1_000_000  # held-out seeds: never used for training or demonstrations
DEMO_SEED_START = 2_000_000


@dataclass
class EnvConfig:
    """The training env: a registered ``id`` with constructor ``kwargs``. Training task ``i`` uses seed
    ``seed_start + i`` (one seed per group)."""

    id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    seed_start: int = 0

    def validate(self) -> None:
        from agentrl.registration import spec

        try:
            spec(self.id)
        except Exception as e:
            raise ValueError(str(e)) from e
        if self.seed_start < 0 or self.seed_start >= EVAL_SEED_START:
            raise ValueError(f"seed_start must be in [0, {EVAL_SEED_START}) (higher seeds are held out), got {self.seed_start}")


@dataclass
class WarmStartConfig:
    """Supervised warm start on the env's scripted solver, with a fraction ``noise`` of its actions replaced by a
    random one of ``noise_actions`` (empty: the env's own scripted mistakes, ``agentrl.envs.mistakes_for``);
    ``episodes: 0`` disables it. Runs once per run directory."""

    episodes: int = 0
    noise: float = 0.5
    noise_actions: list[str] = field(default_factory=list)
    steps: int = 100
    batch_size: int = 64
    lr: float = 1e-3

    def validate(self) -> None:
        if self.episodes < 0 or self.steps < 0 or self.batch_size < 1:
            raise ValueError("episodes and steps must be >= 0 and batch_size >= 1")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {self.noise}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass
class EvalConfig:
    """Reward on ``episodes`` held-out seeds, before RL, every ``every`` steps (0: never in between) and at the end.
    ``temperature`` None samples as in training."""

    episodes: int = 64
    every: int = 0
    temperature: float | None = None

    def validate(self) -> None:
        if self.episodes < 0 or self.every < 0:
            raise ValueError("episodes and every must be >= 0")


@dataclass
class TrainConfig:
    """A training run. ``manager`` sizes the batch: ``num_groups`` groups of ``group_size`` trajectories per step.
    ``sync_every``: weights go to the engine every k steps (needs ``async_ratio >= k - 1``)."""

    env: EnvConfig
    run_dir: str = "runs/train"
    steps: int = 20
    async_ratio: int = 0
    sync_every: int = 1
    checkpoint_every: int = 10
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    manager: ManagerConfig = field(default_factory=ManagerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ray_address: str | None = None
    ray_num_cpus: int | None = None
    trainer_num_cpus: float = 1.0
    tensorboard: bool = True
    progress: bool = True

    def validate(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.async_ratio < 0:
            raise ValueError(f"async_ratio must be >= 0, got {self.async_ratio}")
        if self.sync_every < 1 or self.sync_every > self.async_ratio + 1:
            raise ValueError(
                f"sync_every must be in [1, async_ratio + 1] = [1, {self.async_ratio + 1}] (tokens of an engine "
                f"that lags more than async_ratio versions would all be stale), got {self.sync_every}"
            )
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.manager.async_ratio is not None:
            raise ValueError("set async_ratio at the top level, not manager.async_ratio")
        ws = self.warm_start
        if ws.episodes and ws.noise > 0 and not ws.noise_actions:
            from agentrl.envs import mistakes_for

            try:
                mistakes_for(self.env.id)
            except LookupError:
                raise ValueError(f"warm_start.noise_actions must list the random actions when noise > 0 ({self.env.id} "
                                 f"has no scripted mistakes)") from None


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> TrainConfig:
    """Loads and validates a training config (YAML + ``key.sub=value`` overrides)."""
    from agentrl.config import load

    return load(TrainConfig, path, overrides)


# ---------------------------------------------------------------------------------------------------- run files
def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunFiles:
    """The run directory's files (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.root = Path(run_dir)
        self.ckpt_root = self.root / "checkpoints"
        self.metrics = self.root / "metrics.jsonl"

    def checkpoint_dir(self, step: int) -> Path:
        return self.ckpt_root / f"step_{step:06d}"

    def latest_checkpoint(self) -> tuple[int, Path, dict[str, Any]] | None:
        """Returns ``(step, trainer checkpoint dir, controller state)`` of the newest complete checkpoint."""
        if not self.ckpt_root.is_dir():
            return None
        for state_file in sorted(self.ckpt_root.glob("step_*.json"), reverse=True):
            d = state_file.with_suffix("")
            try:
                state = json.loads(state_file.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if (d / "trainer_state.json").exists() or any(d.parent.glob(f".{d.name}.old-*")):
                return int(state["step"]), d, state
        return None

    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.metrics, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_metrics(self, last_step: int) -> None:
        """Keeps the metrics lines of steps <= ``last_step`` (and drops a torn last line)."""
        if not self.metrics.exists():
            return
        keep = []
        for line in self.metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("step", 0) <= last_step:
                keep.append(line)
        _atomic_write(self.metrics, "".join(k + "\n" for k in keep))


# ------------------------------------------------------------------------------------------------- evaluation
def tool_metrics(trajs: list[Any]) -> dict[str, float]:
    """Per-episode means over ``trajs``: ``parse_errors_per_episode`` (malformed tool calls, the agent loop's
    ``chat/tool_parse_errors``) and, when the env counts them in its info, ``invalid_actions_per_episode``."""
    if not trajs:
        return {}
    out = {"parse_errors_per_episode": sum(t.info.get("chat/tool_parse_errors", 0) for t in trajs) / len(trajs)}
    if any("invalid_actions" in t.info for t in trajs):
        out["invalid_actions_per_episode"] = sum(t.info.get("invalid_actions", 0) for t in trajs) / len(trajs)
    return out


async def evaluate(engine: Any, tokenizer: Any, cfg: TrainConfig, episodes: int) -> dict[str, float]:
    """Returns the mean reward, the share of episodes with reward > 0 and :func:`tool_metrics` of the engine's current
    policy on the first ``episodes`` held-out seeds (``EVAL_SEED_START + i``)."""
    from agentrl.manager import EnvManager
    from agentrl.rollout import AgentLoopPolicy

    if episodes == 0:
        return {}
    rcfg = cfg.rollout if cfg.eval.temperature is None else dataclasses.replace(cfg.rollout, temperature=cfg.eval.temperature)
    policy = AgentLoopPolicy(engine, tokenizer, rcfg)
    mcfg = dataclasses.replace(cfg.manager, workers=0, async_ratio=None, num_groups=1, group_size=1,
                               extra_groups=0, extra_per_group=0)
    specs = [EpisodeSpec(cfg.env.id, env_kwargs=dict(cfg.env.kwargs), seed=EVAL_SEED_START + i) for i in range(episodes)]
    async with EnvManager(mcfg, policy) as mgr:
        trajs = await mgr.run_episodes(specs)
    rewards = [t.reward for t in trajs]
    return {"reward": sum(rewards) / len(rewards), "success": sum(r > 0 for r in rewards) / len(rewards),
            "episodes": float(len(rewards)), **tool_metrics(trajs)}


# ------------------------------------------------------------------------------------------------- warm start
async def warm_start(cfg: TrainConfig, model_dir: Path, out_dir: Path, tokenizer: Any) -> Path:
    """Trains ``model_dir`` on noisy scripted demonstrations and saves the result under ``out_dir`` (atomically);
    returns the directory of the warm-started model."""
    from agentrl.envs import mistakes_for, solver_for
    from agentrl.manager import EnvManager
    from agentrl.trainer.trainer import Trainer
    from agentrl.warmstart import DemoPolicy, noisy

    ws = cfg.warm_start
    fn = noisy(solver_for(cfg.env.id), ws.noise_actions or mistakes_for(cfg.env.id), ws.noise, seed=cfg.seed)
    policy = DemoPolicy(fn, tokenizer, cfg.rollout)
    mcfg = dataclasses.replace(cfg.manager, workers=0, async_ratio=None, num_groups=1, group_size=1,
                               extra_groups=0, extra_per_group=0)
    specs = [EpisodeSpec(cfg.env.id, env_kwargs=dict(cfg.env.kwargs), seed=DEMO_SEED_START + i) for i in range(ws.episodes)]
    async with EnvManager(mcfg, policy) as mgr:
        demos = [t for t in await mgr.run_episodes(specs) if t.termination != "error"]
    if not demos:
        raise RuntimeError("warm start: every demonstration episode failed")
    demo_reward = sum(t.reward for t in demos) / len(demos)
    tcfg = dataclasses.replace(cfg.trainer, optimizer=dataclasses.replace(cfg.trainer.optimizer, lr=ws.lr, warmup_steps=0),
                               loss=dataclasses.replace(cfg.trainer.loss, kl_coef=0.0))
    trainer = Trainer(tcfg, model_dir)
    import random

    rng = random.Random(cfg.seed)
    nll = float("nan")
    for step in range(ws.steps):
        batch = rng.sample(demos, min(ws.batch_size, len(demos)))
        nll = trainer.sft_step(batch).get("sft/nll", nll)
        if step % 20 == 0 or step == ws.steps - 1:
            log.info("warm start step %d/%d nll %.3f", step + 1, ws.steps, nll)
    trainer.save_checkpoint(out_dir)
    (out_dir / "warmstart.json").write_text(json.dumps(
        {"demonstrations": len(demos), "demo_reward": demo_reward, "noise": ws.noise, "steps": ws.steps, "final_nll": nll}))
    return out_dir / "model"


# --------------------------------------------------------------------------------------------------- training
class _IdleMeter:
    """Samples, every ``period`` seconds, whether the producer has no episode running (rollout idle)."""

    def __init__(self, manager: Any, period: float = 0.05):
        self.manager, self.period = manager, period
        self.idle = self.total = 0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.total += 1
            self.idle += self.manager.running == 0
            await asyncio.sleep(self.period)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def take(self) -> float:
        frac = self.idle / self.total if self.total else 0.0
        self.idle = self.total = 0
        return frac

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and v is not None:
            out[prefix + k] = float(v)
    return out


async def train(cfg: TrainConfig, *, resume: bool = False) -> dict[str, Any]:
    """Runs (or resumes) the training described by ``cfg``; returns the summary written to ``summary.json``."""
    import ray
    from transformers import AutoTokenizer

    from agentrl.inference.config import make_engine
    from agentrl.manager import EnvManager
    from agentrl.rollout import AgentLoopPolicy
    from agentrl.trainer.actor import create_trainer_actor

    t_start = time.perf_counter()
    files = RunFiles(cfg.run_dir)
    files.root.mkdir(parents=True, exist_ok=True)
    latest = files.latest_checkpoint() if resume else None
    if resume and latest is None:
        log.warning("no complete checkpoint in %s: starting from step 0", files.root)
    if not resume and files.metrics.exists():
        raise ConfigError(f"{files.root}: run directory already has metrics.jsonl; use --resume or another run_dir")
    _atomic_write(files.root / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))

    model_dir = Path(EngineConfig(model=cfg.engine.model).resolved_model())
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    start_model = model_dir
    if cfg.warm_start.episodes:
        ws_dir = files.root / "warmstart"
        if (ws_dir / "model").is_dir():
            start_model = ws_dir / "model"
        else:
            log.info("warm start: %d scripted episodes (noise %.2f), %d SFT steps",
                     cfg.warm_start.episodes, cfg.warm_start.noise, cfg.warm_start.steps)
            start_model = await warm_start(cfg, model_dir, ws_dir, tokenizer)

    if not ray.is_initialized():
        ray.init(address=cfg.ray_address, num_cpus=cfg.ray_num_cpus if cfg.ray_address is None else None,
                 include_dashboard=False, log_to_driver=False)
    trainer = create_trainer_actor(cfg.trainer, start_model, num_cpus=cfg.trainer_num_cpus,
                                   num_gpus=1 if cfg.trainer.device == "cuda" else 0)
    step0, next_task, history = 0, 0, {}
    if latest is not None:
        step0, ckpt_dir, state = latest
        await trainer.load_checkpoint.remote(str(ckpt_dir))
        next_task, history = int(state["next_task"]), state.get("history", {})
        files.truncate_metrics(step0)
        log.info("resumed from %s (step %d)", ckpt_dir, step0)

    engine = make_engine(dataclasses.replace(cfg.engine, model=str(start_model)))
    writer = None
    try:
        if step0 > 0:
            await engine.update_weights(await trainer.state_dict_for_inference.remote(), step0)
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(files.root / "tb"), purge_step=step0 + 1 if step0 else None)
        if "eval_before" not in history and cfg.eval.episodes:
            history["eval_before"] = await evaluate(engine, tokenizer, cfg, cfg.eval.episodes)
            log.info("held-out reward before RL: %.3f", history["eval_before"]["reward"])

        mcfg = dataclasses.replace(cfg.manager, async_ratio=cfg.async_ratio)
        policy = AgentLoopPolicy(engine, tokenizer, cfg.rollout)
        task_counter = [next_task]

        def next_spec() -> EpisodeSpec:
            i = task_counter[0]
            task_counter[0] += 1
            return EpisodeSpec(cfg.env.id, env_kwargs=dict(cfg.env.kwargs), seed=cfg.env.seed_start + i,
                               group_id=f"task{i}")

        summary = await _loop(cfg, files, trainer, engine, policy, mcfg, next_spec, task_counter, step0, history,
                              writer, tokenizer)
        summary["wall_s"] = time.perf_counter() - t_start
        _atomic_write(files.root / "summary.json", json.dumps(summary, indent=2))
        return summary
    finally:
        if writer is not None:
            writer.close()
        await engine.close()
        ray.kill(trainer)


async def _loop(cfg: TrainConfig, files: RunFiles, trainer: Any, engine: Any, policy: Any, mcfg: ManagerConfig,
                next_spec: Any, task_counter: list[int], step0: int, history: dict[str, Any], writer: Any,
                tokenizer: Any) -> dict[str, Any]:
    from agentrl.manager import EnvManager

    num_groups = cfg.manager.num_groups
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=step0, desc="train", unit="step", dynamic_ncols=True)
    async with EnvManager(mcfg, policy) as mgr:
        mgr.set_version(step0)
        mgr.start(next_spec)
        idle = _IdleMeter(mgr)
        idle.start()
        dropped_queued = 0
        try:
            for step in range(step0, cfg.steps):
                t0 = time.perf_counter()
                groups: list[Group] = []
                while len(groups) < num_groups:
                    g = await mgr.next_group()
                    if g is None:
                        raise RuntimeError("the manager stopped producing groups")
                    oldest = min((t.version_range() or (step, step))[0] for t in g.trajectories)
                    if step - oldest > cfg.async_ratio:  # queued too long: would break the staleness bound
                        dropped_queued += 1
                        mgr.discard(len(g.trajectories))
                        continue
                    groups.append(g)
                t_got = time.perf_counter()
                metrics = await trainer.train_step.remote(groups)
                t_trained = time.perf_counter()
                version = step + 1
                if version % cfg.sync_every == 0 or version == cfg.steps:
                    await engine.update_weights(await trainer.state_dict_for_inference.remote(), version)
                mgr.set_version(version)
                t_end = time.perf_counter()
                step_s = t_end - t0
                trajs = [t for g in groups for t in g.trajectories]
                row: dict[str, Any] = {"step": version}
                row.update(_flatten(metrics, "train/"))
                man = mgr.metrics()
                row.update(_flatten({k: man[k] for k in ("running", "finished", "cancelled", "failed", "dropped_stale",
                                                          "rescheduled", "env_steps", "step_p50_s", "step_p99_s")
                                     if man.get(k) is not None}, "manager/"))
                gen_tokens = sum(t.num_generated for t in trajs)
                row.update({
                    "reward": sum(t.reward for t in trajs) / len(trajs),
                    "turns": sum(t.num_turns for t in trajs) / len(trajs),
                    "truncated_frac": sum(t.termination == "truncated" for t in trajs) / len(trajs),
                    "time/step_s": step_s,
                    "time/wait_rollout_s": t_got - t0,
                    "time/train_s": t_trained - t_got,
                    "time/weight_sync_s": t_end - t_trained,
                    "time/trainer_idle_frac": (t_got - t0 + t_end - t_trained) / step_s,
                    "time/rollout_idle_frac": idle.take(),
                    "throughput/gen_tokens_per_s": gen_tokens / step_s,
                    "dropped_queued_groups": float(dropped_queued),
                    "wall_s": time.time(),
                })
                row.update(_flatten(tool_metrics(trajs), "tool/"))
                if cfg.eval.every and version % cfg.eval.every == 0 and version < cfg.steps:
                    row.update(_flatten(await evaluate(engine, tokenizer, cfg, cfg.eval.episodes), "eval/"))
                files.append_metrics(row)
                if writer is not None:
                    for k, v in row.items():
                        if k not in ("step", "wall_s"):
                            writer.add_scalar(k, v, version)
                    writer.flush()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward']:.3f}", tok_s=f"{row['throughput/gen_tokens_per_s']:.0f}")
                if version % cfg.checkpoint_every == 0 or version == cfg.steps:
                    d = files.checkpoint_dir(version)
                    await trainer.save_checkpoint.remote(str(d))
                    _atomic_write(d.with_suffix(".json"), json.dumps(
                        {"step": version, "next_task": task_counter[0], "history": history}))
        finally:
            await idle.stop()
            if bar is not None:
                bar.close()
            await mgr.stop()
    summary = {"steps": cfg.steps, "async_ratio": cfg.async_ratio, **history}
    if cfg.eval.episodes:
        summary["eval_after"] = await evaluate(engine, tokenizer, cfg, cfg.eval.episodes)
        log.info("held-out reward after RL: %.3f", summary["eval_after"]["reward"])
    return summary
