"""Held-out evaluation by task content (agentrl/controller/heldout.py), the training seed range, the sampling
checks of the config and of harness_policy, and the ledger's rule for tasks the run gave up on
(agentrl/controller/ledger.py): the same trained set whether or not the run was interrupted."""

from __future__ import annotations

import asyncio
import json

import pytest

import agentrl
from agentrl.controller.weights import WeightSync
from agentrl.controller.config import DEMO_SEED_START, EVAL_SEED_START
from agentrl.controller.heldout import HeldOut, HeldOutError
from agentrl.controller.ledger import TaskLedger
from agentrl.controller.run import EnvConfig, EvalConfig, RunFiles, TrainConfig, _loop
from agentrl.manager import ManagerConfig
from agentrl.testing.manager_envs import EchoPolicy

pytestmark = pytest.mark.timeout(120)

QUICKSTART_ENV = EnvConfig(id="agentrl/FrozenLake-v0", kwargs={"size": 3, "hole_prob": 0.2})


def _boards(env: EnvConfig, seeds) -> list[str]:
    """The boards the seeds draw, read from the reset observation of a fresh env (not from task_key)."""
    e = agentrl.make(env.id, **env.kwargs)
    return [e.reset(seed=s)[0][1]["content"] for s in seeds]


def test_quickstart_evaluation_boards_are_distinct_and_never_trained_or_demonstrated():
    held = HeldOut(QUICKSTART_ENV, 256)
    ledger = TaskLedger(QUICKSTART_ENV, seeds=held.train)
    train_seeds = [ledger.next_spec().seed for _ in range(50 * 8 + 64)]  # the quickstart's tasks and more
    demo_seeds = [held.demos(i) for i in range(2000)]  # its warm start
    ev = _boards(QUICKSTART_ENV, held.eval_seeds)
    assert len(ev) == 256 and len(set(ev)) == 256  # (seeds 1e6 + i: 211 distinct of 256)
    assert not set(ev) & set(_boards(QUICKSTART_ENV, train_seeds))  # (seeds 0..463: most were evaluation boards)
    assert not set(ev) & set(_boards(QUICKSTART_ENV, demo_seeds))
    assert all(s < EVAL_SEED_START for s in train_seeds) and all(s >= DEMO_SEED_START for s in demo_seeds)
    # the map depends on the config alone: a resumed run plays the same seeds
    again = HeldOut(QUICKSTART_ENV, 256)
    assert again.eval_seeds == held.eval_seeds and [again.train(i) for i in range(464)] == train_seeds


def test_an_env_without_task_keys_keeps_the_seed_ranges():
    env = EnvConfig(id="test/Heldout-Sleep-v0")
    if env.id not in agentrl.registered_ids():
        agentrl.register(env.id, entry_point="agentrl.testing.manager_envs:SleepEnv")
    held = HeldOut(env, 16)
    assert not held.keyed and held.eval_seeds == [EVAL_SEED_START + i for i in range(16)]
    assert [held.train(i) for i in range(3)] == [0, 1, 2] and held.demos(0) == DEMO_SEED_START


def test_every_task_held_out_is_refused_before_training():
    env = EnvConfig(id="agentrl/GuessNumber-v0", kwargs={"low": 1, "high": 8})  # 8 distinct tasks
    held = HeldOut(env, 64)
    assert len(held.eval_seeds) == 8  # as many as there are
    with pytest.raises(HeldOutError, match="every task seems held out.*eval.episodes"):
        held.train(0)
    held = HeldOut(env, 3)
    seeds = [held.train(i) for i in range(20)]
    assert {held.key(s) for s in seeds}.isdisjoint(held.eval_keys) and len({held.key(s) for s in seeds}) == 5


# ------------------------------------------------------------------------------------------- the seed range
def test_training_seeds_past_the_held_out_start_are_refused():
    cfg = TrainConfig(env=EnvConfig(id="agentrl/GuessNumber-v0", seed_start=999_900), steps=50,
                      manager=ManagerConfig(num_groups=8))
    with pytest.raises(ValueError, match=r"env.seed_start \(999900\).*steps \* manager.num_groups \(400\)"):
        cfg.validate()
    # the run checks the seeds it actually opens, more than steps * num_groups when groups are dropped or extra
    env = EnvConfig(id="test/Heldout-Sleep-v0", seed_start=EVAL_SEED_START - 2)
    if env.id not in agentrl.registered_ids():
        agentrl.register(env.id, entry_point="agentrl.testing.manager_envs:SleepEnv")
    ledger = TaskLedger(env, seeds=HeldOut(env, 0).train)
    assert [ledger.next_spec().seed for _ in range(2)] == [EVAL_SEED_START - 2, EVAL_SEED_START - 1]
    assert ledger.next_spec() is None and "lower env.seed_start" in ledger.error


# ----------------------------------------------------------------------------------------- sampling checks
@pytest.mark.parametrize("temperature, ok", [(0.7, False), (1.0, True)])
def test_raw_logprobs_at_a_temperature_other_than_one_is_refused(temperature, ok):
    cfg = TrainConfig(env=EnvConfig(id="agentrl/GuessNumber-v0"))
    cfg.engine.logprobs_mode = "raw_logprobs"
    cfg.rollout.temperature = temperature
    if ok:
        cfg.validate()
    else:
        with pytest.raises(ValueError, match="engine.logprobs_mode: raw_logprobs with rollout.temperature 0.7"):
            cfg.validate()


