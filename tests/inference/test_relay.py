"""The engine thread's hand-over to callers' loops (agentrl.inference.relay): order, one wake-up per batch,
failures kept to their own call, results and cancellation."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from agentrl.inference.relay import Relay, Relays, settle


async def test_calls_queued_while_the_loop_is_busy_run_in_order_after_one_wake_up():
    loop = asyncio.get_running_loop()
    relay, seen, wakes = Relay(loop), [], []
    orig = loop.call_soon_threadsafe

    def counting(cb, *args, **kw):
        wakes.append(cb)
        return orig(cb, *args, **kw)

    loop.call_soon_threadsafe = counting
    try:
        def producer():
            for i in range(100):
                relay.call(seen.append, i)

        # the loop is held inside this callback (no await) while another thread queues 100 calls
        t = threading.Thread(target=producer)
        t.start()
        t.join()
        assert seen == [] and len(wakes) == 1
        done = loop.create_future()
        relay.call(done.set_result, None)  # queued behind the 100 (no second wake-up): runs after them
        await done
    finally:
        loop.call_soon_threadsafe = orig
    assert seen == list(range(100)) and len(wakes) == 1


async def test_a_failing_call_is_reported_and_the_calls_behind_it_still_run():
    loop = asyncio.get_running_loop()
    reported, seen = [], []
    loop.set_exception_handler(lambda lp, ctx: reported.append(ctx["exception"]))
    try:
        relay = Relay(loop)
        done = loop.create_future()

        def boom(_):
            raise KeyError("boom")

        relay.call(seen.append, 1)
        relay.call(boom, None)
        relay.call(seen.append, 2)
        relay.call(done.set_result, None)
        await done
    finally:
        loop.set_exception_handler(None)
    assert seen == [1, 2] and [type(e) for e in reported] == [KeyError]


async def test_settle_gives_results_errors_and_cancellation_and_leaves_a_done_future_alone():
    loop = asyncio.get_running_loop()
    a, b, c, d = (loop.create_future() for _ in range(4))
    settle((a, 7, None))
    settle((b, None, ValueError("bad")))
    settle((c, None, asyncio.CancelledError()))
    d.cancel()
    settle((d, 1, None))  # its caller gave up: nothing to set, no InvalidStateError
    assert a.result() == 7 and isinstance(b.exception(), ValueError) and c.cancelled() and d.cancelled()


def test_a_closed_loop_refuses_the_call_and_a_relay_does_not_keep_its_loop_alive():
    relays = Relays()
    loop = asyncio.new_event_loop()
    relay = relays.for_loop(loop)
    assert relays.for_loop(loop) is relay
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        relay.call(print, "x")
    with pytest.raises(RuntimeError, match="closed"):  # still refused: the failed call did not stay queued
        relay.call(print, "y")
    del loop, relay
    gc.collect()
    assert len(relays._by_loop) == 0


async def test_run_on_another_threads_loop_returns_raises_and_cancels_there():
    other = asyncio.new_event_loop()
    t = threading.Thread(target=other.run_forever, daemon=True)
    t.start()
    relays, started, cancelled = Relays(), threading.Event(), threading.Event()

    async def answer(x):
        assert asyncio.get_running_loop() is other
        return x * 2

    async def fail():
        raise ValueError("engine side")

    async def forever():
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        assert await relays.run(answer(21), other) == 42
        with pytest.raises(ValueError, match="engine side"):
            await relays.run(fail(), other)
        task = asyncio.ensure_future(relays.run(forever(), other))
        await asyncio.to_thread(started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(cancelled.wait, 30)
    finally:
        other.call_soon_threadsafe(other.stop)
        t.join(30)
        other.close()
