"""The controller's schedulers (agentrl.controller.tail, agentrl.controller.batches): the tail-batching planner alone; tail batching
through the controller loop with the real EnvManager and a long-tailed env (staleness 0, every deferred prompt
trained exactly once); streamed accumulation through the controller against whole-batch steps with the real trainer
(fp32, 1e-5); the config refusals. The real engine runs these schedulers in benchmarks/bench_schedulers.py."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path

import pytest

import agentrl
from agentrl.config import ConfigError
from agentrl.manager import ManagerConfig
from agentrl.testing.manager_envs import EchoPolicy
from agentrl.controller.weights import WeightSync
from agentrl.controller.run import EnvConfig, EvalConfig, RunFiles, TaskLedger, TrainConfig, _loop, load_config
from agentrl.policy import Action, PolicySession, TokenRecord
from agentrl.manager.episode import GiveUpGroup
from agentrl.controller.tail import LONG, SHORT, BudgetPolicy, TailBatchingConfig, TailPlanner
from agentrl.trainer.config import OptimizerConfig, TrainerConfig

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
ENV_ID = "test/LongTail-v0"
if ENV_ID not in agentrl.registered_ids():
    agentrl.register(ENV_ID, entry_point="agentrl.testing.manager_envs:SleepEnv")


# --------------------------------------------------------------------------------------------- the planner alone
@pytest.mark.parametrize("seed", range(5))
def test_planner_replays_every_deferred_prompt_once_and_drains_by_the_last_round(seed):
    rng = random.Random(seed)
    n, extra, steps = 4, rng.choice([1, 2, 3, 6]), rng.randrange(3, 40)
    p = TailPlanner(n, extra, length_budget=100)
    next_task, trained, deferred_ever = 0, [], []
    kinds = []
    for step in range(steps):
        plan = p.plan(steps - step)
        kinds.append(plan.kind)
        fresh = list(range(next_task, next_task + plan.fresh))
        next_task += plan.fresh
        launched = plan.replay + fresh
        assert plan.need == n and len(launched) >= n
        if plan.kind == SHORT:
            assert plan.budget == 100 and not plan.replay and len(launched) == n + extra
            won = rng.sample(launched, n)  # any n finish within the budget first
            lost = [t for t in launched if t not in won]
            deferred_ever += lost
            p.finished(plan, lost)
            trained += won
        else:
            assert plan.budget is None and len(launched) == n
            p.finished(plan, [])
            trained += launched
    c = Counter(trained)
    assert all(v == 1 for v in c.values())  # no task trained twice
    assert set(c) == set(range(next_task))  # every opened task trained, the deferred ones included
    assert set(deferred_ever) <= set(c) and not p.deferred
    assert kinds[-1] == LONG  # the last round never defers
    m = p.metrics()
    assert m["tail/short_rounds"] + m["tail/long_rounds"] == steps and m["tail/deferred_total"] == len(deferred_ever)


def test_planner_waits_for_a_full_long_round_while_steps_remain():
    p = TailPlanner(4, 2, length_budget=8)
    assert p.plan(100).kind == SHORT
    p.finished(p.plan(100), [10, 11])
    assert p.plan(100).kind == SHORT  # 2 waiting: not yet a full long round
    p.finished(RoundPlan_short(p), [12, 13])
    plan = p.plan(100)
    assert (plan.kind, plan.replay, plan.fresh) == (LONG, [10, 11, 12, 13], 0)  # first in, first out
    p.finished(plan, [])
    p.finished(RoundPlan_short(p), [20])
    assert p.plan(2).kind == SHORT  # 1 + 2 deferred would still fit into the last round
    p.finished(RoundPlan_short(p), [21, 22, 23, 24, 25])  # a short round that needed a top-up wave
    plan = p.plan(3)  # 6 waiting, 2 rounds left: a short round now could leave 8, too many to drain
    assert (plan.kind, plan.replay, plan.fresh) == (LONG, [20, 21, 22, 23], 0)
    p.finished(plan, [])
    plan = p.plan(1)  # the last round: replays what is left, topped up with fresh prompts
    assert (plan.kind, plan.replay, plan.fresh) == (LONG, [24, 25], 2)


def RoundPlan_short(p: TailPlanner):
    plan = p.plan(100)
    assert plan.kind == SHORT
    return plan


# ------------------------------------------------------------------------------------------ the budget wrapper
class _CappedSession(PolicySession):
    """Generates ``per_turn`` tokens a turn, fewer when ``max_new_tokens`` caps it (as AgentLoopSession does)."""

    def __init__(self, per_turn: int):
        self.per_turn, self.max_new_tokens, self.caps = per_turn, None, []

    async def act(self, new_messages):
        self.caps.append(self.max_new_tokens)
        n = min(self.per_turn, self.max_new_tokens or self.per_turn)
        return Action(text="x", token_ids=[1] * n, logprobs=[0.0] * n, versions=[0] * n)

    def token_record(self):
        return TokenRecord([1], [1], [0.0], [0], 0)


class _Inner:
    version = 0

    def __init__(self, per_turn):
        self.per_turn, self.sessions = per_turn, []

    def session(self, meta):
        self.sessions.append(_CappedSession(self.per_turn))
        return self.sessions[-1]


async def test_budget_policy_caps_generation_and_gives_the_group_up():
    inner = _Inner(per_turn=4)
    pol = BudgetPolicy(inner)
    pol.budget = 10
    s = pol.session(None)
    acts = [await s.act([]) for _ in range(2)]
    with pytest.raises(GiveUpGroup, match="11 generated tokens > tail_batching.length_budget 10"):
        await s.act([])
    # 4 + 4 generated; the third turn may generate 10 - 8 + 1 = 3 (one past the budget tells "over" from "at")
    assert inner.sessions[0].caps == [11, 7, 3] and len(acts) == 2 and pol.over_budget == 1
    pol.budget = None  # sessions opened without a budget are never cut
    s2 = pol.session(None)
    acts = [await s2.act([]) for _ in range(5)]
    assert len(acts) == 5 and inner.sessions[1].caps == [None] * 5 and pol.over_budget == 1


async def test_a_group_given_up_at_the_budget_is_replaced_at_once_and_its_siblings_cancelled():
    from agentrl.manager import EnvManager, EpisodeSpec

    # instances in creation order: task0 (1, 1 turns), task1 (6, 6: over a 4-token budget at its third turn),
    # task2 (1, 1), then the replacement task3 (1, 1); 2 tokens a turn
    kw = {"turns_per_instance": [1, 1, 6, 6, 1, 1, 1, 1], "step_latency": 0.01, "tag": "giveup"}
    specs = iter(EpisodeSpec(ENV_ID, env_kwargs=kw, seed=i, group_id=f"task{i}") for i in range(10))
    pol = BudgetPolicy(EchoPolicy(tokens_per_turn=2))
    pol.budget = 4
    async with EnvManager(ManagerConfig(group_size=2, max_concurrency=4), pol) as mgr:
        got = [g.id async for g in mgr.stream_groups(specs, 3, extra_groups=0)]
        m = mgr.metrics()
    assert sorted(got) == ["task0", "task2", "task3"]  # task1 given up, task3 opened in its place
    assert m["given_up_groups"] == 1 and m["failed_groups"] == 0 and pol.over_budget >= 1
    assert m["cancelled"] >= 2 and m["running"] == 0  # task1's members ended early, not after 6 turns


# ------------------------------------------------------------------------------------ through the controller
class _Remote:
    def __init__(self, fn):
        self.remote = fn


class RecordingTrainer:
    """The controller's view of the trainer actor (``.remote`` calls): a fake that sleeps (``trainer`` None) or a
    real in-process :class:`~agentrl.trainer.trainer.Trainer`. Records each step's groups in arrival order and the
    staleness of every trained token."""

    def __init__(self, trainer=None, train_s: float = 0.0):
        self.trainer, self.train_s = trainer, train_s
        self.version, self.batches, self.max_staleness, self.streamed = 0, [], 0, 0
        self._open: list | None = None
        for name in ("train_step", "start_step", "accumulate", "finish_step", "abort_step", "state_dict_for_inference",
                     "save_checkpoint"):
            setattr(self, name, _Remote(getattr(self, "_" + name)))

    def _staleness(self, groups):
        for g in groups:
            for t in g.trajectories:
                old = min(v for v, m in zip(t.versions, t.loss_mask) if m)
                self.max_staleness = max(self.max_staleness, self.version - old)

    async def _train_step(self, groups):
        await asyncio.sleep(self.train_s)
        self._staleness(groups)
        self.batches.append(list(groups))
        m = self.trainer.train_step(groups) if self.trainer else {}
        self.version += 1
        return m

    async def _start_step(self):
        assert self._open is None
        self._open = []
        if self.trainer:
            self.trainer.start_step()

    async def _accumulate(self, groups):
        self._staleness(groups)
        self._open += groups
        return self.trainer.accumulate(groups) if self.trainer else {"accumulate/s": 0.0}

    async def _finish_step(self):
        await asyncio.sleep(self.train_s)
        self.batches.append(self._open)
        self._open = None
        self.streamed += 1
        m = self.trainer.finish_step() if self.trainer else {}
        self.version += 1
        return m

    async def _abort_step(self):
        self._open = None

    async def _state_dict_for_inference(self):
        return {}

    async def _save_checkpoint(self, path):
        Path(path).mkdir(parents=True)
        return path


class FakeEngine:
    def __init__(self, policy: EchoPolicy):
        self.policy = policy

    async def update_weights(self, state_dict, version):
        self.policy.current_version = version


def _cfg(tmp_path, env_kwargs, **kw) -> TrainConfig:
    cfg = TrainConfig(env=EnvConfig(id=ENV_ID, kwargs=env_kwargs), run_dir=str(tmp_path),
                      eval=EvalConfig(episodes=0), progress=False, tensorboard=False, checkpoint_every=1000, **kw)
    cfg.validate()
    return cfg


async def _run(cfg, trainer, tokens_per_turn=2):
    policy = EchoPolicy(tokens_per_turn=tokens_per_turn)
    files = RunFiles(cfg.run_dir)
    tasks = TaskLedger(cfg.env)
    engine = FakeEngine(policy)
    summary = await _loop(cfg, files, trainer, engine, WeightSync(trainer, engine), policy, tasks, 0, {}, None, None)
    return [json.loads(x) for x in files.metrics.read_text().splitlines()], tasks, summary


@pytest.mark.parametrize("streaming", [False, True])
async def test_tail_batching_is_on_policy_and_trains_every_deferred_prompt_once(tmp_path, streaming):
    # A Pareto(1) number of turns (half the episodes take one, some take 30), 2 tokens a turn; budget 8 tokens = 4
    # turns: most groups of 2 fit, a fifth or so do not.
    n = 3
    cfg = _cfg(tmp_path, {"turns_tail": 1.0, "turns_max": 30, "step_latency": 0.003},
               steps=14, async_ratio=0, streaming=streaming,
               manager=ManagerConfig(num_groups=n, group_size=2, max_turns=40, max_concurrency=64),
               tail_batching=TailBatchingConfig(enabled=True, length_budget=8, extra_prompts=2))
    trainer = RecordingTrainer(train_s=0.005)
    rows, tasks, summary = await _run(cfg, trainer)
    assert trainer.max_staleness == 0
    assert trainer.streamed == (14 if streaming else 0)
    trained = [t for r in rows for t in r["tasks"]]
    assert len(trained) == 14 * n and len(set(trained)) == len(trained)  # nothing trained twice
    # every opened task trained, but for deferred ones a late short round left over (then kept for a resume)
    assert set(trained) | tasks.open == set(range(tasks.next_task)) and not set(trained) & tasks.open
    assert len(tasks.open) == rows[-1]["tail/deferred_waiting"] == summary["tail"]["tail/deferred_waiting"] <= n
    short = [r for r in rows if r["tail/long_round"] == 0]
    long = [r for r in rows if r["tail/long_round"] == 1]
    assert short and long and rows[-1]["tail/long_round"] == 1
    deferred = rows[-1]["tail/deferred_total"]
    assert deferred >= 2 * len(short)  # every short round defers at least its extra prompts
    # short rounds train only groups within the budget; long rounds train the tail
    short_tok = [t.num_generated for b, r in zip(trainer.batches, rows) if r["tail/long_round"] == 0
                 for g in b for t in g.trajectories]
    long_tok = [t.num_generated for b, r in zip(trainer.batches, rows) if r["tail/long_round"] == 1
                for g in b for t in g.trajectories]
    assert max(short_tok) <= 8 and max(long_tok) > 8
    # (episodes past the budget give their group up; most long ones are simply cancelled when the round is full)
    assert all(r["tail/over_budget"] >= r["tail/given_up_groups"] for r in short)
    assert sum(r["tail/deferred"] for r in short) == deferred and summary["tail"]["tail/dropped"] == 0
    for b in trainer.batches:  # whole groups of group_size, each with its own trajectory ids
        assert all(len(g.trajectories) == 2 and {t.group_id for t in g.trajectories} == {g.id} for g in b)
        assert len({t.id for g in b for t in g.trajectories}) == 2 * n
    assert {"tail/length_budget", "tail/over_budget", "time/trainer_idle_frac", "time/rollout_idle_frac"} <= set(rows[0])


def _tiny_model(tmp_path: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(7)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                         max_position_embeddings=256, tie_word_embeddings=True))
    model.save_pretrained(str(tmp_path / "m"))
    return tmp_path / "m"


@pytest.mark.parametrize("tail", [False, True])
async def test_streamed_steps_through_the_controller_equal_whole_batch_steps(tmp_path, tail):
    import torch

    from agentrl.trainer.trainer import Trainer

    model = _tiny_model(tmp_path)
    tcfg = lambda: TrainerConfig(device="cpu", micro_batch_size=2, optimizer=OptimizerConfig(lr=1e-2))  # noqa: E731
    streamed = RecordingTrainer(Trainer(tcfg(), model))
    cfg = _cfg(tmp_path / "run", {"turns_tail": 1.0, "turns_max": 8, "step_latency": 0.002, "reward_per_step": 0.5},
               steps=3, async_ratio=0, streaming=True,
               manager=ManagerConfig(num_groups=3, group_size=3, max_turns=10),
               tail_batching=TailBatchingConfig(enabled=tail, length_budget=6, extra_prompts=1))
    rows, _, _ = await _run(cfg, streamed, tokens_per_turn=3)
    assert streamed.streamed == 3 and all(r["train/stream/accumulate_calls"] == 3 for r in rows)
    whole = Trainer(tcfg(), model)
    for batch in streamed.batches:  # the same groups, one train_step each
        whole.train_step(batch)
    a = {k: v.detach() for k, v in streamed.trainer.model.named_parameters()}
    b = {k: v.detach() for k, v in whole.model.named_parameters()}
    initial = Trainer(tcfg(), model)
    moved = max(float((a[k] - v.detach()).abs().max()) for k, v in initial.model.named_parameters())
    assert moved > 1e-3
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=0), k


# ---------------------------------------------------------------------------------------------- config refusals
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.mark.parametrize("overrides, match", [
    (["tail_batching.enabled=true", "tail_batching.length_budget=16"], r"tail_batching.enabled needs async_ratio: 0"),
    (["tail_batching.enabled=true", "async_ratio=0"], r"tail_batching: length_budget must be >= 1"),
    (["tail_batching.enabled=true", "async_ratio=0", "tail_batching.length_budget=16", "tail_batching.extra_prompts=0"],
     r"tail_batching: extra_prompts must be >= 1"),
    (["tail_batching.enabled=true", "async_ratio=0", "tail_batching.length_budget=16", "manager.extra_per_group=1"],
     r"cannot be combined with manager.extra_groups \(0\) or manager.extra_per_group \(1\)"),
    (["streaming=true", "trainer.num_mini_batches=2"], r"streaming needs trainer.num_mini_batches: 1"),
    (["streaming=true", "trainer.ppo_epochs=2"], r"streaming needs trainer.num_mini_batches: 1 and trainer.ppo_epochs"),
])
def test_scheduler_combinations_that_change_the_update_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(QUICKSTART, overrides)


def test_schedulers_that_compose_are_accepted():
    c = load_config(QUICKSTART, ["tail_batching.enabled=true", "async_ratio=0", "tail_batching.length_budget=16",
                                 "streaming=true"])
    assert c.tail_batching.enabled and c.streaming
    assert load_config(QUICKSTART, ["streaming=true", "async_ratio=2"]).streaming  # streaming at alpha >= 1


async def test_streaming_at_alpha_2_keeps_the_staleness_bound(tmp_path):
    # groups are taken one at a time, earliest deadline first: nothing goes past alpha, nothing is cancelled
    cfg = _cfg(tmp_path, {"turns_tail": 0.7, "turns_max": 20, "step_latency": 0.003}, steps=16, async_ratio=2,
               streaming=True, manager=ManagerConfig(num_groups=2, group_size=2, max_turns=32))
    trainer = RecordingTrainer(train_s=0.01)
    rows, tasks, _ = await _run(cfg, trainer)
    assert trainer.streamed == 16 and all(len(b) == 2 for b in trainer.batches)
    assert trainer.max_staleness <= 2
    assert rows[-1]["manager/dropped_stale"] == 0 and rows[-1]["manager/cancelled"] == 0
    trained = [t for r in rows for t in r["tasks"]]
    assert len(set(trained)) == len(trained) == 32


async def test_a_streamed_step_asks_for_its_groups_with_the_steps_capacity():
    """Each group of a streamed step is taken with the step's size and the groups taken so far, so the manager
    plans deadlines with the capacity the whole-batch step has (agentrl/manager/admission.py, select_batch)."""
    from agentrl.controller.batches import ContinuousBatches
    from agentrl.trajectory import Group

    calls = []

    class _Mgr:
        async def next_batch(self, n, **kw):
            calls.append((n, kw))
            return [Group(f"task{len(calls)}", [])]

    fed = []
    got = await ContinuousBatches(_Mgr(), lambda: None).next_batch(3, 1, fed.append)
    assert [g.id for g in got] == [g.id for g in fed] == ["task1", "task2", "task3"]
    assert calls == [(1, {"batch": 3, "taken": 0}), (1, {"batch": 3, "taken": 1}), (1, {"batch": 3, "taken": 2})]


# ------------------------------------------------------------------------------------------ dynamic sampling
@pytest.mark.parametrize("extra", [0, 6])
async def test_dynamic_sampling_trains_only_groups_with_signal_and_closes_every_task_once(tmp_path, extra):
    """Pareto-long episodes (reward = turns): about a third of the groups of 2 tie. Tied groups are left out of the
    update and replaced (up to ``extra`` per step) under the same admission rule: nothing is staler than α, every
    opened task is trained or dropped exactly once, and admission's count stays one batch a step."""
    from agentrl.controller.dynamic import DynamicSamplingConfig

    n = 3
    cfg = _cfg(tmp_path, {"turns_tail": 1.0, "turns_max": 6, "step_latency": 0.002}, steps=10, async_ratio=1,
               manager=ManagerConfig(num_groups=n, group_size=2, max_turns=8),
               dynamic_sampling=DynamicSamplingConfig(enabled=True, max_extra_groups=extra))
    trainer = RecordingTrainer(train_s=0.002)
    rows, tasks, _ = await _run(cfg, trainer)
    assert len(trainer.batches) == 10 and trainer.max_staleness <= 1
    left_out = sum(r["dynamic_sampling/groups_left_out"] for r in rows)
    assert left_out > 0  # the env ties often enough for the rule to act
    for batch in trainer.batches:
        with_signal = [len({t.reward for t in g.trajectories}) > 1 for g in batch]
        if any(with_signal):
            assert all(with_signal)  # a tied group is trained only when no group of its step had signal
        if extra:
            assert len(batch) <= n
    trained = [t for r in rows for t in r["tasks"]]
    dropped = [t for r in rows for t in r["dropped_tasks"]]
    assert len(set(trained)) == len(trained) and not set(trained) & set(dropped)
    assert len(set(dropped)) == len(dropped)
    taken = [r["dynamic_sampling/groups_taken"] for r in rows]
    if extra:  # left-out groups were replaced: steps took more than n groups, and trained more than without
        assert max(taken) > n and sum(len(b) for b in trainer.batches) > 10 * n - left_out
    else:
        assert taken == [n] * 10
    assert rows[-1]["manager/dropped_stale"] == 0


