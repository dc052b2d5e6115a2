"""The training controller's loop (agentrl.controller.run._loop) with the real EnvManager and envs, and a fake trainer and
engine (the trainer sleeps, the engine only moves its version): no length bias under α = 2 with a long-tailed env,
admission after a resume, the task ledger. The real trainer and engine run in test_train.py and test_consistency.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from scipy.stats import ks_2samp

import agentrl
from agentrl.manager import ManagerConfig
from agentrl.testing.manager_envs import EVENTS, EchoPolicy
from agentrl.controller.weights import WeightSync
from agentrl.controller.run import EnvConfig, EvalConfig, RunFiles, TaskLedger, TrainConfig, _loop

pytestmark = pytest.mark.timeout(120)

ENV_ID = "test/LongTail-v0"
if ENV_ID not in agentrl.registered_ids():
    agentrl.register(ENV_ID, entry_point="agentrl.testing.manager_envs:SleepEnv")


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeTrainer:
    """Takes ``train_s`` per step; records the batches and the staleness of every trained token."""

    def __init__(self, train_s: float):
        self.train_s, self.version, self.batches, self.max_staleness = train_s, 0, [], 0
        self.train_step = _Remote(self._train_step)
        self.state_dict_for_inference = _Remote(self._state_dict)
        self.save_checkpoint = _Remote(self._save)

    async def _train_step(self, groups):
        await asyncio.sleep(self.train_s)
        for g in groups:
            for t in g.trajectories:
                old = min(v for v, m in zip(t.versions, t.loss_mask) if m)
                self.max_staleness = max(self.max_staleness, self.version - old)
        self.batches.append(groups)
        self.version += 1
        return {"version": float(self.version)}

    async def _state_dict(self):
        return {}

    async def _save(self, path):
        from pathlib import Path

        Path(path).mkdir(parents=True)  # what the real trainer's save leaves (the controller state goes beside it)
        return path


class FakeEngine:
    """Weight syncs move the policy's version (the EchoPolicy stamps it on every token)."""

    def __init__(self, policy: EchoPolicy):
        self.policy = policy

    async def update_weights(self, state_dict, version):
        self.policy.current_version = version


def _cfg(tmp_path, **kw) -> TrainConfig:
    m = kw.pop("manager")
    cfg = TrainConfig(env=EnvConfig(id=ENV_ID, kwargs=kw.pop("env_kwargs")), run_dir=str(tmp_path), manager=m,
                      eval=EvalConfig(episodes=0), progress=False, tensorboard=False, **kw)
    cfg.validate()
    return cfg


async def _run(cfg, trainer, step0=0, tasks=None, version0=0):
    policy = EchoPolicy()
    policy.current_version = version0
    files = RunFiles(cfg.run_dir)
    tasks = tasks or TaskLedger(cfg.env)
    engine = FakeEngine(policy)
    await _loop(cfg, files, trainer, engine, WeightSync(trainer, engine), policy, tasks, step0, {}, None, None)
    return [json.loads(x) for x in files.metrics.read_text().splitlines()], tasks


async def test_no_length_bias_at_alpha_2_with_a_long_tailed_env(tmp_path):
    tag = "ks"
    # Half the episodes take 1-3 turns, a sixth take 40. Cancelling stale episodes (the rule this replaced) trained
    # a mean of 6-8 turns against 11 generated here, KS p = 0.001-0.03 in 3 of 3 runs.
    cfg = _cfg(tmp_path, steps=80, async_ratio=2, checkpoint_every=1000,
               manager=ManagerConfig(num_groups=2, group_size=2, max_turns=64, max_concurrency=256),
               env_kwargs={"turns_tail": 0.5, "turns_max": 40, "step_latency": 0.004, "tag": tag})
    trainer = FakeTrainer(train_s=0.01)
    rows, _ = await _run(cfg, trainer)
    trained = [t.num_turns for b in trainer.batches for g in b for t in g.trajectories]
    generated = [int(e.split(":")[1]) for t, e in EVENTS if t == tag and e.startswith("turns:")]
    assert len(trained) == 80 * 4 and len(generated) >= len(trained)
    assert max(trained) > 10  # the tail reached the trainer
    assert trainer.max_staleness <= 2
    last = rows[-1]
    assert (last["manager/dropped_stale"], last["manager/cancelled"]) == (0, 0), [(r["step"], r["manager/dropped_stale"], r["manager/cancelled"], r["manager/running"]) for r in rows if r["manager/cancelled"]][:5]
    p = ks_2samp(trained, generated).pvalue
    assert p > 0.05, (p, sorted(trained)[-10:], sorted(generated)[-10:])


