"""EnvManager with envs hosted in the driver process (``workers: 0``): the episode record, independence of
episodes, faults, cancellation, redundancy, admission and staleness."""

from __future__ import annotations

import asyncio
import collections
import threading
import time

import pytest

from agentrl.config import ConfigError, from_dict
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.testing.manager_envs import EVENTS, EchoPolicy, SleepEnv, SyncSleepEnv
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession

SLEEP = "agentrl.testing.manager_envs:SleepEnv"
SYNC = "agentrl.testing.manager_envs:SyncSleepEnv"

pytestmark = pytest.mark.timeout(60)


def _events(tag, kind):
    return [e for t, e in EVENTS if t == tag and e == kind]


async def test_episode_record_fields():
    pol = EchoPolicy()
    async with EnvManager(ManagerConfig(), pol) as m:
        (t,) = await m.run_episodes([EpisodeSpec(SLEEP, {"turns": 3, "tag": "rec"}, seed=5, task="add 2+2")])
    assert t.termination == "terminated" and t.error is None
    assert t.num_turns == 3 and t.rewards == [1.0, 1.0, 1.0] and t.reward == 3.0
    assert [m["role"] for m in t.messages] == ["system", "user"] + ["assistant", "user"] * 3
    assert t.messages[1]["content"] == "task=add 2+2 seed=5"  # task reaches reset through options, seed too
    assert t.messages[2] == {"role": "assistant", "content": "ok"}
    assert t.info == {"t": 3, "tag": "rec"}
    assert (t.env_id, t.seed, t.task) == (SLEEP, 5, "add 2+2")
    assert set(t.timings) == {"env_s", "policy_s", "queue_s", "total_s"}
    assert t.timings["total_s"] >= t.timings["env_s"] >= 0
    # token fields come from the session's token record: 2 opening + 2 env messages seen by act, 3 turns x 2 tokens
    t.validate()
    assert len(t.token_ids) == 4 + 6 and sum(t.loss_mask) == 6 and t.prompt_len == 2
    assert pol.closed == [t.id]
    assert _events("rec", "close") == ["close"]


async def test_specs_sharing_a_group_id_run_as_separate_episodes():
    """run_episodes with specs that share one group_id (a viewer or eval script grouping by task): each spec is its
    own episode with its own id and env; before, their ids collided, the env handles clashed and episodes failed."""
    from agentrl.envs import scripted_policy

    specs = [EpisodeSpec("agentrl/GuessNumber-v0", seed=i, group_id="same") for i in range(4)]
    async with EnvManager(ManagerConfig(), scripted_policy("agentrl/GuessNumber-v0")) as m:
        trajs = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:2])
    assert [t.error for t in trajs + again] == [None] * 6 and [t.seed for t in trajs] == [0, 1, 2, 3]
    assert len({t.id for t in trajs}) == 4 and {t.group_id for t in trajs} == {"same"}
    assert all(t.reward == 1.0 for t in trajs + again)  # the scripted solver always finds the number


async def test_final_reward_from_info_and_max_turns_and_context_exhausted():
    class Exhausting(Policy):
        def session(self, meta):
            return _Sess()

    class _Sess(PolicySession):
        n = 0

        async def act(self, new):
            self.n += 1
            return Action(text="partial", context_exhausted=self.n == 2)

    async with EnvManager(ManagerConfig(max_turns=2), EchoPolicy()) as m:
        a, b = await m.run_episodes([
            EpisodeSpec(SLEEP, {"turns": 2, "final_reward": 7.5}),
            EpisodeSpec(SLEEP, {"turns": 10}),  # max_turns=2 from the config
        ])
    assert a.termination == "terminated" and a.rewards == [1.0, 1.0] and a.reward == 7.5
    assert b.termination == "truncated" and b.num_turns == 2 and b.reward == 2.0
    async with EnvManager(ManagerConfig(), Exhausting()) as m:
        (c,) = await m.run_episodes([EpisodeSpec(SLEEP, {"turns": 10})])
    assert c.termination == "truncated" and c.num_turns == 1 and c.info["context_exhausted"] is True
    assert c.info["t"] == 1  # the env was stepped once: not for the exhausted turn
    assert c.messages[-1] == {"role": "assistant", "content": "partial"}


