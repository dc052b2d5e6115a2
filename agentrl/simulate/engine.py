"""The simulated inference engine: continuous batching on replicas, costed by :class:`EngineModel`.

A request goes to the replica with the fewest running requests (the real replica router's rule) and holds one of
its ``max_num_seqs`` slots (beyond them it queues, as vLLM's scheduler does). It pays ``request_s`` once (scheduling,
detokenising, the HTTP round trip on a server), then its prefill: ``prefill_s_per_token`` x the tokens not already
in the prefix cache (a multi-turn episode re-sends its whole context; only the new tokens are computed), serialised
per replica because prefill is compute-bound. It then decodes in steps whose duration is
``decode_step_s + decode_step_s_per_seq x running + decode_step_s_per_ktoken x (context tokens of the running
batch) / 1000``: a fixed cost (reading the weights), a per-sequence cost (the batch's matmuls and sampling) and the
KV-cache read, which grows with every sequence's context. ``chunk`` steps are simulated at once (the batch is re-read
between chunks), so a run costs O(tokens / chunk) events.

A weight update pauses every replica for ``sync_s`` (requests keep their place and resume, like vLLM's
``pause_generation(mode="keep")``); tokens carry the version of the weights their chunk started with. While the
trainer runs on the same devices (``pause``) the engine stops, or (``slowdown``) every engine step costs
``slowdown_while_training`` times more: shared CPU cores, or co-located GPUs.

Invariant: the engine's busy time (some request of a replica in prefill or decode) is measured per replica; the
utilisation reported is the mean over replicas.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any


@dataclass
class EngineModel:
    """Continuous-batching cost parameters, in seconds (module docstring); :mod:`agentrl.simulate.presets` derives
    them for a named GPU and model from published vLLM figures."""

    replicas: int = 1
    max_num_seqs: int = 256
    request_s: float = 0.0
    prefill_s_per_token: float = 0.0
    decode_step_s: float = 0.02
    decode_step_s_per_seq: float = 0.0
    decode_step_s_per_ktoken: float = 0.0
    sync_s: float = 0.0
    slowdown_while_training: float = 1.0
    prefix_cache: bool = True
    chunk: int = 16

    def validate(self) -> None:
        for name in ("replicas", "max_num_seqs", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_s", "prefill_s_per_token", "decode_step_s", "decode_step_s_per_seq",
                     "decode_step_s_per_ktoken", "sync_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"engine.{name} must be >= 0, got {getattr(self, name)}")
        if self.slowdown_while_training < 1:
            raise ValueError(f"engine.slowdown_while_training must be >= 1, got {self.slowdown_while_training}")


class _Replica:
    def __init__(self, slots: int) -> None:
        self.running = 0
        self.context = 0  # tokens of the running requests' contexts (their KV caches)
        self.busy_s = 0.0
        self.area = 0.0  # integral of running requests over time (mean batch = area / wall)
        self._since: float | None = None
        self._last = 0.0
        self.slots = asyncio.Semaphore(slots)
        self.prefill = asyncio.Lock()

    def track(self, d: int, now: float) -> None:
        self.area += self.running * (now - self._last)
        self._last = now
        if self.running == 0 and d > 0:
            self._since = now
        self.running += d
        if self.running == 0 and self._since is not None:
            self.busy_s += now - self._since
            self._since = None

    def busy_until(self, now: float) -> float:
        return self.busy_s + (now - self._since if self._since is not None else 0.0)


class SimEngine:
    """See :class:`EngineModel`. ``version`` moves with :meth:`update_weights`, as a real engine's does."""

    def __init__(self, model: EngineModel) -> None:
        self.model, self._version = model, 0
        self.replicas = [_Replica(model.max_num_seqs) for _ in range(model.replicas)]
        self.training = False  # set by a trainer that shares the engine's devices
        self.requests = 0
        self.episodes = 0  # policy sessions open (episodes in flight), counted by SimPolicy
        self._pauses = 0
        self._resumed = asyncio.Event()
        self._resumed.set()

    @property
    def version(self) -> int:
        return self._version

    @property
    def running(self) -> int:
        return sum(r.running for r in self.replicas)

    def busy_s(self, now: float) -> float:
        """Mean busy seconds of the replicas up to ``now``."""
        return sum(r.busy_until(now) for r in self.replicas) / len(self.replicas)

    def mean_batch(self, now: float) -> float:
        """Requests running on a replica, averaged over the replicas and the time up to ``now``."""
        area = sum(r.area + r.running * (now - r._last) for r in self.replicas)
        return area / len(self.replicas) / now if now > 0 else 0.0

    def pause(self) -> None:
        self._pauses += 1
        self._resumed.clear()

    def resume(self) -> None:
        self._pauses -= 1
        if self._pauses == 0:
            self._resumed.set()

    async def _cost(self, seconds: float) -> None:
        await self._resumed.wait()
        if self.training:
            seconds *= self.model.slowdown_while_training
        await asyncio.sleep(seconds)

    async def generate_tokens(self, prompt_tokens: int, new_tokens: int, cached_tokens: int = 0) -> list[int]:
        """Waits what ``new_tokens`` cost after a ``prompt_tokens`` prompt (of which ``cached_tokens`` are in the
        prefix cache); returns each token's version."""
        m = self.model
        loop = asyncio.get_running_loop()
        self.requests += 1
        await self._resumed.wait()
        rep = min(self.replicas, key=lambda r: r.running)
        async with rep.slots:
            rep.track(+1, loop.time())
            context = prompt_tokens
            rep.context += context
            try:
                new = prompt_tokens - (cached_tokens if m.prefix_cache else 0)
                async with rep.prefill:
                    await self._cost(m.request_s + max(0, new) * m.prefill_s_per_token)
                versions: list[int] = []
                while len(versions) < new_tokens:
                    k = min(m.chunk, new_tokens - len(versions))
                    step = (m.decode_step_s + m.decode_step_s_per_seq * rep.running
                            + m.decode_step_s_per_ktoken * rep.context / 1000)
                    await self._cost(k * step)
                    versions += [self._version] * k  # a chunk is sampled by the weights it started with
                    context += k
                    rep.context += k
                return versions
            finally:
                rep.context -= context
                rep.track(-1, loop.time())

    async def update_weights(self, state_dict: Any, version: int) -> int:
        self.pause()
        try:
            await asyncio.sleep(self.model.sync_s)
        finally:
            self._version = version
            self.resume()
        return 0
