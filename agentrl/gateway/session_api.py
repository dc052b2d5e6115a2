"""The gateway's operator routes: the live sessions, ending one with its reward, and the metrics.

::

    GET  /v1/sessions                  live sessions and their counters
    GET  /v1/sessions/<id>             one session's counters (and segment sizes)
    POST /v1/sessions/<id>/end         {"reward": R, "info": {...}} -> the trajectory's summary
    GET  /metrics                      the store's metrics and the error counters

A mixin of :class:`agentrl.gateway.server.Gateway` (which supplies ``_auth``, ``_body``, ``store``, ``cfg`` and
``errors``), apart from the model-facing dialects because its invariants are about ownership: an issued session key
reaches only its own session and never lists others, and a session owned by a training episode ends only with its
harness.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from agentrl.gateway.protocol import APIError, check_end_body


class SessionRoutes:
    store: Any
    cfg: Any
    errors: dict[str, int]

    def _auth(self, request: web.Request) -> tuple[str | None, str | None]:
        raise NotImplementedError

    async def _body(self, request: web.Request) -> dict[str, Any]:
        raise NotImplementedError

    def _session_for_api(self, request: web.Request) -> str:
        key_sid, issued = self._auth(request)
        sid = request.match_info["id"]
        if issued is not None and sid != issued:
            raise APIError(403, "this API key belongs to another session", "permission_error", None, "wrong_session")
        return sid

    async def list_sessions(self, request: web.Request) -> web.Response:
        _, issued = self._auth(request)
        if issued is not None:
            raise APIError(403, "a session key cannot list sessions", "permission_error", None, "wrong_session")
        return web.json_response({"data": [{"id": s.id, **s.info()} for s in self.store.sessions.values()]})

    async def get_session(self, request: web.Request) -> web.Response:
        sid = self._session_for_api(request)
        s = self.store.get(sid, create=False)
        return web.json_response({"id": sid, **s.info(), "segment_lengths": [len(x.token_ids) for x in s.segments]})

    async def end_session(self, request: web.Request) -> web.Response:
        sid = self._session_for_api(request)
        body = await self._body(request) if request.can_read_body else {}
        reward, info, want = check_end_body(body)  # everything is checked before the session is touched
        s = self.store.get(sid, create=False)
        if s.inflight:
            raise APIError(409, f"session {sid!r} has {s.inflight} request(s) in flight; end it after they return",
                           code="session_busy")
        if s.meta.get("_key_hash"):
            raise APIError(403, f"session {sid!r} is owned by a training episode; it ends with its harness",
                           "permission_error", None, "session_owned")
        traj = self.store.end(sid, reward, info)
        out = {"id": traj.id, "reward": traj.reward, "tokens": len(traj.token_ids), "sampled_tokens": traj.num_generated,
               "segments": len(traj.segments) or 1, "requests": traj.num_turns, "written": self.cfg.out}
        if want:
            out["trajectory"] = traj.to_dict()
        return web.json_response(out)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        self._auth(request)
        return web.json_response({**self.metrics(), "time": time.time()})

    def metrics(self) -> dict[str, float]:
        """The store's metrics plus ``gateway/errors/<code>`` counters."""
        out = self.store.metrics()
        out.update({f"gateway/errors/{k}": float(v) for k, v in self.errors.items()})
        return out
