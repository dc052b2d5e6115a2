"""Watching a real in-process engine's requests from a test.

A test that acts on a request mid-generation (abort it, cancel its caller, update the weights under it) must know
the request is mid-generation when it acts: sleeping a fixed time and hoping races the machine's speed (a fast
machine finishes the request first, a loaded one has produced no token yet). :class:`TokenProbe` tells the test the
moment the request's first tokens come out of the engine, so it acts with the whole rest of the request
(thousands of tokens) still to generate.

It wraps the :class:`~agentrl.inference.vllm_engine.VLLMEngine`'s ``AsyncLLM.generate`` (which runs on the engine's
own loop thread) for the ``with`` block and wakes the test's loop thread-safely.
"""

from __future__ import annotations

import asyncio
from typing import Any


class TokenProbe:
    """``with TokenProbe(engine, request_id) as probe: ...; await probe.wait()`` returns once the request (any
    request when ``request_id`` is None; its id starts with it when ``prefix``) has produced ``at_least`` tokens.
    Use inside the test's event loop."""

    def __init__(self, engine: Any, request_id: str | None = None, at_least: int = 1, prefix: bool = False):
        self.engine, self.request_id, self.at_least, self.prefix = engine, request_id, at_least, prefix
        self._event: asyncio.Event | None = None
        self._orig: Any = None

    def _matches(self, rid: str) -> bool:
        if self.request_id is None:
            return True
        return rid.startswith(self.request_id) if self.prefix else rid == self.request_id

    def __enter__(self) -> "TokenProbe":
        loop = asyncio.get_running_loop()
        self._event = event = asyncio.Event()
        llm = self.engine._llm
        self._orig = orig = llm.generate
        probe = self

        def generate(prompt: Any, params: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
            stream = orig(prompt, params, request_id, *args, **kwargs)
            if not probe._matches(request_id):
                return stream

            async def watched() -> Any:
                n = 0
                async for out in stream:
                    n += len(out.outputs[0].token_ids)
                    if n >= probe.at_least and not event.is_set():
                        loop.call_soon_threadsafe(event.set)
                    yield out

            return watched()

        llm.generate = generate
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.engine._llm.generate  # the class's method again

    async def wait(self, timeout: float = 120.0) -> None:
        """Returns once the tokens came out; raises TimeoutError after ``timeout`` seconds."""
        assert self._event is not None, "use TokenProbe as a context manager"
        await asyncio.wait_for(self._event.wait(), timeout)


# ---- engine replicas (Ray actors): run inside the actor with ``actor.__ray_call__.remote(fn, ...)`` -------------
def count_replica_tokens(replica: Any) -> None:
    """Makes an :class:`~agentrl.inference.replica_actor.EngineReplica` count every request's tokens as they come out
    of its engine (read them with :func:`replica_tokens`). Idempotent."""
    llm = replica.engine._llm
    if "generate" in vars(llm):
        return
    seen: dict[str, int] = replica.__dict__.setdefault("probe_tokens", {})
    orig = llm.generate

    def generate(prompt: Any, params: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        stream = orig(prompt, params, request_id, *args, **kwargs)

        async def watched() -> Any:
            async for out in stream:
                seen[request_id] = seen.get(request_id, 0) + len(out.outputs[0].token_ids)
                yield out

        return watched()

    llm.generate = generate


def replica_tokens(replica: Any, request_id: str) -> int:
    """The tokens ``request_id`` has produced on this replica so far (:func:`count_replica_tokens` first)."""
    return replica.__dict__.get("probe_tokens", {}).get(request_id, 0)


def replica_requests(replica: Any) -> int:
    """The requests this replica's engine holds now: added and not finished (queued, paused or running)."""
    return replica.engine._llm.output_processor.get_num_unfinished_requests()