def test_harness_policy_refuses_a_gateway_config_that_samples_otherwise():
    from agentrl.agent.loop import RolloutConfig
    from agentrl.gateway.config import GatewayConfig
    from agentrl.gateway.harness import harness_policy

    rollout = RolloutConfig(temperature=0.8)
    with pytest.raises(ValueError, match=r"sampling='client'.*temperature=1.0 \(rollout: 0.8\)"):
        harness_policy(lambda ctx: None, GatewayConfig(port=0))(None, None, rollout)
    with pytest.raises(ValueError, match=r"top_k=5"):
        harness_policy(lambda ctx: None, GatewayConfig(port=0, sampling="config", temperature=0.8, top_k=5))(
            None, None, rollout)


# ----------------------------------------------------------------------------------- tasks the run gave up on
ENV_ID = "test/Heldout-Sleep-v0"
if ENV_ID not in agentrl.registered_ids():
    agentrl.register(ENV_ID, entry_point="agentrl.testing.manager_envs:SleepEnv")


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class _Trainer:
    def __init__(self):
        self.train_step = _Remote(self._train)
        self.state_dict_for_inference = _Remote(self._sd)
        self.save_checkpoint = _Remote(self._save)

    async def _train(self, groups):
        await asyncio.sleep(0)
        return {}

    async def _sd(self):
        return {}

    async def _save(self, path):
        from pathlib import Path

        Path(path).mkdir(parents=True)


class _Engine:
    def __init__(self, policy):
        self.policy = policy

    async def update_weights(self, state_dict, version):
        self.policy.current_version = version


async def _run(tmp_path, name, steps, tag, step0=0, state=None):
    cfg = TrainConfig(env=EnvConfig(id=ENV_ID, kwargs={"turns": 1, "tag": tag, "fail_once_seeds": [2]}),
                      run_dir=str(tmp_path / name), steps=steps, async_ratio=0, checkpoint_every=1,
                      manager=ManagerConfig(num_groups=1, group_size=2, max_failures_per_group=0),
                      eval=EvalConfig(episodes=0), progress=False, tensorboard=False)
    cfg.validate()
    files = RunFiles(cfg.run_dir)
    files.root.mkdir(parents=True, exist_ok=True)
    tasks = TaskLedger(cfg.env) if state is None else TaskLedger(
        cfg.env, state["next_task"], state["open_tasks"], dropped_before=state["dropped_tasks"])
    policy = EchoPolicy()
    policy.current_version = step0
    trainer, engine = _Trainer(), _Engine(policy)
    await _loop(cfg, files, trainer, engine, WeightSync(trainer, engine), policy, tasks, step0, {}, None, None)
    rows = [json.loads(x) for x in files.metrics.read_text().splitlines()]
    return rows, files


async def test_a_task_given_up_is_not_replayed_after_a_resume_either(tmp_path):
    """Task 2's first attempt fails (a transient failure; the group's failure budget is 0): the run drops it. An
    uninterrupted run never trains it; a run interrupted after the drop must not either (before: the checkpoint
    listed it as open and the resumed run replayed and trained it)."""
    rows, _ = await _run(tmp_path, "whole", 5, tag="whole")
    whole = [t for r in rows for t in r["tasks"]]
    assert 2 not in whole and len(whole) == 5 and [t for r in rows for t in r["dropped_tasks"]] == [2]

    rows1, files = await _run(tmp_path, "cut", 3, tag="cut")
    state = json.loads(files.checkpoint_dir(3).with_suffix(".json").read_text())
    assert state["step"] == 3 and 2 in state["dropped_tasks"] and 2 not in state["open_tasks"]
    rows2, _ = await _run(tmp_path, "cut", 5, tag="cut", step0=3, state=state)
    assert [r["step"] for r in rows2] == [1, 2, 3, 4, 5]  # the same metrics file
    cut = [t for r in rows2 for t in r["tasks"]]
    assert cut == whole


async def test_a_task_a_long_round_drops_is_closed_in_the_ledger():
    from agentrl.controller.tail import BudgetPolicy, TailPlanner, TailRounds
    from agentrl.trajectory import Group

    ledger = TaskLedger(EnvConfig(id=ENV_ID))

    class _Mgr:
        counts: dict = {}

        async def stream_groups(self, source, n, extra_groups=0):
            specs = [source() for _ in range(n + extra_groups)]
            for s in specs[1:]:  # the first task keeps failing: never delivered
                yield Group(s.group_id, [])

    planner = TailPlanner(num_groups=2, extra_prompts=1, length_budget=10)
    rounds = TailRounds(_Mgr(), BudgetPolicy(EchoPolicy()), planner, ledger.spec_for, ledger.open_task, ledger.dropped)
    got = await rounds.next_batch(2, steps_left=1)  # the last round is long
    assert [g.id for g in got] == ["task1"] and planner.dropped == 1
    ledger.trained(got)
    assert ledger.state() == {"next_task": 2, "open_tasks": [], "dropped_tasks": [0]}
    assert ledger.take_dropped() == [0]
