"""SandboxPool against the real backends: concurrency bound, creation rate limit, retries, warm reuse."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from agentrl.sandboxes import SandboxError, SandboxPool, create_sandbox


async def test_pool_bounds_concurrency(busybox_spec):
    pool = SandboxPool(max_alive=2, create_rate=50, create_burst=10)
    live = 0
    peak = 0

    async def episode(i: int) -> str:
        nonlocal live, peak
        async with pool.acquire(busybox_spec) as sb:
            live += 1
            peak = max(peak, live)
            res = await sb.exec(f"sleep 0.3; echo {i}", timeout=20)
            live -= 1
            return res.output.strip()

    outs = await asyncio.gather(*(episode(i) for i in range(5)))
    await pool.close()
    assert outs == [str(i) for i in range(5)]
    assert peak == 2 and pool.stats.peak_in_use == 2
    assert pool.stats.created == 5 and pool.stats.stopped == 5 and pool.stats.in_use == 0


async def test_pool_rate_limits_creation(busybox_spec):
    pool = SandboxPool(max_alive=16, create_rate=4, create_burst=1)
    t0 = time.monotonic()

    async def one() -> None:
        async with pool.acquire(busybox_spec):
            pass

    await asyncio.gather(*(one() for _ in range(5)))
    await pool.close()
    # 1 token at once, then 4 more at 4/s: at least 1 s however fast the backend is
    assert time.monotonic() - t0 >= 0.95


async def test_pool_retries_transient_create_failures(busybox_spec):
    calls = 0

    async def flaky(spec):
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise SandboxError("engine busy (injected)", transient=True)
        return await create_sandbox(spec).start()

    pool = SandboxPool(max_alive=2, backoff_s=0.05, factory=flaky)
    async with pool.acquire(busybox_spec) as sb:
        assert (await sb.exec("echo up", timeout=10)).ok
    assert calls == 3 and pool.stats.retries == 2 and pool.stats.create_failures == 2

    async def broken(spec):
        raise SandboxError("image missing (injected)", transient=False)

    pool2 = SandboxPool(backoff_s=0.01, factory=broken)
    with pytest.raises(SandboxError, match="image missing"):
        async with pool2.acquire(busybox_spec):
            pass
    assert pool2.stats.retries == 0


async def test_pool_gives_up_after_retries_on_a_real_failure(busybox_spec):
    """A real create failure that is not transient (no such image) is raised at once, with a clear message."""
    spec = replace(busybox_spec, image="agentrl-no-such-image:latest", root="/nonexistent-root")
    pool = SandboxPool(backoff_s=0.01)
    with pytest.raises(SandboxError, match="not found|not a directory"):
        async with pool.acquire(spec):
            pass
    assert pool.stats.retries == 0


async def test_pool_warm_reuse_resets_sandbox(busybox_spec):
    async with SandboxPool(max_alive=4, max_warm=2) as pool:
        await pool.prewarm(busybox_spec, 1)
        assert pool.warm_count == 1
        async with pool.acquire(busybox_spec, reuse=True) as sb:
            first_id = sb.id
            await sb.write_file("state.txt", "dirty")
            await sb.exec("echo x > /tmp/t", timeout=10)
        assert pool.stats.reused == 1 and pool.warm_count == 1
        async with pool.acquire(busybox_spec, reuse=True) as sb2:
            assert sb2.id == first_id  # the same sandbox, reset
            res = await sb2.exec("ls -A /workspace /tmp", timeout=10)
            assert "state.txt" not in res.output and "t" not in res.output.split()
        # a plain acquire never hands out a used sandbox
        async with pool.acquire(busybox_spec) as sb3:
            assert sb3.id != first_id
    assert pool.warm_count == 0
    with pytest.raises(SandboxError):
        await sb2.exec("true", timeout=5)  # close() stopped the warm one


async def test_pool_releases_on_cancel(busybox_spec):
    pool = SandboxPool(max_alive=1)
    holder: list = []

    async def hold():
        async with pool.acquire(busybox_spec) as sb:
            holder.append(sb)
            await asyncio.sleep(60)

    task = asyncio.create_task(hold())
    while not holder:
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    end = time.monotonic() + 60
    while holder[0].running and time.monotonic() < end:  # the release finishes in the background
        await asyncio.sleep(0.05)
    assert not holder[0].running
    async with pool.acquire(busybox_spec) as sb:  # the slot is free again
        assert (await sb.exec("true", timeout=10)).ok
    await pool.close()


async def test_max_running_execs_queues_commands_and_times_them_from_their_start(busybox_spec):
    # One slot: a command held in sandbox A keeps B's command waiting for longer than B's own timeout; B then runs
    # whole once A's ends. Without the gate, both run at once (an overcommitted fleet's commands time out instead).
    pool = SandboxPool(max_alive=2, create_rate=50, create_burst=10, max_running_execs=1)
    async with pool.acquire(busybox_spec) as a, pool.acquire(busybox_spec) as b:
        held = asyncio.create_task(a.exec("touch started; while [ ! -e go ]; do sleep 0.05; done; echo A", timeout=60))
        while True:  # until A's command runs (it holds the slot)
            if await _exists(a, "started"):
                break
            await asyncio.sleep(0.05)
        queued = asyncio.create_task(b.exec("echo B", timeout=1.0))
        while pool.exec_gate.waiting < 1:
            await asyncio.sleep(0.01)
        assert pool.exec_gate.running == 1 and not queued.done()
        await asyncio.sleep(1.5)  # longer than B's timeout, all of it spent waiting for the slot
        assert not queued.done()
        await a.write_file("go", "")  # file transfers do not take a slot
        ra, rb = await asyncio.gather(held, queued)
    await pool.close()
    assert (ra.output.strip(), ra.timed_out) == ("A", False)
    assert (rb.output.strip(), rb.timed_out, rb.exit_code) == ("B", False, 0)
    assert rb.duration < 1.0  # its time counts from its start, not from the call
    assert pool.exec_gate.peak_running == 1 and pool.exec_gate.running == 0 and pool.exec_gate.waiting == 0


async def _exists(sb, path: str) -> bool:
    try:
        await sb.read_file(path)
        return True
    except (FileNotFoundError, SandboxError):
        return False


def test_max_running_execs_must_be_a_positive_int():
    with pytest.raises(ValueError, match="max_running_execs"):
        SandboxPool(max_running_execs=0)


async def test_close_waits_for_a_stop_whose_holder_was_cancelled():
    """The env manager gives an env's close 30 s; a docker container's removal at 1,024 containers can take longer,
    so the holder is cancelled while its sandbox is being stopped. The stop goes on (shielded), and ``close`` must
    wait for it: bench_fleet counted 17 of 1,024 containers still present after ``close`` returned."""
    from agentrl.sandboxes import SandboxSpec

    gate, stopping = asyncio.Event(), asyncio.Event()

    class SlowStop:
        def __init__(self, spec):
            self.spec, self.running, self.expires_at, self.stopped = spec, True, None, False

        async def stop(self):
            stopping.set()
            await gate.wait()  # the engine still removing it
            self.stopped, self.running = True, False

        async def dead_reason(self):
            return None

    made = []

    async def factory(spec):
        made.append(SlowStop(spec))
        return made[-1]

    pool = SandboxPool(factory=factory, create_rate=1000, create_burst=1000)

    async def episode() -> None:
        async with pool.acquire(SandboxSpec(backend="bwrap")):
            pass

    holder = asyncio.create_task(episode())
    await stopping.wait()
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    closing = asyncio.create_task(pool.close())
    done, _ = await asyncio.wait([closing], timeout=1.0)  # a close that does not wait returns at once
    assert not done and not made[0].stopped
    gate.set()
    await closing
    assert made[0].stopped and pool.stats.stopped == 1 and pool.guard.count == 0


async def test_max_creating_bounds_creations_in_flight_and_the_rest_wait():
    """A token bucket paces the start of creations, not how many are in flight: an engine slower than the rate
    (docker made 2.7 containers/s at 1,000 live) piles them up until the client's timeout, whose retries leave
    orphan containers behind (1,572 containers for a fleet of 1,024). ``max_creating`` holds the rest in the driver."""
    from agentrl.sandboxes import SandboxSpec

    in_flight, peak, started = 0, 0, asyncio.Queue()

    class Box:
        def __init__(self, spec):
            self.spec, self.running, self.expires_at = spec, True, None

        async def stop(self):
            self.running = False

        async def dead_reason(self):
            return None

    async def factory(spec):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        gate = asyncio.Event()
        started.put_nowait(gate)
        await gate.wait()  # the engine still creating it
        in_flight -= 1
        return Box(spec)

    pool = SandboxPool(factory=factory, create_rate=1000, create_burst=1000, max_creating=2, max_alive=16)
    with pytest.raises(ValueError, match="max_creating"):
        SandboxPool(max_creating=0)

    async def episode() -> None:
        async with pool.acquire(SandboxSpec(backend="docker")):
            pass

    eps = [asyncio.create_task(episode()) for _ in range(6)]
    for _ in range(6):
        gate = await asyncio.wait_for(started.get(), 30)  # the next creation the pool let in
        assert in_flight <= 2
        gate.set()
    await asyncio.gather(*eps)
    await pool.close()
    assert peak == 2 and pool.stats.created == 6


def _engine(monkeypatch):
    """The docker engine's answer, scripted: down until ``up`` is set; ``asked`` once something asked while down."""
    import threading

    from agentrl.sandboxes import docker_engine

    up, asked = threading.Event(), threading.Event()

    def answers(timeout_s: float = 5.0) -> bool:
        if not up.is_set():
            asked.set()
        return up.is_set()

    monkeypatch.setattr(docker_engine, "engine_answers", answers)
    return up, asked