def test_dynamic_sampling_refuses_streaming_and_tail_batching():
    with pytest.raises(ConfigError, match="dynamic_sampling.enabled cannot be combined"):
        load_config(ROOT / "configs" / "quickstart.yaml", ["dynamic_sampling.enabled=true", "streaming=true"])


async def test_infrastructure_faults_are_replaced_never_scored_and_counted(tmp_path):
    """5 % of episodes fail (their env raises at its first step, as a lost connection or a killed sandbox does) in a
    training run: the trainer never sees a failed episode (no zero reward stands in for it), one failure never costs
    its group, every task is trained exactly once, and the metrics count every failure by its cause."""
    n, steps = 4, 12
    cfg = _cfg(tmp_path, {"turns": 2, "step_latency": 0.002, "fault": "raise", "fault_at": 0, "fault_prob": 0.05},
               steps=steps, async_ratio=1, manager=ManagerConfig(num_groups=n, group_size=4, max_turns=4,
                                                                 max_failures_per_group=6))
    trainer = RecordingTrainer(train_s=0.002)
    rows, tasks, _ = await _run(cfg, trainer)
    trained = [t for b in trainer.batches for g in b for t in g.trajectories]
    assert len(trained) == steps * n * 4
    assert all(t.termination == "terminated" and t.reward == 2.0 and t.error is None for t in trained)
    last = rows[-1]
    failures = {k: v for k, v in last.items() if k.startswith("manager/failures/")}
    assert last["manager/failed"] > 0 and sum(failures.values()) == last["manager/failed"]
    assert set(failures) == {"manager/failures/env_exception"}
    assert last["manager/failed_groups"] == 0 and not [t for r in rows for t in r["dropped_tasks"]]
    ids = [t for r in rows for t in r["tasks"]]
    assert len(set(ids)) == len(ids) == steps * n