async def test_episodes_are_independent_and_finish_in_latency_order():
    cfg = ManagerConfig(step_timeout_s=30)
    async with EnvManager(cfg, EchoPolicy()) as m:
        specs = [EpisodeSpec(SLEEP, {"turns": 3, "step_latency": lat}, seed=i) for i, lat in enumerate([0.3, 0.2, 0.1])]
        specs.append(EpisodeSpec(SLEEP, {"turns": 3, "hang_prob": 1.0}))  # never finishes by itself
        t0 = time.perf_counter()
        order, times = [], []
        agen = m.stream_episodes(specs)
        async for i, traj in agen:
            order.append(i)
            times.append(time.perf_counter() - t0)
            if len(order) == 3:
                break
        await agen.aclose()  # cancels the hanging episode
        assert order == [2, 1, 0]
        # each episode took 3 x its own latency; no lock-step: the slowest (0.9 s) bounds the wall time, and the
        # hanging episode held up nobody
        assert times[2] < 1.75, times  # 1.8 s if the three ran one after the other
        assert m.metrics()["cancelled"] == 1 and m.running == 0


async def test_sync_env_runs_in_thread_pool_without_blocking_the_loop():
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tk = asyncio.ensure_future(ticker())
    async with EnvManager(ManagerConfig(), EchoPolicy()) as m:
        t0 = time.perf_counter()
        trajs = await m.run_episodes([EpisodeSpec(SYNC, {"turns": 2, "step_latency": 0.2, "tag": "sync"}) for _ in range(4)])
        dt = time.perf_counter() - t0
    tk.cancel()
    assert all(t.termination == "terminated" and t.reward == 1.0 for t in trajs)
    threads = [e for t, e in EVENTS if t == "sync" and e.startswith("step_thread:")]
    assert len(threads) == 8 and all(e.startswith("step_thread:agentrl-env") for e in threads)
    assert threading.current_thread().name not in {e.split(":", 1)[1] for e in threads}
    assert SyncSleepEnv.max_parallel >= 2  # steps of different episodes overlapped in the pool
    assert ticks >= 10, ticks  # the event loop kept running while the sync steps slept


@pytest.mark.parametrize("kwargs, expect, cause", [
    ({"fault": "raise"}, "ValueError('injected step failure", "env_exception"),
    ({"fault": "raise", "fault_at": -1}, "RuntimeError('injected reset failure", "env_exception"),
    # an env calling sys.exit (a text game's "quit") ended the worker's event loop with SystemExit
    ({"fault": "exit"}, "sys.exit(3)", "env_exception"),
    ({"fault": "exit", "fault_at": -1}, "sys.exit(3)", "env_exception"),
    ({"fault": "hang", "fault_at": 1}, "kind='timeout'", "env_timeout"),
    ({"fault": "hang", "fault_at": -1}, "kind='timeout'", "env_timeout"),
    ({"fault": "garbage"}, "5-tuple", "env_protocol"),
    ({"fault": "garbage", "fault_at": -1}, "reset must return (obs, info)", "env_protocol"),
    ({"fault": "bad_reward"}, "reward must be a real number, got str", "env_protocol"),
    ({"fault": "nan_reward"}, "reward must be finite", "env_protocol"),
    ({"fault": "bad_obs"}, "observation must be a str or a list", "env_protocol"),
    ({"fault": "bad_info"}, "info must be a dict", "env_protocol"),
    ({"no_such_kwarg": 1}, "kind='make'", "env_make"),
])
async def test_env_faults_end_the_episode_with_error_and_nothing_else_stops(kwargs, expect, cause):
    cfg = ManagerConfig(step_timeout_s=0.3, reset_timeout_s=0.3, max_failures_per_group=2)
    async with EnvManager(cfg, EchoPolicy()) as m:
        specs = [EpisodeSpec(SLEEP, {"turns": 3, "step_latency": 0.05}, seed=i) for i in range(3)]
        specs.insert(1, EpisodeSpec(SLEEP, {"turns": 3, **kwargs}))
        trajs = await m.run_episodes(specs)
        met = m.metrics()
        stats = (await m.worker_stats())[0]
    bad = trajs[1]
    assert bad.termination == "error" and expect in bad.error, bad.error
    assert [t.termination for t in trajs[:1] + trajs[2:]] == ["terminated"] * 3
    # the failing episode was retried max_failures_per_group times, then its group was given up
    assert met["failed"] == 3 and met["replaced"] == 2 and met["failed_groups"] == 1
    assert len({t.id for t in m.failed}) == 3
    # Failures are counted by cause, never scored: no failed attempt carries a reward into a group.
    assert bad.info["failure_cause"] == cause and met[f"failures/{cause}"] == 3
    assert all(t.info["failure_cause"] == cause for t in m.failed)
    assert stats["live"] == 0 and stats["inflight"] == 0