def _creator(factory, stats, **kw):
    from agentrl.sandboxes.guards import HostGuard
    from agentrl.sandboxes.pool import Creator

    args = dict(create_rate=1000, create_burst=100, max_creating=4, retries=2, backoff_s=0.01, engine_wait_s=60.0,
                run=None, factory=factory, guard=HostGuard(), stats=stats)
    return Creator(**{**args, **kw})


async def test_a_create_failing_while_its_engine_is_down_waits_for_the_engine_and_spends_no_retry(monkeypatch):
    """A docker daemon restarting mid-run: the creations that meet it wait for it instead of spending their
    retries in seconds (and their episodes' infra retries after them)."""
    from agentrl.sandboxes import SandboxSpec
    from agentrl.sandboxes.pool import PoolStats

    up, asked = _engine(monkeypatch)
    calls = []

    async def factory(spec):
        calls.append(up.is_set())
        if not up.is_set():
            raise SandboxError("docker engine unreachable (injected)", transient=True, cause="sandbox_engine")
        return object()

    stats = PoolStats()
    creator = _creator(factory, stats)
    made = asyncio.ensure_future(creator.create(SandboxSpec(backend="docker", image="agentrl-busybox:latest")))
    assert await asyncio.to_thread(asked.wait, 30)  # the creator saw the engine down and is waiting for it
    assert not made.done()
    up.set()
    await asyncio.wait_for(made, 30)
    assert calls == [False, True] and stats.retries == 0 and stats.create_failures == 1 and stats.created == 1


