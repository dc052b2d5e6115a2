"""How the training controller gets each step's batch and hands it to the trainer.

Batch sources (``next_batch(n, steps_left, on_group)`` returns the step's ``n`` groups, ``steps_left`` steps before
the end of the run, calling ``on_group(g)`` for each as it is taken):

- :class:`ContinuousBatches`, the plain controller: the manager's continuous run (``EnvManager.start``) under the
  admission rule of ``async_ratio`` (:mod:`agentrl.manager.admission`). With a streamed trainer the groups are
  taken one at a time (``next_batch(1, batch=n, taken=k)``, earliest deadline first), so the trainer sees each as
  soon as it finishes; deadlines are still planned with the step's capacity of ``n`` groups, so a streamed step
  waits for exactly the stragglers the whole-batch step would wait for.
- :class:`agentrl.controller.tail.TailRounds`: tail batching's short and long rounds (``async_ratio: 0`` only).

Trainer feeds: plain ``train_step(groups)`` once the batch is complete, or :class:`StreamedStep` (``streaming:
true``, AsyncFlow's streaming data path): ``start_step`` before the rollout, ``accumulate([group])`` for each group
as it arrives (queued on the trainer actor while rollout goes on, so the backward passes overlap the rollout's
tail), ``finish_step`` once the batch is complete. The update equals the whole-batch ``train_step`` (see
:meth:`agentrl.trainer.trainer.Trainer.start_step`: one mini-batch, one epoch), so streaming changes when the
trainer computes, never what it computes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from agentrl.trajectory import Group

OnGroup = Callable[[Group], Awaitable[None] | None]


class ContinuousBatches:
    """The manager's continuous run (see the module docstring). ``source`` is the manager's task source."""

    def __init__(self, manager: Any, source: Callable[[], Any]):
        self.mgr, self.source = manager, source
        self.last: dict[str, float] = {}

    def start(self) -> None:
        self.mgr.start(self.source)

    async def next_batch(self, n: int, steps_left: int = 1, on_group: OnGroup | None = None) -> list[Group]:
        """Returns the ``n`` groups of the current version (fewer only when the run ended)."""
        if on_group is None:
            return await self.mgr.next_batch(n) or []
        out: list[Group] = []
        while len(out) < n:
            got = await self.mgr.next_batch(1, batch=n, taken=len(out))
            if not got:
                break
            out += got
            r = on_group(got[0])
            if r is not None:
                await r
        return out


async def _wait(x: Any) -> Any:
    return await x  # a Ray ObjectRef or a coroutine


class StreamedStep:
    """Feeds one step's groups to the trainer actor as they arrive (see the module docstring).

    ``feed`` only queues the call (Ray runs an actor's calls from one caller in order), so the rollout never waits
    for the trainer; :meth:`finish` waits for the queued calls and steps the optimizer."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self._calls: list[asyncio.Future] = []
        self._open = False

    async def start(self) -> None:
        await self.trainer.start_step.remote()
        self._calls, self._open = [], True

    def feed(self, group: Group) -> None:
        self._calls.append(asyncio.ensure_future(_wait(self.trainer.accumulate.remote([group]))))

    async def finish(self) -> tuple[dict[str, float], float]:
        """Returns the step's metrics (those of ``train_step``, plus ``stream/accumulate_calls`` and
        ``stream/overlap_s``: trainer seconds spent before the batch was complete) and the trainer's busy seconds
        (accumulate calls plus ``finish_step``)."""
        t0 = time.perf_counter()
        done = [c for c in self._calls if c.done()]
        accs = await asyncio.gather(*self._calls)
        t1 = time.perf_counter()
        metrics = await self.trainer.finish_step.remote()
        self._open = False
        acc_s = sum(float(a.get("accumulate/s", 0.0)) for a in accs)
        # accumulate calls still queued when the batch completed ran after it: their time is not overlap
        overlap = sum(float(a.get("accumulate/s", 0.0)) for a, c in zip(accs, self._calls) if c in done)
        metrics = {**metrics, "stream/accumulate_calls": float(len(accs)), "stream/overlap_s": overlap,
                   "stream/tail_wait_s": t1 - t0}
        return metrics, acc_s + (time.perf_counter() - t1)

    async def abort(self) -> None:
        """Drops the open step (after a failed rollout); the trainer's weights stay."""
        if not self._open:
            return
        await asyncio.gather(*self._calls, return_exceptions=True)
        await self.trainer.abort_step.remote()
        self._open = False