async def test_resume_admits_one_batch_and_replays_the_tasks_in_flight(tmp_path):
    cfg = _cfg(tmp_path, steps=14, async_ratio=0, checkpoint_every=1,
               manager=ManagerConfig(num_groups=1, group_size=4),
               env_kwargs={"turns": 2, "step_latency": 0.005})
    trainer = FakeTrainer(train_s=0.01)
    trainer.version = 10
    # resumed at step 10: tasks 40, 41 and 47 were opened and not trained before the crash
    tasks = TaskLedger(cfg.env, next_task=48, replay=[47, 40, 41])
    rows, tasks = await _run(cfg, trainer, step0=10, tasks=tasks, version0=10)
    assert [r["step"] for r in rows] == [11, 12, 13, 14]
    # one batch per step (a line is written after the version moved: the next batch has started), never 44 at once
    assert [r["manager/started"] for r in rows] == [8, 12, 16, 20]
    assert [r["tasks"] for r in rows] == [[40], [41], [47], [48]]  # replayed first, then new tasks
    assert trainer.max_staleness == 0
    state = json.loads((RunFiles(cfg.run_dir).checkpoint_dir(14).with_suffix(".json")).read_text())
    assert state["next_task"] == 50 and state["open_tasks"] == [49]  # admitted for step 14, not trained


def test_task_ledger_accounts_for_every_task():
    env = EnvConfig(id=ENV_ID, seed_start=100)
    led = TaskLedger(env, next_task=5, replay=[3, 1])
    specs = [led.next_spec() for _ in range(4)]
    assert [s.group_id for s in specs] == ["task1", "task3", "task5", "task6"]
    assert [s.seed for s in specs] == [101, 103, 105, 106]
    from agentrl.trajectory import Group

    assert led.trained([Group("task3", []), Group("task5", [])]) == [3, 5]
    assert led.state() == {"next_task": 7, "open_tasks": [1, 6], "dropped_tasks": []}
    led2 = TaskLedger(env, next_task=7, replay=[1, 6])
    assert led2.state()["open_tasks"] == [1, 6]  # not yet replayed: still open


async def test_weights_synced_every_second_step_at_alpha_1_waste_no_episode(tmp_path):
    # The engine lags the trainer by one version every other step; admission counts the engine's version, so no
    # episode is admitted that would be stale by the time it is trained (before: 77-81 started for 48 trained, 9-11
    # cancelled as stale and 5-8 queued groups dropped; now 56: the 48 trained and the next batch).
    cfg = _cfg(tmp_path, steps=12, async_ratio=1, sync_every=2, checkpoint_every=1000,
               manager=ManagerConfig(num_groups=2, group_size=2),
               env_kwargs={"turns": 3, "step_latency": 0.005, "latency_sigma": 0.005})
    trainer = FakeTrainer(train_s=0.02)
    rows, _ = await _run(cfg, trainer)
    last = rows[-1]
    assert trainer.max_staleness <= 1
    assert last["manager/dropped_stale"] == 0 and last["manager/cancelled"] == 0
    assert last["manager/started"] <= 12 * 4 + 2 * 4  # trained, plus at most (alpha + 1) batches in flight
