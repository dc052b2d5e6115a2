"""The training run's typed config: the env, warm start, evaluation and the run itself (:class:`TrainConfig`), with
the cross-checks that keep the trainer scoring tokens under the distribution the engine sampled them from. Loaded by
:func:`load_config` (YAML + ``key.sub=value`` overrides); :mod:`agentrl.controller.run` runs it."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from agentrl.inference.config import EngineConfig
from agentrl.manager import EpisodeConfig, ManagerConfig
from agentrl.agent.loop import RolloutConfig
from agentrl.controller.heldout import DEMO_SEED_START, EVAL_SEED_START  # noqa: F401  (re-exported)
from agentrl.controller.dynamic import DynamicSamplingConfig
from agentrl.controller.runlog import TrajectoryLogConfig
from agentrl.controller.tail import TailBatchingConfig
from agentrl.trainer.config import TrainerConfig


@dataclass
class EnvConfig:
    """The training env: a registered ``id`` with constructor ``kwargs``. Training task ``i`` uses the ``i``-th seed
    from ``seed_start`` whose task is not held out for evaluation (one seed per group; seeds ``seed_start + i`` when
    the env's tasks cannot collide: :mod:`agentrl.controller.heldout`). Every training seed stays below
    ``EVAL_SEED_START``. Loading the config makes one env with ``kwargs`` (:func:`agentrl.registration.check_make`):
    a kwarg the env refuses is a config error then, not a failure of every episode."""

    id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    seed_start: int = 0

    def validate(self) -> None:
        from agentrl.registration import check_make

        check_make(self.id, self.kwargs)  # ValueError (the loader names the section)
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
    """Reward on ``episodes`` held-out tasks, before RL, every ``every`` steps (0: never in between) and at the end.
    The tasks are distinct and held out by content: no training or warm-start episode plays one
    (:mod:`agentrl.controller.heldout`; an env with fewer distinct tasks gets fewer, ``tasks`` in the results).
    ``temperature`` None samples as in training."""

    episodes: int = 64
    every: int = 0
    temperature: float | None = None
    success_reward: float | None = None
    """An episode counts as a success when its reward is at least this; None: any reward above 0. Set it for an env
    that pays partial credit for a loss (TextArena's FrozenLake pays the share of the way walked, 1.0 at the goal)."""

    def validate(self) -> None:
        if self.episodes < 0 or self.every < 0:
            raise ValueError("episodes and every must be >= 0")
        if self.success_reward is not None and not math.isfinite(self.success_reward):
            raise ValueError("success_reward must be a finite number or null")


@dataclass
class TrainConfig:
    """A training run. ``manager`` sizes the batch: ``num_groups`` groups of ``group_size`` trajectories per step.
    ``sync_every``: weights go to the engine every k steps (needs ``async_ratio >= k - 1``; admission counts the
    engine's version, so a lagging engine slows rollout down instead of producing stale work).

    Each value has one owner; what follows from it is computed where it is used. The admission rule's α is
    ``async_ratio`` and its batch ``num_groups * group_size`` (:meth:`manager_config`); the trainer scores tokens at
    ``rollout.temperature`` (:meth:`trainer_config`: ``trainer.temperature`` left at its default 1.0 follows it, any
    other value must equal it); ``rollout.top_p`` must be 1 and ``rollout.top_k`` off (the trainer's log-probs are
    of the full distribution), ``rollout.temperature`` > 0, and ``engine.logprobs_mode`` ``processed_logprobs``
    unless the temperature is 1 (remote vLLM servers must be started with ``--logprobs-mode processed_logprobs``
    too: their mode is theirs, not this config's).

    Schedulers (:mod:`agentrl.controller.batches`): ``tail_batching`` (RollPacker's short and long rounds, :mod:`agentrl.controller.tail`;
    needs ``async_ratio: 0``, no ``manager.extra_groups``/``extra_per_group``) and ``streaming`` (the trainer
    accumulates each group as it finishes and steps once the batch is complete: the same update; needs
    ``trainer.num_mini_batches: 1`` and ``trainer.ppo_epochs: 1``). Both compose with each other; ``streaming`` also
    with ``async_ratio >= 1``."""

    env: EnvConfig
    run_dir: str = "runs/train"
    steps: int = 20
    async_ratio: int = 0
    sync_every: int = 1
    checkpoint_every: int = 10
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    manager: EpisodeConfig = field(default_factory=EpisodeConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    trajectory_log: TrajectoryLogConfig = field(default_factory=TrajectoryLogConfig)  # for `agentrl view`
    tail_batching: TailBatchingConfig = field(default_factory=TailBatchingConfig)
    streaming: bool = False
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
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
        ws = self.warm_start
        if ws.episodes and ws.noise > 0 and not ws.noise_actions:
            from agentrl.envs import mistakes_for

            try:
                mistakes_for(self.env.id)
            except LookupError:
                raise ValueError(f"warm_start.noise_actions must list the random actions when noise > 0 ({self.env.id} "
                                 f"has no scripted mistakes)") from None
        self._check_seed_range()
        self._check_sampling()
        self._check_schedulers()

    def _check_seed_range(self) -> None:
        """The training seeds the run needs at least (one task per trained group) must stay below the held-out
        range; the run itself refuses any task past it (:class:`agentrl.controller.heldout.SeedMap`)."""
        need = self.steps * self.manager.num_groups
        if self.env.seed_start + need > EVAL_SEED_START:
            raise ValueError(f"env.seed_start ({self.env.seed_start}) + steps * manager.num_groups ({need}) must be at "
                             f"most {EVAL_SEED_START}: training tasks would use held-out evaluation seeds; lower "
                             f"env.seed_start to {EVAL_SEED_START - need} or less")

    def _check_schedulers(self) -> None:
        """Refuses the scheduler combinations that would change what is trained (see the class docstring)."""
        t, m = self.tail_batching, self.manager
        if t.enabled:
            if self.async_ratio != 0:
                raise ValueError(f"tail_batching.enabled needs async_ratio: 0, got {self.async_ratio}: its rounds are "
                                 f"synchronous and strictly on-policy (with async_ratio >= 1 rollout already runs "
                                 f"ahead of the tail; use one or the other)")
            if m.extra_groups or m.extra_per_group:
                raise ValueError(f"tail_batching.enabled cannot be combined with manager.extra_groups "
                                 f"({m.extra_groups}) or manager.extra_per_group ({m.extra_per_group}): short rounds "
                                 f"over-provision with tail_batching.extra_prompts, and keeping a group's first "
                                 f"finishers would bias the long rounds toward short responses; set them to 0")
        if self.dynamic_sampling.enabled and (t.enabled or self.streaming):
            raise ValueError(f"dynamic_sampling.enabled cannot be combined with tail_batching.enabled ({t.enabled}) or "
                             f"streaming ({self.streaming}): it decides on whole batches, after the rollout; turn "
                             f"one of them off")
        if self.trainer.lora is not None:
            if self.engine.backend != "vllm":
                raise ValueError(f"trainer.lora needs engine.backend: vllm (got {self.engine.backend}): only vLLM "
                                 "in agentrl's hands serves the versioned adapters exactly (weight_sync rpc, nccl "
                                 "or gloo)")
            if self.engine.lora is not None or self.engine.lora_adapter:
                raise ValueError("engine.lora / engine.lora_adapter are set from trainer.lora by agentrl train; "
                                 "leave them unset")
        if self.streaming and (self.trainer.num_mini_batches != 1 or self.trainer.ppo_epochs != 1):
            raise ValueError(f"streaming needs trainer.num_mini_batches: 1 and trainer.ppo_epochs: 1 (got "
                             f"{self.trainer.num_mini_batches} and {self.trainer.ppo_epochs}): several optimizer "
                             f"steps per batch need the whole batch first; set streaming: false")

    def _check_sampling(self) -> None:
        """Ties the trainer's log-probs to the engine's sampling distribution (see the class docstring)."""
        r, t = self.rollout, self.trainer
        if not r.temperature > 0:
            raise ValueError(f"rollout.temperature must be > 0 for training, got {r.temperature} (greedy tokens have "
                             f"no behaviour distribution; use eval.temperature for greedy evaluation)")
        if r.top_p != 1.0 or r.top_k != -1:
            raise ValueError(f"rollout.top_p ({r.top_p}) must be 1.0 and rollout.top_k ({r.top_k}) -1 for training: "
                             f"the trainer scores tokens under the full distribution, so a truncated sampler makes "
                             f"every importance weight wrong")
        if self.engine.logprobs_mode != "processed_logprobs" and r.temperature != 1.0:
            raise ValueError(f"engine.logprobs_mode: {self.engine.logprobs_mode} with rollout.temperature "
                             f"{r.temperature}: the engine would report log-probs of the unscaled logits, not of the "
                             f"distribution it samples from; use engine.logprobs_mode: processed_logprobs (remote "
                             f"servers: start them with --logprobs-mode processed_logprobs)")
        if t.temperature not in (1.0, r.temperature):
            raise ValueError(f"trainer.temperature ({t.temperature}) must equal rollout.temperature "
                             f"({r.temperature}): the trainer must score tokens at the temperature they were "
                             f"sampled at (leave trainer.temperature unset to derive it)")

    def trainer_config(self) -> TrainerConfig:
        """The trainer's config for this run: ``trainer`` scoring at ``rollout.temperature``."""
        return dataclasses.replace(self.trainer, temperature=self.rollout.temperature)

    def manager_config(self) -> ManagerConfig:
        """The manager's config for this run: ``manager`` under the admission rule of ``async_ratio`` (none for
        tail batching, whose rounds are on-policy by construction and over-provision prompts on purpose)."""
        return ManagerConfig.of(self.manager, async_ratio=None if self.tail_batching.enabled else self.async_ratio)


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> TrainConfig:
    """Loads and validates a training config (YAML + ``key.sub=value`` overrides)."""
    from agentrl.config import load

    return load(TrainConfig, path, overrides)
