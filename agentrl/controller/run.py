"""The training controller: one producer (EnvManager + agent loop on the engine) and one consumer (the trainer actor),
running concurrently, synchronous or asynchronous by one number.

Per step ``v`` (the policy version; it equals the number of RL updates so far, in the trainer, the engine and the
manager alike)::

    manager ──groups──> controller ──train_step──> TrainerActor ──weights──> engine (v+1)   (controller/weights.py)
       ▲                                                                              │
       └─────────────────────────── manager.set_version(v+1) ◄────────────────────────┘

- ``async_ratio: 0`` is strict on-policy: the manager admits only the ``B`` trajectories of version ``v`` (AReaL's
  rule ``accepted + running < (α + v + 1)·B`` with α = 0), so rollout for step ``v`` uses weights ``v`` only, and
  the version moves (unlocking the next batch) only after the engine holds the new weights.
- ``async_ratio: α ≥ 1``: rollout never stops; the same rule, counted against the engine's version, lets it run up
  to α batches ahead, and batches are scheduled earliest deadline first (a group admitted at version ``a`` is trained
  by step ``a + α``, waited for if it must), so the trainer never sees a token more than α versions old and no
  episode is cancelled for being slow: trained trajectories are an unbiased sample of generated ones
  (:mod:`agentrl.manager.admission`).

Schedulers (:mod:`agentrl.controller.batches`): ``tail_batching`` replaces the continuous run by RollPacker's short and long
rounds (:mod:`agentrl.controller.tail`, ``async_ratio: 0``); ``streaming`` feeds each group to the trainer as it finishes
(``start_step``/``accumulate``/``finish_step``: the same update as one ``train_step``). Metrics ``tail/*`` (rounds,
deferred prompts waiting, length budget), ``train/stream/*``, ``time/trainer_idle_frac`` (1 − trainer busy / step)
and ``time/rollout_idle_frac`` (share of the step with no episode running).

The config (:mod:`agentrl.controller.config`, re-exported here) makes the trainer score tokens at the rollout's
temperature. Every step's metrics line lists the tasks it trained (``tasks``) and those given up for good
(``dropped_tasks``); checkpoints record the tasks opened but not yet trained, and a resumed run replays those first,
so across a crash every task is trained at most once, and a dropped task is never replayed, interrupted or not
(:mod:`agentrl.controller.ledger`). Evaluation plays distinct tasks that no training or warm-start episode plays
(held out by content, :mod:`agentrl.controller.heldout`); ``summary.json`` states their number (``eval_tasks``).

Run directory (``run_dir``): ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON line per step,
flushed and fsynced), ``tb/`` (TensorBoard events), ``warmstart/`` (the warm-started starting policy, if any),
``checkpoints/step_NNNNNN/`` (trainer checkpoint, written atomically by the trainer) with
``checkpoints/step_NNNNNN.json`` (controller state, written atomically after it), and ``summary.json``.
``resume`` continues from the newest step whose two parts are both complete: the trainer restores model, optimizer
and RNG, the engine receives those weights at that version, metrics lines of later steps are removed, the manager's
admission count is restored to the trajectories trained so far, the tasks that were in flight are replayed, and
training goes on at the next step, so no step or task is repeated or skipped.
Trained trajectories and the trainer's log-prob records go to ``trajectories.jsonl`` and ``trainer_logprobs.jsonl``
(:mod:`agentrl.controller.runlog`, shown by ``agentrl view``); resuming drops their lines of later steps too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import yaml

from agentrl import gcheap, raystart
from agentrl.config import ConfigError, to_dict
from agentrl.inference.base import unless_dead
from agentrl.inference.config import EngineConfig
from agentrl.manager import EpisodeSpec
from agentrl.controller.runlog import TrajectoryLog
from agentrl.controller.weights import WeightSync
from agentrl.controller.batches import ContinuousBatches, StreamedStep
from agentrl.controller.dynamic import DynamicBatches
from agentrl.controller.tail import BudgetPolicy, TailPlanner, TailRounds
from agentrl.controller.config import (DEMO_SEED_START, EVAL_SEED_START, EnvConfig, EvalConfig, TrainConfig,  # noqa: F401
                                  WarmStartConfig, load_config)
from agentrl.controller.heldout import HeldOut
from agentrl.controller.ledger import TaskLedger  # noqa: F401  (re-exported)

log = logging.getLogger("agentrl.train")

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


async def evaluate(engine: Any, tokenizer: Any, cfg: TrainConfig, held: HeldOut) -> dict[str, float]:
    """Returns the mean reward, the share of successes (reward >= ``cfg.eval.success_reward``, or > 0 when that is
    None) and :func:`tool_metrics` of the engine's current policy on the held-out evaluation tasks
    (``held.eval_seeds``, one episode per distinct task, none of them played in training or warm start:
    :mod:`agentrl.controller.heldout`), with ``episodes`` and ``tasks`` (distinct tasks: the same number, by
    construction)."""
    from agentrl.manager import EnvManager, ManagerConfig
    from agentrl.agent.loop import AgentLoopPolicy

    if not held.eval_seeds:
        return {}
    rcfg = cfg.rollout if cfg.eval.temperature is None else dataclasses.replace(cfg.rollout, temperature=cfg.eval.temperature)
    policy = AgentLoopPolicy(engine, tokenizer, rcfg)
    mcfg = ManagerConfig.of(dataclasses.replace(cfg.manager, workers=0, num_groups=1, group_size=1, extra_groups=0,
                                                extra_per_group=0))
    specs = [EpisodeSpec(cfg.env.id, env_kwargs=dict(cfg.env.kwargs), seed=s) for s in held.eval_seeds]
    async with EnvManager(mcfg, policy) as mgr:
        trajs = await mgr.run_episodes(specs)
    rewards = [t.reward for t in trajs]
    bar = cfg.eval.success_reward
    wins = sum(r > 0 if bar is None else r >= bar for r in rewards)
    return {"reward": sum(rewards) / len(rewards), "success": wins / len(rewards),
            "episodes": float(len(rewards)), "tasks": float(len(held.eval_seeds)), **tool_metrics(trajs)}


# ------------------------------------------------------------------------------------------------- warm start
async def warm_start(cfg: TrainConfig, model_dir: Path, out_dir: Path, tokenizer: Any, held: HeldOut) -> Path:
    """Trains ``model_dir`` on noisy scripted demonstrations (seeds ``held.demos``: no evaluation task) and saves
    the result under ``out_dir`` (atomically); returns the directory of the warm-started model."""
    from agentrl.envs import mistakes_for
    from agentrl.manager import EnvManager, ManagerConfig
    from agentrl.trainer.trainer import Trainer
    from agentrl.controller.warmstart import DemoPolicy, noisy_actor, scripted_actor

    ws = cfg.warm_start
    fn = noisy_actor(scripted_actor(cfg.env.id, dict(cfg.env.kwargs)), ws.noise_actions or mistakes_for(cfg.env.id),
                     ws.noise, seed=cfg.seed)
    policy = DemoPolicy(fn, tokenizer, cfg.rollout)
    mcfg = ManagerConfig.of(dataclasses.replace(cfg.manager, workers=0, num_groups=1, group_size=1, extra_groups=0,
                                                extra_per_group=0))
    specs = [EpisodeSpec(cfg.env.id, env_kwargs=dict(cfg.env.kwargs), seed=held.demos(i)) for i in range(ws.episodes)]
    async with EnvManager(mcfg, policy) as mgr:
        demos = [t for t in await mgr.run_episodes(specs) if t.termination != "error"]
    if not demos:
        raise RuntimeError("warm start: every demonstration episode failed")
    demo_reward = sum(t.reward for t in demos) / len(demos)
    # The warm start trains the whole model (lora=None) even in a LoRA run: it makes the base the adapters start on.
    tcfg = dataclasses.replace(cfg.trainer_config(), optimizer=dataclasses.replace(cfg.trainer.optimizer, lr=ws.lr, warmup_steps=0),
                               loss=dataclasses.replace(cfg.trainer.loss, kl_coef=0.0), lora=None)
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
def check_resources(cfg: TrainConfig) -> None:
    """Raises :class:`agentrl.inference.placement.ResourceError` unless the Ray cluster can host the trainer and
    the engine replicas at once (README, "Running on a Ray cluster")."""
    from agentrl.inference.placement import check_fits, cluster_has_gpus, engine_ask, trainer_ask

    gpus = cluster_has_gpus()
    check_fits([trainer_ask(cfg.trainer.world_size, cfg.trainer_num_cpus, trainer_gpu(cfg, gpus)),
                engine_ask(cfg.engine, gpus)])


def trainer_gpu(cfg: TrainConfig, cluster_gpus: bool) -> bool:
    """Whether each trainer rank takes a GPU: ``trainer.device: cuda``, or ``auto`` on a cluster with GPUs."""
    return cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and cluster_gpus)


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


def run_tokenizer(engine: EngineConfig) -> Any:
    """Returns the tokenizer ``train`` renders episodes with: the engine's (``engine.tokenizer``, else the model
    directory), through :func:`agentrl.chat.load_tokenizer` so that its ids are the ones ``tokenizer.json`` defines
    whatever class ``tokenizer_config.json`` declares."""
    from agentrl.chat import load_tokenizer

    return load_tokenizer(engine.tokenizer or engine.resolved_model())


async def train(cfg: TrainConfig, *, resume: bool = False, policy: Any = None) -> dict[str, Any]:
    """Runs (or resumes) the training described by ``cfg``; returns the summary written to ``summary.json``.
    ``policy``: a factory ``(engine, tokenizer, cfg.rollout) -> Policy`` replacing the agent loop (e.g.
    :func:`agentrl.gateway.harness_policy`); its ``metrics()`` join each step's row, its ``aclose()`` runs at the end."""
    import ray

    from agentrl.inference.factory import make_engine
    from agentrl.agent.loop import AgentLoopPolicy
    from agentrl.trainer.dp_group import create_trainer, stop_trainer

    cfg.validate()  # a config built in Python skipped the loader's checks
    t_start = time.perf_counter()
    files = RunFiles(cfg.run_dir)
    files.root.mkdir(parents=True, exist_ok=True)
    latest = files.latest_checkpoint() if resume else None
    if resume and latest is None:
        log.warning("no complete checkpoint in %s: starting from step 0", files.root)
    if not resume and files.metrics.exists():
        raise ConfigError(f"{files.root}: run directory already has metrics.jsonl; use --resume or another run_dir")
    _atomic_write(files.root / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))

    if not ray.is_initialized():
        raystart.init(cfg.ray_address, cfg.ray_num_cpus)
    check_resources(cfg)  # before any model loads

    held = HeldOut(cfg.env, cfg.eval.episodes)
    held.train(0)  # fails now, not mid-run, when no training seed is left (every task held out, or out of range)
    if len(held.eval_seeds) < cfg.eval.episodes:
        log.warning("evaluation: only %d distinct tasks found for eval.episodes=%d", len(held.eval_seeds),
                    cfg.eval.episodes)
    model_dir = Path(EngineConfig(model=cfg.engine.model).resolved_model())
    tokenizer = run_tokenizer(cfg.engine)
    start_model = model_dir
    t_warm = time.perf_counter()
    if cfg.warm_start.episodes:
        ws_dir = files.root / "warmstart"
        if (ws_dir / "model").is_dir():
            start_model = ws_dir / "model"
        else:
            log.info("warm start: %d scripted episodes (noise %.2f), %d SFT steps",
                     cfg.warm_start.episodes, cfg.warm_start.noise, cfg.warm_start.steps)
            start_model = await warm_start(cfg, model_dir, ws_dir, tokenizer, held)
    t_rl = time.perf_counter()

    from agentrl.inference.placement import cluster_has_gpus

    trainer = create_trainer(cfg.trainer_config(), start_model, num_cpus=cfg.trainer_num_cpus,
                             num_gpus=1 if trainer_gpu(cfg, cluster_has_gpus()) else 0)
    # The trainer imports vLLM's weight-transfer half while the engines start, not after them.
    prepared = trainer.prepare_weight_broadcast.remote() if cfg.engine.broadcasts_weights() else None
    step0, history = 0, {}
    tasks = TaskLedger(cfg.env, seeds=held.train)
    if latest is not None:
        step0, ckpt_dir, state = latest
        await trainer.load_checkpoint.remote(str(ckpt_dir))
        tasks = TaskLedger(cfg.env, int(state["next_task"]), state.get("open_tasks", []), seeds=held.train,
                           dropped_before=state.get("dropped_tasks", []))
        history = state.get("history", {})
        files.truncate_metrics(step0)
        log.info("resumed from %s (step %d; replaying %d tasks that were in flight)", ckpt_dir, step0,
                 len(state.get("open_tasks", [])))

    lora = None
    if cfg.trainer.lora is not None:  # the engines serve the trainer's adapters on the same frozen base
        from agentrl.trainer.lora import adapter_config

        lora = adapter_config(cfg.trainer.lora, start_model)
    engine = make_engine(dataclasses.replace(cfg.engine, model=str(start_model), lora=lora))
    weights = WeightSync(trainer, engine, prepared)
    writer = None
    make_policy, policy = policy or AgentLoopPolicy, None
    try:
        await weights.start()
        if step0 > 0:
            await weights.push(step0)
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(files.root / "tb"), purge_step=step0 + 1 if step0 else None)
        if "eval_before" not in history and cfg.eval.episodes:
            history["eval_before"] = await unless_dead(engine, evaluate(engine, tokenizer, cfg, held))
            log.info("held-out reward before RL: %.3f (%d distinct tasks, none trained on)",
                     history["eval_before"]["reward"], len(held.eval_seeds))

        policy = make_policy(engine, tokenizer, cfg.rollout)
        with gcheap.settled():
            summary = await unless_dead(engine, _loop(cfg, files, trainer, engine, weights, policy, tasks, step0,
                                                      history, writer, tokenizer, held))
        # This process's times (a resumed run counts from its restart): set-up + warm start + RL phase = wall_s.
        summary["wall_s"] = time.perf_counter() - t_start
        summary["warm_start_s"] = t_rl - t_warm
        summary["rl_wall_s"] = time.perf_counter() - t_rl  # engine start, evaluations and RL steps
        _atomic_write(files.root / "summary.json", json.dumps(summary, indent=2))
        return summary
    finally:
        if writer is not None:
            writer.close()
        if policy is not None and hasattr(policy, "aclose"):  # the factory's policy (e.g. the gateway's server)
            await policy.aclose()
        await engine.close()
        stop_trainer(trainer)
        held.close()


