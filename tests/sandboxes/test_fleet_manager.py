"""The env manager over a sandbox fleet (``agentrl.envs.shell:ShellEnv`` episodes stepping real commands), with the
faults made to happen on a share of the first attempts: sandboxes killed from outside mid-command, a command past
the memory limit, one past the disk limit. Every affected episode ends as an infrastructure failure with its cause
(``failures/<cause>``), is retried in a fresh sandbox, and is delivered exactly once; nothing is left behind."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.sandboxes import SandboxPool, create_sandbox
from agentrl.testing.fleet import FleetPolicy

COUNT = {"bwrap": 64, "docker": 16}
SHELL = "agentrl.envs.shell:ShellEnv"
FAULT_OF = {0: "kill", 1: "oom", 2: "disk"}  # by index mod 8: 3/8 of the fleet's first attempts fail


def recording_pool(made: dict, **kw) -> SandboxPool:
    async def factory(spec):
        sb = await create_sandbox(spec).start()
        made[sb.id] = sb
        return sb

    return SandboxPool(factory=factory, **kw)


def leftovers(sb) -> list[str]:
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        return [c["Id"][:12] for c in docker_client().api.containers(all=True, filters={"id": sb.container_id})]
    left = [str(sb.state_dir)] if sb.state_dir.exists() else []
    if sb.cgroup is not None:
        left += [str(d) for d in sb.cgroup.dirs if d.exists()]
    return left


async def test_fleet_faults_are_retried_in_fresh_sandboxes_and_counted_once(busybox_spec):
    n = COUNT[busybox_spec.backend]
    spec = replace(busybox_spec, memory_mb=32, pids=32, workdir_size_mb=4, tmp_size_mb=4)
    made: dict = {}
    pool = recording_pool(made, max_alive=n, create_rate=100, create_burst=16)
    policy = FleetPolicy(made, steps=2)
    faults = {i: FAULT_OF.get(i % 8) for i in range(n)}
    specs = [EpisodeSpec(SHELL, {"pool": pool, "spec": spec}, seed=i, task={"fault": faults[i], "expect": "done"})
             for i in range(n)]
    cfg = ManagerConfig(max_concurrency=n, infra_retries=2, max_failures_per_group=0, step_timeout_s=120,
                        reset_timeout_s=120)
    try:
        async with EnvManager(cfg, policy) as m:
            trajs = await asyncio.wait_for(m.run_episodes(specs), 600)  # the driver never hangs
            met = m.metrics()
    finally:
        await pool.close()
    want = {f: sum(1 for x in faults.values() if x == f) for f in ("kill", "oom", "disk")}
    assert [t.termination for t in trajs] == ["terminated"] * n, [t.error for t in trajs if t.error][:3]
    assert all(t.reward == 1.0 for t in trajs)
    assert len({t.id for t in trajs}) == n  # one delivery per task, never two
    for i, t in enumerate(trajs):  # a faulted task won with its retry, the others at once
        assert t.id.endswith(".1" if faults[i] else ".0"), (i, t.id)
    assert policy.job_errors == [] and policy.kills == want["kill"]
    assert met["failures/sandbox_lost"] == want["kill"], met
    assert met["failures/sandbox_oom"] == want["oom"], met
    assert met["failures/sandbox_disk"] == want["disk"], met
    assert met["infra_retried"] == sum(want.values()) == met["failed"]
    assert met["finished"] == n and met["running"] == 0
    assert len(made) == n + sum(want.values())  # each retry ran in a sandbox of its own
    assert pool.stats.in_use == 0 and pool.stats.stopped == len(made)
    left = [x for sb in made.values() for x in leftovers(sb)]
    assert not left, left


async def test_warm_pool_is_sized_by_the_admission_rule_and_made_before_episodes_ask():
    """α=1, B=8, groups of 4: at most 4 groups open, 16 episodes at once. The pool makes those 16 before the run
    starts (sized by the manager, not by hand), every episode of the first wave takes a warm one, and the fleet
    never grows beyond the demand while the run goes on. (With ``extra_per_group``, a group's losers still closing
    their env hold their sandbox a moment past the group's end: those are made on demand.)"""
    from .conftest import BUSYBOX, require_backend

    require_backend("bwrap", BUSYBOX)
    from agentrl.sandboxes import SandboxSpec

    spec = SandboxSpec(backend="bwrap", image=BUSYBOX, memory_mb=32, pids=32, ttl_s=300)
    made: dict = {}
    pool = recording_pool(made, max_alive=64, create_rate=200, create_burst=32)
    policy = FleetPolicy(made, steps=1)
    cfg = ManagerConfig(async_ratio=1, num_groups=2, group_size=4, max_concurrency=64,
                        step_timeout_s=120, reset_timeout_s=120)

    def tasks():
        i = 0
        while True:
            i += 1
            yield EpisodeSpec(SHELL, {"pool": pool, "spec": spec}, seed=i, task={"expect": "done"})

    alive_max = 0
    try:
        async with EnvManager(cfg, policy) as m:
            assert await m.warm_sandboxes(pool, spec, wait=True) == 16
            assert pool.fresh_count == 16 and len(made) == 16 and pool.stats.in_use == 0  # before any episode
            m.start(tasks())
            for v in range(3):  # three training steps' batches: episodes end, new groups are admitted
                batch = await asyncio.wait_for(m.next_batch(2), 300)
                assert batch is not None and len(batch) == 2
                alive_max = max(alive_max, pool.stats.in_use + pool.fresh_count)
                policy.current_version = v + 1  # the engine got the new weights
                m.set_version(v + 1)
            await m.stop()
            met = m.metrics()
    finally:
        await pool.close()
    assert met["max_running"] == 16
    assert pool.stats.warm_hits >= 16  # the first wave found its sandboxes ready
    assert pool.stats.peak_in_use <= 16 and alive_max <= 16
    left = [x for sb in made.values() for x in leftovers(sb)]
    assert not left, left


async def test_a_failed_background_watch_wakes_the_waiter_with_its_cause():
    """A hold watch that cannot see its sandbox (here the sandbox object itself fails) sets ``holding`` at once,
    with the error in ``job_errors``, instead of leaving a test to wait out its own timeout blind."""

    class Broken:
        id = "sb-x"

        @property
        def backend(self):
            raise RuntimeError("engine gone")

    policy = FleetPolicy({}, hold_count=3)
    t = asyncio.ensure_future(policy._count_hold(Broken()))
    policy._tasks.add(t)
    t.add_done_callback(policy._job_done)
    await asyncio.wait_for(policy.holding.wait(), 60)
    assert policy.held == 0 and policy.job_errors == ["RuntimeError: engine gone"]


class _Unseen:
    """A sandbox whose processes nobody can see (a bwrap one without a cgroup): a hold watch on it never ends."""

    id, backend, cgroup = "sb-u", "bwrap", None


def _session(policy: FleetPolicy, attempt: int):
    from agentrl.policy import EpisodeMeta

    meta = EpisodeMeta(trajectory_id=f"run-g0.{attempt}", group_id="run-g0", env_id=SHELL, seed=0,
                       task={"fault": "hold"})
    return policy.session(meta)


async def test_a_hold_command_that_returns_unseen_wakes_the_waiter_and_its_watch_ends_with_the_episode():
    """The hold command came back (here: the env's 60 s exec timeout) before the watch saw it running: the hold can
    never be seen now, so ``holding`` is set at once with the episode named, and the episode's end cancels its watch
    (it would poll a sandbox that is gone until its own timeout)."""
    policy = FleetPolicy({"sb-u": _Unseen()}, steps=1, hold_count=2)
    s = _session(policy, 0)
    assert (await s.act([{"content": "sandbox sb-u, ready"}])).text.startswith("sleep 300")
    assert not policy.holding.is_set()
    await s.act([{"content": "timed out after 60 s"}])
    assert policy.holding.is_set() and len(policy.job_errors) == 1
    assert "run-g0.0" in policy.job_errors[0] and "timed out after 60 s" in policy.job_errors[0]
    watch = s.watch
    await s.aclose()
    await asyncio.gather(watch, return_exceptions=True)
    assert watch.cancelled() and len(policy.job_errors) == 1 and not policy._tasks


async def test_a_task_whose_first_attempt_was_lost_before_its_hold_was_seen_holds_in_its_retry(monkeypatch):
    """An unrelated infrastructure failure ended the first attempt before its hold was seen; the manager's retry
    plays the hold in its place (else the waiter is one hold short for ever). Once a task's hold was seen, its later
    attempts run ordinary steps."""
    import agentrl.testing.fleet as fleet

    visible: set[str] = set()
    monkeypatch.setattr(fleet, "running", lambda sb, needle, seen=None: sb.id in visible)

    class Sb:
        backend = "bwrap"

        def __init__(self, i):
            self.id = i

    policy = FleetPolicy({"a": Sb("a"), "b": Sb("b"), "c": Sb("c")}, steps=1, hold_count=1)
    first = _session(policy, 0)
    assert (await first.act([{"content": "sandbox a, ready"}])).text.startswith("sleep 300")
    await first.aclose()  # lost: its sandbox died before the watch saw the hold
    retry = _session(policy, 1)
    assert (await retry.act([{"content": "sandbox b, ready"}])).text.startswith("sleep 300")
    visible.add("b")
    await asyncio.wait_for(policy.holding.wait(), 60)
    assert policy.held == 1 and policy.job_errors == []
    later = _session(policy, 2)
    assert not (await later.act([{"content": "sandbox c, ready"}])).text.startswith("sleep 300")


async def test_a_shell_action_no_sandbox_can_run_is_the_models_error_not_an_infra_failure(busybox_spec):
    """A model's action with a NUL byte (a byte-level tokenizer can sample one) or over the command limit raised out
    of the step; now it is an observation, the episode goes on in the same sandbox, and the next action runs."""
    from agentrl.envs.shell import ShellEnv
    from agentrl.sandboxes import MAX_COMMAND_BYTES

    pool = SandboxPool(max_alive=2)
    env = ShellEnv(pool=pool, spec=busybox_spec, max_turns=4)
    try:
        await env.areset(seed=0)
        sb = env.sandbox
        for action in ("echo a\x00b", "echo " + "x" * MAX_COMMAND_BYTES):
            obs, reward, done, truncated, info = await env.astep(action)
            assert obs[0]["content"].startswith("error: ") and info["invalid_action"], obs
            assert (reward, done, truncated) == (0.0, False, False)
        obs, reward, done, truncated, info = await env.astep("echo done")
        assert env.sandbox is sb and done and reward == 1.0, obs
    finally:
        await env.aclose()
        await pool.close()
