"""The warm pool: fresh sandboxes made before episodes ask for them, handed out on acquire, replaced in the
background through the pool's creation bucket, never handed out twice unless reset. Real backends (16 bwrap,
4 docker) and, for the pacing, a fake factory."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.sandboxes import SandboxError, SandboxPool

COUNT = {"bwrap": 16, "docker": 4}


async def test_warm_pool_hands_out_fresh_sandboxes_and_refills(busybox_spec):
    n = COUNT[busybox_spec.backend]
    async with SandboxPool(max_alive=n, create_rate=50, create_burst=n) as pool:
        await pool.keep_warm(busybox_spec, n, wait=True)
        assert pool.fresh_count == n and pool.stats.created == n
        used: set[str] = set()
        gate = asyncio.Event()
        entered = 0

        async def episode(i: int) -> None:
            nonlocal entered
            async with pool.acquire(busybox_spec) as sb:
                used.add(sb.id)
                entered += 1
                if entered == n:
                    gate.set()
                await gate.wait()  # all n held at once: every one came from the warm pool
                await sb.write_file("mark.txt", str(i))
                assert (await sb.exec("cat mark.txt", timeout=30)).output == str(i)

        await asyncio.gather(*(episode(i) for i in range(n)))
        assert pool.stats.warm_hits == n and len(used) == n
        # released ones were stopped (not kept); the refill made n new ones in the background
        await pool.keep_warm(busybox_spec, n, wait=True)
        assert pool.fresh_count == n and pool.stats.created == 2 * n
        async with pool.acquire(busybox_spec) as sb:
            assert sb.id not in used
            assert "mark.txt" not in (await sb.exec("ls -A /workspace", timeout=30)).output
        assert pool.stats.stopped >= n + 1
    assert pool.fresh_count == 0 and pool.stats.stopped == pool.stats.created


async def test_released_sandbox_is_only_reused_after_reset(busybox_spec):
    async with SandboxPool(max_alive=2, max_warm=2) as pool:
        await pool.keep_warm(busybox_spec, 1, wait=True)
        async with pool.acquire(busybox_spec) as sb:
            first = sb
            await sb.write_file("dirty.txt", "x")
        assert not first.running  # plain acquire: stopped on release, never handed out again
        async with pool.acquire(busybox_spec, reuse=True) as sb:
            second = sb
            assert sb.id != first.id
            await sb.write_file("dirty.txt", "y")
        assert second.running and pool.warm_count == 1  # reuse=True: reset and kept
        await pool.keep_warm(busybox_spec, 0)
        async with pool.acquire(busybox_spec, reuse=True) as sb:
            assert sb.id == second.id
            assert "dirty.txt" not in (await sb.exec("ls -A /workspace", timeout=30)).output
    with pytest.raises(SandboxError):
        await second.exec("true", timeout=5)


class Fake:
    def __init__(self, spec):
        self.spec, self.running, self.expires_at, self.id = spec, True, None, f"fake{id(self):x}"

    async def stop(self):
        self.running = False

    async def dead_reason(self):
        return None


async def test_rate_limit_is_backpressure_not_a_timeout():
    """More acquirers than the bucket allows at once, and a refill competing for the same tokens: every caller
    waits for its token and gets a sandbox; creations are paced at the bucket's rate."""
    from agentrl.sandboxes import SandboxSpec

    spec = SandboxSpec(backend="bwrap", memory_mb=16, pids=16)
    made: list[float] = []

    async def factory(s):
        made.append(time.monotonic())
        return Fake(s)

    rate = 40.0
    pool = SandboxPool(max_alive=64, create_rate=rate, create_burst=1, factory=factory)
    await pool.keep_warm(spec, 5)
    got = []

    async def one():
        async with pool.acquire(spec) as sb:
            got.append(sb)

    await asyncio.gather(*(one() for _ in range(30)))
    await pool.keep_warm(spec, 5, wait=True)
    await pool.close()
    assert len(got) == 30 and len({sb.id for sb in got}) == 30
    assert len(made) >= 35
    span = made[-1] - made[0]
    assert span >= (len(made) - 1) / rate * 0.9  # paced by the bucket, never all at once
    assert all(not sb.running for sb in got) and pool.stats.stopped == pool.stats.created


async def test_a_fleet_target_never_makes_more_than_the_fleet_while_an_acquire_checks_a_fresh_one():
    """A fresh sandbox being checked by an acquire (popped from the pool, not handed out yet) still counts toward a
    fleet target: the refill that the acquire wakes must not make a replacement for it. The check is held open
    until the refill loop has run, so the race happens every time."""
    from agentrl.sandboxes import SandboxSpec

    spec = SandboxSpec(backend="bwrap", memory_mb=16, pids=16)
    checking, release = asyncio.Event(), asyncio.Event()

    class Held(Fake):
        async def dead_reason(self):
            checking.set()
            await release.wait()
            return None

    async def factory(s):
        return Held(s)

    pool = SandboxPool(max_alive=16, create_rate=1000, create_burst=16, factory=factory)
    await pool.keep_warm(spec, 2, wait=True, fleet=True)
    assert pool.stats.created == 2

    async def one():
        async with pool.acquire(spec) as sb:
            return sb

    task = asyncio.create_task(one())
    await checking.wait()  # the acquire has popped a fresh one and is checking it; the refill was woken
    for _ in range(20):  # let the refill loop run to the end of whatever it decides now
        await asyncio.sleep(0)
    created_meanwhile = pool.stats.created
    release.set()
    await task
    await pool.close()
    assert created_meanwhile == 2, "the refill made a sandbox for one already taken by the fleet's acquire"
