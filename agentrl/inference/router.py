"""Least-loaded, sticky-per-trajectory routing over N interchangeable backends (vLLM servers, engine replicas).

Rules, in order, for a request with ``session_id`` (a trajectory id):

1. The session is pinned to a healthy backend: use it (its prefix cache holds the conversation so far), however
   busy it is.
2. Otherwise pick the healthy backend with the fewest requests in flight; ties go to the one with the fewest pinned
   sessions, then to list order. Pin the session there (a session whose backend went unhealthy moves, once).
3. No healthy backend left: every backend is tried again (a failure is not forever, only until the next pick).

A request without a session follows rule 2 and pins nothing. The session table is bounded (least recently used
sessions are forgotten first), so callers that never call :meth:`Router.end_session` do not leak.

The router only chooses and counts; the caller brackets each request with :meth:`Router.started` /
:meth:`Router.finished` and reports failures with :meth:`Router.mark_unhealthy`. It is not thread-safe: use it
from one event loop.
"""

from __future__ import annotations

from collections import OrderedDict


class Router:
    """Routing state for ``n`` backends, addressed by index ``0..n-1``."""

    def __init__(self, n: int, *, max_sessions: int = 100_000):
        if n < 1:
            raise ValueError(f"need at least one backend, got {n}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.n = n
        self.max_sessions = max_sessions
        self.inflight = [0] * n
        self.sessions = [0] * n  # pinned sessions per backend
        self.healthy = [True] * n
        self._pins: OrderedDict[str, int] = OrderedDict()

    def pick(self, session_id: str | None = None) -> int:
        """The backend for the next request of ``session_id`` (rules in the module docstring); pins the session."""
        if session_id is not None:
            pinned = self._pins.get(session_id)
            if pinned is not None and self.healthy[pinned]:
                self._pins.move_to_end(session_id)
                return pinned
        candidates = [i for i in range(self.n) if self.healthy[i]]
        if not candidates:
            self.healthy = [True] * self.n
            candidates = list(range(self.n))
        best = min(candidates, key=lambda i: (self.inflight[i], self.sessions[i], i))
        if session_id is not None:
            self._unpin(session_id)
            self._pins[session_id] = best
            self.sessions[best] += 1
            while len(self._pins) > self.max_sessions:
                old, i = self._pins.popitem(last=False)
                self.sessions[i] -= 1
        return best

    def started(self, i: int) -> None:
        """A request was sent to backend ``i``."""
        self.inflight[i] += 1

    def finished(self, i: int) -> None:
        """A request to backend ``i`` ended (any outcome)."""
        self.inflight[i] -= 1

    def mark_unhealthy(self, i: int) -> None:
        """Backend ``i`` failed: no new pick goes there (until every backend has failed); its sessions move on their
        next request."""
        self.healthy[i] = False

    def mark_healthy(self, i: int) -> None:
        self.healthy[i] = True

    def backend_for(self, session_id: str) -> int | None:
        """The backend ``session_id`` is pinned to (None before its first request or after it was forgotten)."""
        return self._pins.get(session_id)

    def end_session(self, session_id: str) -> None:
        """Forgets a finished trajectory's pin."""
        self._unpin(session_id)

    def _unpin(self, session_id: str) -> None:
        i = self._pins.pop(session_id, None)
        if i is not None:
            self.sessions[i] -= 1
