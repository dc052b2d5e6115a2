"""One completion across weight updates: the abort-and-resubmit rule shared by the agent loop and the gateway.

A weight update in ``pause_mode: abort`` ends the requests in flight with ``finish_reason == "abort"`` and the
tokens sampled so far. :func:`generate_resubmitting` sends the request again with ``prompt + tokens so far`` for the
remaining budget, until the completion finishes for another reason, the caller is closed, or ``max_resubmits`` is
spent. Every token keeps the log-prob and version of the request that sampled it, so a completion may span several
versions. Each piece is checked before it is kept: as many log-probs and versions as tokens, every version set,
every log-prob finite (a non-finite one never enters a trajectory).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Callable

from agentrl.inference.base import Generation, InferenceEngine, SamplingParams


def derive_seed(base: int | None, *parts: Any) -> int | None:
    """A per-request seed from a base seed and the request's identity (None stays None: unseeded)."""
    if base is None:
        return None
    return zlib.crc32(repr((base,) + parts).encode()) & 0x7FFFFFFF


class ResubmitError(RuntimeError):
    """A completion was aborted more than ``max_resubmits`` times."""


class BadGeneration(ValueError):
    """The engine returned tokens that cannot be recorded: misaligned, unversioned, or with a non-finite log-prob."""


async def generate_resubmitting(
    engine: InferenceEngine,
    prompt: list[int],
    params: SamplingParams,
    *,
    request_id: Callable[[int], str],
    session_id: str | None,
    max_resubmits: int,
    seed: Callable[[int], int | None] | None = None,
    closed: Callable[[], bool] = lambda: False,
    on_request: Callable[[str | None], None] = lambda rid: None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> tuple[Generation, int]:
    """Returns the completion of ``prompt`` (at most ``params.max_tokens`` tokens) and the number of resubmits.

    ``request_id(attempt)`` and ``seed(attempt)`` name and seed each attempt (``seed`` None keeps
    ``params.seed``); ``on_request(rid)`` is told the request in flight (None once none is), so that the caller
    can abort it when it closes; ``closed()`` true stops resubmitting (the aborted completion is returned).
    ``on_tokens``: told each attempt's new ids as the engine produces them
    (:meth:`~agentrl.inference.base.InferenceEngine.generate_streaming`); across a resubmit they continue where the
    aborted attempt stopped, so the ids told are the completion's, in order. A piece that fails its checks has been
    told already: the caller reports the error after what it streamed."""
    out = Generation(token_ids=[], logprobs=[], versions=[], finish_reason="length")
    for attempt in range(max_resubmits + 1):
        remaining = params.max_tokens - len(out.token_ids)
        if remaining <= 0:
            out.finish_reason = "length"
            return out, attempt
        p = dataclasses.replace(params, max_tokens=remaining,
                                seed=params.seed if seed is None else seed(attempt))
        rid = request_id(attempt)
        on_request(rid)
        try:
            if on_tokens is None:
                gen = await engine.generate(prompt + out.token_ids, p, request_id=rid, session_id=session_id)
            else:
                gen = await engine.generate_streaming(prompt + out.token_ids, p, request_id=rid,
                                                      session_id=session_id, on_tokens=on_tokens)
        finally:
            on_request(None)
        n = len(gen.token_ids)
        if len(gen.logprobs) != n or len(gen.versions) != n or any(v < 0 for v in gen.versions):
            raise BadGeneration(f"request {rid}: the engine returned a misaligned or unversioned generation ({n} "
                                f"tokens, {len(gen.logprobs)} logprobs, versions {gen.versions!r:.100})")
        if not all(math.isfinite(x) for x in gen.logprobs):
            # e.g. a CPU engine forced past the model's positions samples token 0 with a NaN log-prob
            raise BadGeneration(f"request {rid}: the engine returned a non-finite log-prob "
                                f"({[x for x in gen.logprobs if not math.isfinite(x)][:3]}): such a token cannot be "
                                f"trained on")
        out.token_ids += gen.token_ids
        out.logprobs += gen.logprobs
        out.versions += gen.versions
        out.finish_reason, out.stop_reason = gen.finish_reason, gen.stop_reason
        if gen.finish_reason != "abort" or closed():
            return out, attempt
    raise ResubmitError(f"request {request_id(max_resubmits)}: aborted {max_resubmits + 1} times "
                        f"(max_resubmits={max_resubmits})")
