"""The gateway's live sessions: bounded in number, ended into trajectories that are never lost, and counted.

A session is created on its first request (or by :meth:`agentrl.gateway.Gateway.open_session` for a training
episode) while fewer than ``max_sessions`` are live; it ends by :meth:`SessionStore.end` (a reward: its trajectory
goes to the sink, e.g. ``GatewayConfig.out``), by :meth:`SessionStore.discard` (its owner, the harness episode, took
the tokens itself), or by idling past ``session_idle_s`` (ended as ``truncated``, reward 0, into the sink). Ending a
session aborts its engine requests in flight. The counters behind ``gateway/drift_rate``,
``gateway/segments_per_session`` and ``tool/parse_error_rate`` are cumulative since the gateway started.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from agentrl.chat import ChatRenderer
from agentrl.gateway.config import GatewayConfig
from agentrl.gateway.protocol import APIError
from agentrl.gateway.sessions import Completion, Session, SessionContext
from agentrl.inference.base import InferenceEngine
from agentrl.trajectory import Trajectory

# Requests up to this size (body and session text) are rendered on the event loop when the worker is idle: rendering
# and tokenizing 4 KiB of chat took ~1.5 ms with the tiny model's tokenizer (a drift re-encodes it all), a stall that
# other clients can bear.
INLINE_BYTES = 4096


class SessionStore:
    """The live sessions (bounded by ``max_sessions``) and the gateway's counters.

    ``sink``: called with each ended session's :class:`Trajectory` (e.g. appended to ``GatewayConfig.out``)."""

    def __init__(self, renderer: ChatRenderer, engine: InferenceEngine, cfg: GatewayConfig,
                 sink: Callable[[Trajectory], None] | None = None):
        self.renderer, self.engine, self.cfg, self.sink = renderer, engine, cfg, sink
        engine_len = getattr(engine, "max_model_len", None)
        self.max_model_len: int = int(engine_len or 1 << 30)
        self.max_tokens = min(cfg.max_tokens or self.max_model_len, self.max_model_len)
        self.vocab_size = len(getattr(renderer.tokenizer, "get_vocab", dict)()) or 0
        self.context = SessionContext(renderer, engine, cfg, self.max_model_len, self.max_tokens, self.vocab_size,
                                      self.offload)
        self.sessions: dict[str, Session] = {}
        self.counts: dict[str, int] = {"requests": 0, "drift_candidates": 0, "drifts": 0, "choices": 0,
                                       "parse_errors": 0, "tool_calls": 0, "sampled_tokens": 0, "prompt_tokens": 0,
                                       "sessions_started": 0, "sessions_ended": 0, "segments_ended": 0,
                                       "sessions_expired": 0}
        self._pool: ThreadPoolExecutor | None = None
        self._running: list[Future] = []  # renders handed to the worker thread (done or not)

    async def offload(self, fn: Callable[..., Any], *args: Any, size: int | None = None) -> Any:
        """Runs ``fn(*args)`` (rendering and tokenizing a prompt: seconds for a megabyte message) in the store's
        worker thread, so the event loop keeps serving every other client; raises :class:`APIError` 503 when it
        takes over ``render_timeout_s`` (the thread finishes its work, the request no longer waits for it). One
        thread: the tokenizer is not shared between threads, and one huge request cannot take every core.

        A request whose ``size`` (its body and the session's recorded text; ``None``: unknown, so large) is at most
        :data:`INLINE_BYTES` runs on the loop instead while the worker has nothing in flight: its render costs less than
        the thread hop (the hop's futures, wake-up and GIL hand-over were ~0.1 ms of CPU per request, a tenth of the
        gateway's own cost), and the tokenizer is still never used by two threads at once."""
        if size is not None and size <= INLINE_BYTES and all(f.done() for f in self._running):
            return fn(*args)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentrl-gateway-render")
        work = self._pool.submit(fn, *args)
        self._running = [f for f in self._running if not f.done()] + [work]
        try:
            return await asyncio.wait_for(asyncio.wrap_future(work), self.cfg.render_timeout_s)
        except asyncio.TimeoutError:
            raise APIError(503, f"rendering and tokenizing the prompt took over render_timeout_s="
                                f"{self.cfg.render_timeout_s}s (a very large request, or a busy server); retry or "
                                f"send less", "server_error", None, "render_timeout") from None

    def shutdown(self) -> None:
        """Lets the worker thread go (a render still running finishes on its own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def get(self, sid: str, create: bool = True, meta: dict[str, Any] | None = None) -> Session:
        """Returns the live session ``sid``, creating it when ``create``; raises :class:`APIError` when it is
        unknown (``create=False``) or when ``max_sessions`` are live."""
        s = self.sessions.get(sid)
        if s is not None:
            return s
        if not create:
            raise APIError(404, f"no live session {sid!r}", "invalid_request_error", None, "session_not_found")
        self.expire_idle()
        if len(self.sessions) >= self.cfg.max_sessions:
            raise APIError(429, f"{len(self.sessions)} sessions are live (max_sessions={self.cfg.max_sessions}); end "
                                f"one (POST /v1/sessions/ID/end) or retry later", "rate_limit_error", None,
                           "too_many_sessions")
        s = self.sessions[sid] = Session(sid, self.context, meta, self.note)
        self.counts["sessions_started"] += 1
        return s

    def note(self, c: Completion) -> None:
        k = self.counts
        k["requests"] += 1
        k["drift_candidates"] += c.request > 1
        k["drifts"] += c.drift
        k["choices"] += len(c.choices)
        k["parse_errors"] += sum(bool(x.parse_errors) for x in c.choices)
        k["tool_calls"] += sum(len(x.tool_calls) for x in c.choices)
        k["sampled_tokens"] += c.completion_tokens
        k["prompt_tokens"] += c.prompt_tokens

    def end(self, sid: str, reward: float = 0.0, info: dict[str, Any] | None = None,
            termination: str = "terminated") -> Trajectory:
        """Ends session ``sid``: returns its trajectory (also given to the sink) and forgets it. The trajectory is
        built and given to the sink first: if either fails, the session stays live, its tokens kept."""
        s = self.sessions.get(sid)
        if s is None:
            raise APIError(404, f"no live session {sid!r}", "invalid_request_error", None, "session_not_found")
        traj = s.trajectory(reward, info, termination)
        if self.sink is not None:
            self.sink(traj)
        del self.sessions[sid]
        s.close()
        self.counts["sessions_ended"] += 1
        self.counts["segments_ended"] += len(s.segments)
        return traj

    def forget_unused(self, sid: str) -> None:
        """Forgets session ``sid`` if it never served a request and nothing is in flight or attached to it (a
        failing request's session): failing requests cannot fill ``max_sessions``."""
        s = self.sessions.get(sid)
        if s is not None and s.requests == 0 and s.inflight == 0 and not s.segments and not s.meta \
                and not s.listeners:
            del self.sessions[sid]
            s.close()
            self.counts["sessions_started"] -= 1

    def discard(self, sid: str) -> Session | None:
        """Forgets session ``sid`` without a trajectory (its owner took the tokens itself)."""
        s = self.sessions.pop(sid, None)
        if s is not None:
            s.close()
            self.counts["sessions_ended"] += 1
            self.counts["segments_ended"] += len(s.segments)
        return s

    def expire_idle(self) -> list[Trajectory]:
        """Ends the sessions idle longer than ``session_idle_s`` (no request in flight) as ``truncated`` with reward
        0 (``info["gateway/ended"] = "idle"``): their tokens go to the sink, never lost."""
        cutoff = time.monotonic() - self.cfg.session_idle_s
        out = []
        for sid, s in list(self.sessions.items()):
            if s.inflight == 0 and s.last_used < cutoff and not s.listeners:
                self.counts["sessions_expired"] += 1
                out.append(self.end(sid, 0.0, {"gateway/ended": "idle"}, "truncated"))
        return out

    def metrics(self) -> dict[str, float]:
        """``gateway/drift_rate`` (requests that started a new segment / requests after a session's first),
        ``gateway/segments_per_session`` (over ended sessions, else live ones), ``tool/parse_error_rate`` (choices
        with a malformed tool call / choices), and the counters as ``gateway/<name>``."""
        k = self.counts
        live_segs = sum(len(s.segments) for s in self.sessions.values())
        ended = k["sessions_ended"]
        out = {f"gateway/{n}": float(v) for n, v in k.items()}
        out["gateway/live_sessions"] = float(len(self.sessions))
        out["gateway/drift_rate"] = k["drifts"] / k["drift_candidates"] if k["drift_candidates"] else 0.0
        out["gateway/segments_per_session"] = (k["segments_ended"] / ended if ended else
                                               live_segs / len(self.sessions) if self.sessions else 0.0)
        out["tool/parse_error_rate"] = k["parse_errors"] / k["choices"] if k["choices"] else 0.0
        return out