async def test_an_engine_gone_for_good_ends_the_wait_at_its_bound_then_the_retries_fail(monkeypatch):
    from agentrl.sandboxes import SandboxSpec
    from agentrl.sandboxes.pool import PoolStats

    _engine(monkeypatch)  # never up

    async def factory(spec):
        raise SandboxError("docker engine unreachable (injected)", transient=True, cause="sandbox_engine")

    stats = PoolStats()
    creator = _creator(factory, stats, engine_wait_s=0.05)
    with pytest.raises(SandboxError, match="unreachable") as e:
        await asyncio.wait_for(creator.create(SandboxSpec(backend="docker", image="agentrl-busybox:latest")), 30)
    assert e.value.failure_cause == "sandbox_engine"
    assert stats.create_failures == 3 and stats.retries == 2  # one wait for the whole create, then its retries
    with pytest.raises(ValueError, match="engine_wait_s must be >= 0"):
        _creator(factory, stats, engine_wait_s=-1)


async def test_a_shielded_stop_that_fails_after_its_caller_was_cancelled_is_logged_not_left_unretrieved(caplog):
    """A daemon restart under 1,024 sandboxes: removals timed out after their holders' close timeouts, and asyncio
    reported "Task exception was never retrieved" for them (the shield drops its hold on a cancelled caller's task)."""
    import gc
    import logging

    from agentrl.sandboxes.pool import Shielded

    unretrieved = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, ctx: unretrieved.append(ctx.get("message")))
    release = asyncio.Event()

    async def stop():
        await release.wait()
        raise SandboxError("remove failed: ReadTimeout (injected)")

    shielded = Shielded()

    async def holder():
        await shielded.run(stop())

    h = asyncio.ensure_future(holder())
    await asyncio.sleep(0)  # the holder is waiting on the stop
    h.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h
    (task,) = shielded._tasks
    with caplog.at_level(logging.WARNING, logger="agentrl.sandboxes"):
        release.set()
        await asyncio.wait([task])  # ended, its exception not asked for
        await asyncio.sleep(0)  # its done callbacks ran
        del h, task
        gc.collect()
        await shielded.drain()
    loop.set_exception_handler(None)
    assert unretrieved == []
    assert any("remove failed" in r.getMessage() for r in caplog.records), caplog.records


def test_a_watcher_left_by_a_closed_event_loop_does_not_say_the_engine_is_down(monkeypatch):
    """The engine watcher is per event loop: one left pending by a loop closed under it (a test's, a run's) must not
    answer for the next loop."""
    import time as _time

    from agentrl.sandboxes import faults

    up, _ = _engine(monkeypatch)
    old = asyncio.new_event_loop()
    try:
        async def start_watch():
            asyncio.ensure_future(faults.engine_back("docker", _time.monotonic() + 600))
            await asyncio.sleep(0.05)  # the watcher is polling the (down) engine

        old.run_until_complete(start_watch())
    finally:
        old.close()  # closed with the watcher still pending
    up.set()
    assert asyncio.run(faults.engine_down("docker")) is False  # asked the engine: it answers
    assert asyncio.run(faults.engine_back("docker", _time.monotonic() + 5)) is True
