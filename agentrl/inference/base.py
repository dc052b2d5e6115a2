"""The one async interface every inference backend implements (in-process vLLM, remote vLLM servers, fakes).

Token-in/token-out: prompts are token ids, outputs are token ids with the behavior log-probability of each and the
policy (weight) version that produced each. The agent loop never decodes and re-encodes generated tokens.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, TypeVar

T = TypeVar("T")


@dataclass
class SamplingParams:
    """Sampling for one turn. ``max_tokens`` bounds this turn's generated tokens."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    # Keep generating past eos until max_tokens or a stop string (benchmarks that need exact lengths).
    ignore_eos: bool = False
    # Streamed requests (generate_streaming): tokens told at a time after the first, which is told at once (the last
    # batch may be shorter). 1 tells every engine step. Larger cuts the per-step cost of every layer that relays a
    # step (the engine's output objects, the caller's wake-ups, one event per step written and parsed), as vLLM's
    # own --stream-interval does.
    stream_interval: int = 1

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")


FinishReason = Literal["stop", "length", "abort"]


@dataclass
class Generation:
    """The tokens one request generated. Aligned: ``len(token_ids) == len(logprobs) == len(versions)``.

    ``finish_reason == "abort"`` means generation was cut short (a weight update in ``abort`` mode, or
    :meth:`InferenceEngine.abort`); the tokens so far are valid and carry the version that produced them, and
    the caller may resubmit ``prompt + token_ids`` to continue.
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    stop_reason: Any = None  # the stop string or token that ended generation, if any


class InferenceEngine(abc.ABC):
    """An async generator of tokens with versioned weights."""

    @abc.abstractmethod
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None
    ) -> Generation:
        """Generates a continuation of ``prompt_ids``. ``session_id`` (a trajectory id) lets backends with several
        servers route every turn of a trajectory to the same server (prefix-cache reuse)."""

    @abc.abstractmethod
    async def update_weights(self, state_dict: dict[str, Any], version: int) -> int:
        """Pauses generation (per the backend's pause mode), loads ``state_dict`` (name -> tensor, the trainer's
        parameter names), sets the version to ``version`` and resumes. Returns when new requests use the new
        weights, with the bytes one engine loaded."""

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """The weight version new tokens are generated with."""

    async def generate_streaming(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None,
        on_tokens: Callable[[list[int]], None],
    ) -> Generation:
        """:meth:`generate`, telling ``on_tokens(new_ids)`` on the caller's event loop as tokens come out, in order,
        before this returns; the ids told add up to the returned ``token_ids`` (log-probs and versions are read from
        the returned :class:`Generation` only). This default tells the whole generation once it is done; the
        shipped backends override it and tell each step (:class:`~agentrl.inference.vllm_engine.VLLMEngine`,
        :class:`~agentrl.inference.replicas.ReplicatedEngine`, :class:`~agentrl.inference.remote.RemoteEngine`)."""
        gen = await self.generate(prompt_ids, params, request_id=request_id, session_id=session_id)
        if gen.token_ids:
            on_tokens(list(gen.token_ids))
        return gen

    async def abort(self, request_id: str) -> None:
        """Stops one request; its ``generate`` returns with ``finish_reason == "abort"``."""

    def dead(self) -> str | None:
        """Why this engine can generate no more (its process died), or None while it can or may again."""
        return None

    async def close(self) -> None:
        """Shuts the backend down; idempotent."""


class EngineDead(RuntimeError):
    """The engine can generate no more (:meth:`InferenceEngine.dead` says why)."""


async def cancel_when(work: Awaitable[T], stop: Callable[[], BaseException | None], poll_s: float) -> T:
    """Awaits ``work``, asking ``stop()`` every ``poll_s`` seconds meanwhile; once it returns an exception, ``work``
    is cancelled (and awaited) and that exception raised. For conditions nothing signals (an engine core that died,
    a client that hung up)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            exc = stop()
            if exc is not None:
                raise exc
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def unless_dead(engine: InferenceEngine, work: Awaitable[T], poll_s: float = 1.0) -> T:
    """Awaits ``work``; if ``engine`` dies first, cancels it and raises :class:`EngineDead`. Work that only waits
    for episodes would otherwise wait forever: a dead engine fails every episode at once, and the manager replaces
    failed groups with new ones (found in a sync run whose engine core was killed mid-rollout)."""
    return await cancel_when(work, lambda: EngineDead(why) if (why := engine.dead()) else None, poll_s)