async def test_a_sync_env_calling_sys_exit_in_its_thread_fails_its_episode_not_the_process():
    async with EnvManager(ManagerConfig(max_failures_per_group=0), EchoPolicy()) as m:
        trajs = await m.run_episodes([EpisodeSpec(SYNC, {"exit_on_step": True}), EpisodeSpec(SYNC, {})])
    assert trajs[0].termination == "error" and "sys.exit(3)" in trajs[0].error, trajs[0].error
    assert trajs[1].termination == "terminated"


async def test_policy_exception_is_an_episode_error():
    pol = EchoPolicy(raise_on="turn 2")
    async with EnvManager(ManagerConfig(max_failures_per_group=0), pol) as m:
        (t,) = await m.run_episodes([EpisodeSpec(SLEEP, {"turns": 3, "tag": "pol"})])
    assert t.termination == "error" and "policy failure" in t.error and t.num_turns == 2
    assert t.info["failure_cause"] == "policy_error"
    assert _events("pol", "close") == ["close"] and pol.closed == [t.id]


async def test_episode_timeout():
    async with EnvManager(ManagerConfig(episode_timeout_s=0.3, max_failures_per_group=0), EchoPolicy()) as m:
        (t,) = await m.run_episodes([EpisodeSpec(SLEEP, {"turns": 100, "step_latency": 0.05})])
    assert t.termination == "error" and ("episode_timeout_s" in t.error or "timeout" in t.error)
    assert 3 <= t.num_turns <= 7


async def test_cancelling_losers_closes_their_envs_and_sessions():
    tag = "losers"
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=1, group_size=2, extra_per_group=2, step_timeout_s=60)
    async with EnvManager(cfg, pol) as m:
        t0 = time.perf_counter()
        (g,) = await m.collect_groups([EpisodeSpec(SLEEP, {"turns": 2, "step_latency": 0.02, "tag": tag, "hang_after": 2})])
        dt = time.perf_counter() - t0
        met = m.metrics()
        stats = (await m.worker_stats())[0]
    assert dt < 1.0  # did not wait for the two hanging members
    assert len(g.trajectories) == 2 and all(t.termination == "terminated" for t in g.trajectories)
    assert met["cancelled"] == 2 and met["running"] == 0
    # the two losers were blocked in step: that step was cancelled, and every env was closed by the time
    # collect_groups returned
    assert len(_events(tag, "step_cancelled")) == 2
    assert len(_events(tag, "close")) == 4
    assert sorted(pol.closed) == sorted(pol.opened) and len(pol.opened) == 4
    assert stats["live"] == 0 and stats["inflight"] == 0 and stats["closed"] == 4