def _batch_source(cfg: TrainConfig, mgr: Any, policy: Any, tasks: TaskLedger) -> Any:
    """The step's batch source (:mod:`agentrl.controller.batches`): tail batching's rounds, or the manager's continuous run."""
    if cfg.tail_batching.enabled:
        t = cfg.tail_batching
        planner = TailPlanner(cfg.manager.num_groups, t.extra_prompts, t.length_budget)
        return TailRounds(mgr, policy, planner, tasks.spec_for, tasks.open_task, tasks.dropped)
    src = ContinuousBatches(mgr, tasks.next_spec)
    src.start()
    if cfg.dynamic_sampling.enabled:
        return DynamicBatches(src, mgr, cfg.trainer.advantage, cfg.dynamic_sampling)
    return src


async def _loop(cfg: TrainConfig, files: RunFiles, trainer: Any, engine: Any, weights: WeightSync, policy: Any,
                tasks: TaskLedger, step0: int, history: dict[str, Any], writer: Any, tokenizer: Any,
                held: HeldOut | None = None) -> dict[str, Any]:
    """Steps ``step0 .. cfg.steps - 1``: takes each step's batch from the manager (due groups first, so no token is
    more than ``async_ratio`` versions old), trains, syncs weights, moves the manager's version, logs, checkpoints."""
    from agentrl.manager import EnvManager, ManagerConfig

    num_groups = cfg.manager.num_groups
    mcfg = cfg.manager_config()
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=step0, desc="train", unit="step", dynamic_ncols=True)
    tlog = TrajectoryLog(files.root, cfg.trajectory_log).open(step0)
    if cfg.tail_batching.enabled:  # the manager's episodes then run under the rounds' length budget
        policy = BudgetPolicy(policy)
    async with EnvManager(mcfg, policy) as mgr:
        mgr.restore(version=step0, accepted=step0 * mgr.batch_size)  # what the trainer consumed before a resume
        source = _batch_source(cfg, mgr, policy, tasks)
        stream = StreamedStep(trainer) if cfg.streaming else None
        idle = _IdleMeter(mgr)
        idle.start()
        try:
            for step in range(step0, cfg.steps):
                t0 = time.perf_counter()
                if stream is not None:
                    await stream.start()
                try:
                    groups = await source.next_batch(num_groups, cfg.steps - step,
                                                      stream.feed if stream is not None else None)
                    if not groups or (len(groups) < num_groups and not cfg.dynamic_sampling.enabled):
                        raise RuntimeError(f"the manager stopped producing groups (got {len(groups or [])} of "
                                           f"{num_groups})" + (f": {tasks.error}" if tasks.error else ""))
                except BaseException:
                    if stream is not None:
                        await stream.abort()
                    raise
                trained_tasks = tasks.trained(groups)
                if isinstance(source, DynamicBatches):  # played, left out of the update: closed, never replayed
                    tasks.dropped(g.id for g in source.left_out)
                t_got = time.perf_counter()
                if stream is not None:
                    metrics, trainer_busy = await stream.finish()  # busy also while the batch was incomplete
                else:
                    metrics = await trainer.train_step.remote(groups)
                    trainer_busy = time.perf_counter() - t_got
                t_trained = time.perf_counter()
                version = step + 1
                synced: dict[str, Any] = {}
                if version % cfg.sync_every == 0 or version == cfg.steps:
                    synced = await weights.push(version)
                mgr.set_version(version)
                t_end = time.perf_counter()
                step_s = t_end - t0
                trajs = [t for g in groups for t in g.trajectories]
                row: dict[str, Any] = {"step": version}
                row.update(_flatten(metrics, "train/"))
                man = mgr.metrics()
                row.update(_flatten({k: man[k] for k in ("running", "started", "finished", "cancelled", "failed",
                                                          "dropped_stale", "rescheduled", "failed_groups", "env_steps",
                                                          "step_p50_s", "step_p99_s")
                                     if man.get(k) is not None}, "manager/"))
                row.update(_flatten({k: v for k, v in man.items() if k.startswith("failures/")}, "manager/"))
                if callable(getattr(policy, "metrics", None)):  # the agent loop's template-drift counters (run totals)
                    row.update(_flatten(policy.metrics()))
                gen_tokens = sum(t.num_generated for t in trajs)
                row.update({
                    "reward": sum(t.reward for t in trajs) / len(trajs),
                    "turns": sum(t.num_turns for t in trajs) / len(trajs),
                    "truncated_frac": sum(t.termination == "truncated" for t in trajs) / len(trajs),
                    "time/step_s": step_s,
                    "time/wait_rollout_s": t_got - t0,
                    "time/train_s": t_trained - t_got,
                    "time/weight_sync_s": t_end - t_trained,
                    "time/trainer_idle_frac": max(0.0, 1.0 - trainer_busy / step_s),
                    "time/rollout_idle_frac": idle.take(),
                    **source.last,
                    "throughput/gen_tokens_per_s": gen_tokens / step_s,
                    "wall_s": time.time(),
                    "tasks": trained_tasks,  # the ledger: every task is trained at exactly one step
                })
                row.update(synced)
                tasks.dropped(mgr.take_dropped())
                row["dropped_tasks"] = tasks.take_dropped()  # given up for good (never replayed)
                row.update(_flatten(tool_metrics(trajs), "tool/"))
                if cfg.eval.every and held is not None and version % cfg.eval.every == 0 and version < cfg.steps:
                    row.update(_flatten(await evaluate(engine, tokenizer, cfg, held), "eval/"))
                await tlog.write_step(version, trajs, trainer if cfg.trainer.record_logprobs else None)
                files.append_metrics(row)
                if writer is not None:
                    for k, v in row.items():
                        if k not in ("step", "wall_s") and isinstance(v, float):
                            writer.add_scalar(k, v, version)
                    writer.flush()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward']:.3f}", tok_s=f"{row['throughput/gen_tokens_per_s']:.0f}")
                if version % cfg.checkpoint_every == 0 or version == cfg.steps:
                    d = files.checkpoint_dir(version)
                    await trainer.save_checkpoint.remote(str(d))
                    tasks.dropped(mgr.take_dropped())  # (no await until the state is written)
                    _atomic_write(d.with_suffix(".json"), json.dumps(
                        {"step": version, **tasks.state(), "history": history}))
        finally:
            await idle.stop()
            tlog.close()
            if bar is not None:
                bar.close()
            await mgr.stop()
    summary = {"steps": cfg.steps, "async_ratio": cfg.async_ratio, **history}
    if cfg.tail_batching.enabled:
        summary["tail"] = source.planner.metrics()
    if cfg.eval.episodes and held is not None:
        summary["eval_after"] = await evaluate(engine, tokenizer, cfg, held)
        log.info("held-out reward after RL: %.3f (%d distinct tasks, none trained on)", summary["eval_after"]["reward"],
                 len(held.eval_seeds))
        summary["eval_tasks"] = len(held.eval_seeds)
        summary["held_out_by"] = "content" if held.keyed else "seed"
    return summary
