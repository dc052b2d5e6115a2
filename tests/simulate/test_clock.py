"""The virtual clock: exact timelines, known by hand, in no wall time."""

from __future__ import annotations

import asyncio
import time

from agentrl.simulate import VirtualTimeLoop, run_virtual


def test_a_scripted_timeline_is_exact_and_takes_no_wall_time():
    log: list[tuple[float, str]] = []

    async def worker(name: str, delays: list[float]) -> None:
        loop = asyncio.get_running_loop()
        for d in delays:
            await asyncio.sleep(d)
            log.append((loop.time(), name))

    async def main() -> str:
        loop = asyncio.get_running_loop()
        a = asyncio.create_task(worker("a", [1.0, 2.5]))      # at 1.0 and 3.5
        b = asyncio.create_task(worker("b", [2.5]))           # at 2.5
        await asyncio.sleep(2.5)
        c = asyncio.create_task(worker("c", [0.5, 3600.0]))  # started at 2.5: at 3.0 and 3603.0
        try:
            await asyncio.wait_for(asyncio.Event().wait(), timeout=10.0)  # a timeout is a timer too: at 12.5
        except asyncio.TimeoutError:
            log.append((loop.time(), "timeout"))
        await asyncio.gather(a, b, c)
        return "done"

    t0 = time.perf_counter()
    result, took = run_virtual(main(), start=100.0)
    assert result == "done" and took == 3603.0
    assert log == [(101.0, "a"), (102.5, "b"), (103.0, "c"), (103.5, "a"), (112.5, "timeout"), (3703.0, "c")]
    assert time.perf_counter() - t0 < 5  # an hour of virtual time


def test_real_io_and_threads_still_work_on_virtual_time():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        before = loop.time()
        value = await asyncio.to_thread(lambda: 42)  # a thread wakes the loop through real I/O
        assert value == 42 and loop.time() == before  # no timer was due: the clock did not move
        await asyncio.sleep(7.0)
        return loop.time()

    t, took = run_virtual(main())
    assert t == 7.0 and took == 7.0


def test_the_same_program_makes_the_same_decisions_on_both_clocks():
    """Zero-cost scheduling (every sleep 0) is decided by event order alone: a real loop and the virtual one agree."""
    async def scheduler() -> list[int]:
        order: list[int] = []
        q: asyncio.Queue[int] = asyncio.Queue()

        async def job(i: int) -> None:
            for _ in range(i % 3 + 1):
                await asyncio.sleep(0)
            await q.put(i)

        tasks = [asyncio.create_task(job(i)) for i in range(12)]
        for _ in tasks:
            order.append(await q.get())
        return order

    real = asyncio.new_event_loop()
    try:
        expected = real.run_until_complete(scheduler())
    finally:
        real.close()
    got, took = run_virtual(scheduler())
    assert got == expected and took == 0.0
    loop = VirtualTimeLoop()
    assert isinstance(loop, asyncio.AbstractEventLoop) and loop.time() == 0.0
    loop.close()