async def test_redundancy_first_groups_win_and_losers_are_cancelled():
    tag = "redund"
    cfg = ManagerConfig(num_groups=3, group_size=2, extra_groups=2, extra_per_group=1, step_timeout_s=60)
    slow = [EpisodeSpec(SLEEP, {"turns": 2, "step_latency": 2.0, "tag": tag}, task=f"slow{i}") for i in range(2)]
    fast = [EpisodeSpec(SLEEP, {"turns": 2, "step_latency": 0.05, "latency_sigma": 0.02, "tag": tag}, task=f"fast{i}")
            for i in range(3)]
    async with EnvManager(cfg, EchoPolicy()) as m:
        t0 = time.perf_counter()
        groups = await m.collect_groups(slow + fast + [EpisodeSpec(SLEEP, task="never used")])
        dt = time.perf_counter() - t0
        met = m.metrics()
    assert dt < 1.5
    assert sorted(g.trajectories[0].task for g in groups) == ["fast0", "fast1", "fast2"]
    for g in groups:
        assert len(g.trajectories) == 2 and len({t.group_id for t in g.trajectories}) == 1
        assert all(t.termination == "terminated" for t in g.trajectories)
    launched = 5 * 3
    assert met["started"] == launched
    assert met["cancelled"] + met["surplus"] == launched - 6 and met["cancelled"] >= 6  # both slow groups entirely
    assert len(_events(tag, "close")) == launched


async def test_group_members_failing_are_replaced_and_nothing_is_lost_or_duplicated():
    cfg = ManagerConfig(num_groups=6, group_size=3, extra_per_group=1, max_failures_per_group=50)
    specs = [EpisodeSpec(SLEEP, {"turns": 3, "step_latency": 0.01, "latency_sigma": 0.01, "fault": "raise",
                                 "fault_prob": 0.3, "fault_at": 1}, seed=i, task=i) for i in range(100)]
    async with EnvManager(cfg, EchoPolicy()) as m:
        groups = await m.collect_groups(specs)
        met = m.metrics()
    assert len(groups) == 6
    delivered = [t for g in groups for t in g.trajectories]
    ids = [t.id for t in delivered]
    assert len(ids) == len(set(ids)) == 18
    assert all(t.termination == "terminated" for t in delivered)
    for g in groups:
        assert len({(t.seed, t.task) for t in g.trajectories}) == 1 and all(t.group_id == g.id for t in g.trajectories)
    failed_ids = {t.id for t in m.failed}
    assert met["failed"] == len(failed_ids) > 0 and not failed_ids & set(ids)
    assert met["started"] == met["finished"] + met["failed"] + met["cancelled"]


class _AdmissionCheckingPolicy(EchoPolicy):
    """Checks AReaL's bound at every episode start (the episode already counts as running)."""

    def __init__(self):
        super().__init__(latency=0.005)
        self.mgr: EnvManager | None = None
        self.checks = 0
        self.violations: list[tuple] = []

    def session(self, meta: EpisodeMeta) -> PolicySession:
        m = self.mgr
        a, b = m.cfg.async_ratio, m.batch_size
        # the episode being started already counts as running, so "< bound before the start" is "<= bound now"
        if not (m.accepted + m.running + m.held <= (a + m.version + 1) * b):
            self.violations.append((m.accepted, m.running, m.held, m.version))
        self.checks += 1
        return super().session(meta)


async def test_admission_bound_holds_under_a_moving_version():
    alpha, B = 1, 4
    pol = _AdmissionCheckingPolicy()
    cfg = ManagerConfig(num_groups=2, group_size=2, async_ratio=alpha, max_concurrency=1000)
    specs = (EpisodeSpec(SLEEP, {"turns": 2, "step_latency": 0.01, "latency_sigma": 0.01}, seed=i) for i in range(10**6))
    async with EnvManager(cfg, pol) as m:
        pol.mgr = m
        m.set_version(0)
        m.start(specs)
        consumed = 0
        async for g in m.groups():
            consumed += len(g.trajectories)
            if consumed % B == 0:  # the trainer consumed a batch: next version
                pol.current_version = consumed // B
                m.set_version(consumed // B)
            if consumed >= 5 * B:
                break
        # the consumer stops: production must stall at (alpha + v + 1) * B accepted + running (once the running
        # episodes finished, however long that takes on a loaded machine)
        bound, t_end = (alpha + 5 + 1) * B, time.monotonic() + 60
        while (m.metrics()["running"] or m.metrics()["accepted"] < bound) and time.monotonic() < t_end:
            await asyncio.sleep(0.01)
        met = m.metrics()
        await m.stop()
    assert not pol.violations, pol.violations[:5]
    assert pol.checks >= 5 * B
    v = met["version"]
    assert v == 5
    assert met["accepted"] + met["running"] <= (alpha + v + 1) * B
    assert met["accepted"] == (alpha + v + 1) * B and met["running"] == 0  # stalled exactly at the bound


@pytest.mark.parametrize("policy", ["cancel", "drop"])
async def test_stale_episodes_are_cancelled_or_dropped_and_counted(policy):
    tag = f"stale-{policy}"
    pol = EchoPolicy()
    cfg = ManagerConfig(num_groups=1, group_size=2, async_ratio=1, stale_policy=policy, batch_size=100)
    specs = iter([EpisodeSpec(SLEEP, {"turns": 6, "step_latency": 0.05, "tag": tag}, seed=i) for i in range(50)])
    async with EnvManager(cfg, pol) as m:
        m.start(specs)
        while m.metrics()["policy_calls"] < m.metrics()["started"] or m.metrics()["started"] == 0:
            await asyncio.sleep(0.005)  # every running episode holds tokens of version 0
        await asyncio.sleep(0.01)
        pol.current_version = 2
        m.set_version(2)  # v - alpha = 1 > 0: the running episodes are stale
        g = await m.next_group()
        met = m.metrics()
        await m.stop()
    assert met["dropped_stale"] >= 2
    for t in g.trajectories:
        assert t.termination == "terminated" and min(v for v in t.versions if v >= 0) >= 1
    if policy == "cancel":
        assert met["cancelled"] >= 2 and len(_events(tag, "step_cancelled")) >= 2
    else:
        assert met["finished"] >= 4
    assert len(_events(tag, "close")) == met["started"]


def test_config_is_typed_and_validated():
    with pytest.raises(ConfigError, match="workerz"):
        from_dict(ManagerConfig, {"workerz": 2})
    with pytest.raises(ConfigError, match="max_concurrency must be >= 1"):
        from_dict(ManagerConfig, {"max_concurrency": 0})
    with pytest.raises(ConfigError, match="stale_policy"):
        from_dict(ManagerConfig, {"stale_policy": "ignore"})
    cfg = from_dict(ManagerConfig, {"workers": 2, "async_ratio": 2, "step_timeout_s": 5})
    assert cfg.step_timeout_s == 5.0 and cfg.async_ratio == 2
    with pytest.raises(ValueError, match="env_id"):
        EpisodeSpec("")


async def test_metrics_snapshot():
    async with EnvManager(ManagerConfig(), EchoPolicy()) as m:
        await m.run_episodes([EpisodeSpec(SLEEP, {"turns": 4, "step_latency": 0.01}) for _ in range(10)])
        met = m.metrics()
    assert met["env_steps"] == 40 and met["finished"] == 10 and met["running"] == 0
    assert 0.005 < met["step_p50_s"] <= met["step_p90_s"] <= met["step_p99_s"] <= met["step_max_s"] < 0.5
    assert met["steps_per_s"] > 0 and met["episodes_per_s"] > 0
    for k in ("cancelled", "failed", "dropped_stale", "rescheduled", "pending", "workers_alive"):
        assert k in met


async def test_max_concurrency_bounds_running_episodes():
    async with EnvManager(ManagerConfig(max_concurrency=4), EchoPolicy()) as m:
        trajs = await m.run_episodes([EpisodeSpec(SLEEP, {"turns": 2, "step_latency": 0.01}, seed=i) for i in range(20)])
        met = m.metrics()
    assert met["max_running"] == 4 and len(trajs) == 20
    assert [t.seed for t in trajs] == list(range(20))
    assert max(t.timings["queue_s"] for t in trajs) > 0.02  # later episodes waited for a slot


async def test_discard_lets_admission_produce_more():
    # alpha = 0, B = 2: one group may be produced per version; a discarded group frees its share
    cfg = ManagerConfig(num_groups=1, group_size=2, async_ratio=0)
    specs = (EpisodeSpec(SLEEP, {"turns": 1, "step_latency": 0.01}, seed=i) for i in range(100))
    pol = EchoPolicy()
    async with EnvManager(cfg, pol) as m:
        m.start(specs)
        # Admission runs when an episode ends and in discard/set_version, synchronously: once every episode
        # started so far has ended (as each group taken here has), whatever admission allows has started.
        g1 = await m.next_group()
        assert m.metrics()["started"] == 2 and m.metrics()["accepted"] == 2  # stalled at (0 + 0 + 1) * 2
        m.discard(2)  # the trainer filtered that group out
        g2 = await asyncio.wait_for(m.next_group(), 5)
        assert m.metrics()["started"] == 4 and m.metrics()["finished"] == 4
        m.set_version(1)  # the engine still serves version 0: admission counts its version, so nothing starts
        assert m.metrics()["started"] == 4
        pol.current_version = 1
        m.set_version(1)  # called again once the engine moved: the next version's batch is admitted
        g3 = await asyncio.wait_for(m.next_group(), 5)
        assert m.metrics()["dropped_stale"] == 0
        await m.stop()
    assert len({t.id for g in (g1, g2, g3) for t in g.trajectories}) == 6


async def test_reset_info_tools_reach_the_policy_meta_before_the_first_act():
    seen = []

    class ToolsEnv(SleepEnv):
        async def areset(self, *, seed=None, options=None):
            obs, info = await super().areset(seed=seed, options=options)
            return obs, {**info, "tools": [{"name": "calc"}]}

    class P(Policy):
        def session(self, meta):

            class S(PolicySession):
                async def act(self, new):
                    seen.append(getattr(meta, "tools", None))
                    return Action(text="ok")
            return S()

    import agentrl.testing.manager_envs as mt

    mt.ToolsEnvForTest = ToolsEnv  # reachable as an entry point in this process
    async with EnvManager(ManagerConfig(), P()) as m:
        (t,) = await m.run_episodes([EpisodeSpec("agentrl.testing.manager_envs:ToolsEnvForTest", {"turns": 1})])
    assert t.termination == "terminated" and seen == [[{"name": "calc"}]]


async def test_state_keys_reported_per_step_are_collected_for_the_trainer():
    """An env's info["state_key"] of reset and of every step becomes Trajectory.info["state_keys"] (one per turn's
    starting state, then the final state), what gigpo's step groups read."""
    import agentrl
    from agentrl.core import Env

    class Walk(Env):
        def reset(self, *, seed=None, options=None):
            self.pos = 0
            return "start", {"state_key": self.pos}

        def step(self, action):
            self.pos += 1
            return "moved", 0.5, self.pos >= 2, False, {"state_key": self.pos}

    agentrl.register("test/StateKeys-v0", entry_point=Walk)
    async with EnvManager(ManagerConfig(), EchoPolicy()) as m:
        (t,) = await m.run_episodes([EpisodeSpec("test/StateKeys-v0")])
    assert t.termination == "terminated" and t.info["state_keys"] == [0, 1, 2] and t.rewards == [0.5, 0.5]
