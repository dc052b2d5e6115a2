"""The aiohttp server: OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` over one engine.

Routes (each also under ``/s/<session>/``, so a client whose only setting is a base URL lands in its session)::

    GET  /v1/models, /v1/models/<id>   the served model (OpenAI's and Anthropic's list and retrieve)
    GET  /v1beta/models[/<model>]      the same in Gemini's form
    POST /v1/chat/completions          messages (+ tools, n, stream) -> choices; tokens recorded in the session
    POST /v1/completions               prompt (text or token ids) -> choices
    POST /v1/messages                  Anthropic Messages, on the chat path (:mod:`~agentrl.gateway.anthropic`)
    POST /v1/responses                 OpenAI Responses, on the chat path (:mod:`~agentrl.gateway.responses_api`)
    POST /v1beta/models/<model>:generateContent (and :streamGenerateContent?alt=sse; also under /v1/models/)
                                       Google's Gemini, on the chat path (:mod:`~agentrl.gateway.gemini`)
    POST /v1/messages/count_tokens, /v1/responses/input_tokens, /v1beta/models/<model>:countTokens
                                       the prompt tokens the request would take on its session now (nothing kept)
    GET  /v1/sessions                  live sessions and their counters
    GET  /v1/sessions/<id>             one session's counters (and segment sizes)
    POST /v1/sessions/<id>/end         {"reward": R, "info": {...}} -> the trajectory's summary (the whole
                                       trajectory with "return_trajectory": true); appended to ``out``
    GET  /metrics                      gateway/drift_rate, gateway/segments_per_session, tool/parse_error_rate, ...
    GET  /health

**Sessions.** A request's session is, in this order: the path's ``/s/<session>/``, the ``X-Agentrl-Session``
header, the API key (a per-session key issued by :meth:`Gateway.open_session`, or the ``<session>`` of
``<key>:<session>``), else ``default``. A credential is never an identifier: a bearer token itself never names a
session, so no key ends up in ``/v1/sessions`` or the JSONL. Unknown sessions are created on first use (up to
``max_sessions`` live); a request that fails leaves no session behind.

**Security.** Before any handler: the ``Host`` must be an allowed name on the bound port (421: DNS rebinding), an
``Origin`` must be allowed (403) and a POST body must be ``application/json`` (415: cross-site simple requests), see
:mod:`agentrl.gateway.guard`; slow headers, bodies and idle connections time out. The server binds to 127.0.0.1
unless configured otherwise, and any other address needs ``api_key``. Keys are compared in constant time
(:mod:`~agentrl.gateway.keys`); issued session keys are looked up by their SHA-256, so lookup time reveals nothing
about a key; an issued-looking key (``sk-agentrl-``) that is not live (its session ended) is refused even when the
server has no key. Request bodies are bounded (``max_request_bytes``), as are ``max_tokens``, ``n``, live sessions,
tokens per session, ``end``'s reward and info, and the time a prompt takes to render (in a worker thread, off the
event loop, unless it is small). Every failure is an OpenAI error body (``{"error": {"message", "type", "param",
"code"}}``) with a 4xx/5xx status; no request can crash the server, a failed request leaves its session as it was, and
a client that hangs up is counted (``gateway/errors/client_disconnected``), not logged as a server error; its request
is cancelled, streamed or not, so the engine samples nothing for a client that left.

**Streaming** is token by token in every dialect (:mod:`~agentrl.gateway.live`, :mod:`~agentrl.gateway.streaming`,
:mod:`~agentrl.gateway.writers`); the response bodies: :mod:`~agentrl.gateway.responses`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from agentrl.chat import ChatRenderer
from agentrl.gateway import gemini
from agentrl.gateway.anthropic import error_body
from agentrl.gateway.choices import Completion
from agentrl.gateway.config import GatewayConfig
from agentrl.gateway.guard import app_runner, cross_site_problem
from agentrl.netguard import HostCheck, default_hosts, origin_allowed
from agentrl.gateway.keys import Keys
from agentrl.gateway.protocol import APIError, ChatRequest, CompletionRequest, bad, parse_chat, parse_completion, \
    engine_dead, parse_json
from agentrl.gateway.live import LiveRequest
from agentrl.gateway.responses_api import ResponseLog
from agentrl.gateway.responses import chat_body, completion_body
from agentrl.gateway.dialect_routes import DialectRoutes
from agentrl.gateway.session_api import SessionRoutes
from agentrl.gateway.sessions import Session
from agentrl.gateway.store import SessionStore
from agentrl.gateway.streaming import Writer, stream_live, until_hung_up
from agentrl.gateway.writers import OpenAIWriter
from agentrl.inference.base import InferenceEngine
from agentrl.trajectory import Trajectory

log = logging.getLogger("agentrl.gateway")
_SID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")  # fullmatch: "$" would accept a trailing newline
SESSION_HEADER = "X-Agentrl-Session"
PREFLIGHT_HEADERS = {"Access-Control-Allow-Methods": "GET, POST",
                     "Access-Control-Allow-Headers": f"Authorization, Content-Type, api-key, x-api-key, "
                                                     f"anthropic-version, {SESSION_HEADER}",
                     "Access-Control-Max-Age": "600"}


def _error_response(e: APIError, request: web.Request | None = None) -> web.Response:
    """OpenAI's error body, Anthropic's on ``/v1/messages``, Google's on Gemini's ``models/<model>:<method>``."""
    path = request.path if request is not None else ""
    if path.endswith("/v1/messages"):
        return web.json_response(error_body(e), status=e.status)
    if _GEMINI_PATH.search(path):
        return web.json_response(gemini.error_body(e), status=e.status)
    return web.json_response(e.body(), status=e.status)


_GEMINI_PATH = re.compile(r"/models/[^/]+:[A-Za-z]+$")


class Gateway(SessionRoutes, DialectRoutes):
    """An OpenAI-compatible server (and Anthropic Messages, OpenAI Responses, Gemini) in front of ``engine`` that
    records every token per session.

    ``renderer``: the model's :class:`ChatRenderer` (built from ``tokenizer`` and ``cfg.chat`` when not given).
    Use ``async with Gateway(...) as gw`` (or :meth:`start` / :meth:`stop`); :attr:`url` is the base URL
    (``http://host:port``). The engine is not closed here.
    """

    def __init__(self, engine: InferenceEngine, tokenizer: Any = None, cfg: GatewayConfig | None = None, *,
                 renderer: ChatRenderer | None = None, model_name: str | None = None):
        self.cfg = cfg or GatewayConfig()
        self.cfg.validate()
        if renderer is None:
            if tokenizer is None:
                raise ValueError("Gateway needs the engine's tokenizer (or a ChatRenderer)")
            renderer = ChatRenderer(tokenizer, self.cfg.chat)
        self.engine = engine
        self.renderer = renderer
        path = getattr(engine, "model_path", None)
        self.model_name = self.cfg.model_name or model_name or (Path(path).name if path else "agentrl")
        self._out = open(self.cfg.out, "a") if self.cfg.out else None
        self.store = SessionStore(renderer, engine, self.cfg, self._write if self._out else None)
        self._keys = Keys(self.cfg.api_key)
        self._runner: web.AppRunner | None = None
        self._site_port: int | None = None
        self._hosts = HostCheck(self._host_names(), self.cfg.port)
        self.errors: Counter[str] = Counter()  # gateway/errors/<code>: failed requests, streamed or not
        self.response_log = ResponseLog()
        self._expiry: asyncio.Task | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        # aiohttp's own body limit answers in plain text: the handlers check the size first (see _body).
        app = web.Application(client_max_size=self.cfg.max_request_bytes + 1, middlewares=[self._errors])
        for prefix in ("", "/s/{sid}"):
            app.router.add_get(prefix + "/v1/models", self.models)
            app.router.add_get(prefix + "/v1/models/{model}", self.model)
            app.router.add_get(prefix + "/v1beta/models", self.gemini_models)
            app.router.add_get(prefix + "/v1beta/models/{target}", self.gemini_models)
            app.router.add_post(prefix + "/v1/chat/completions", self.chat)
            app.router.add_post(prefix + "/v1/completions", self.completions)
            app.router.add_post(prefix + "/v1/messages", self.messages)
            app.router.add_post(prefix + "/v1/messages/count_tokens", self.count_messages)
            app.router.add_post(prefix + "/v1/responses", self.responses)
            app.router.add_post(prefix + "/v1/responses/input_tokens", self.count_responses)
            for version in ("/v1beta", "/v1"):
                app.router.add_post(prefix + version + "/models/{target}", self.gemini)
        app.router.add_get("/v1/sessions", self.list_sessions)
        app.router.add_get("/v1/sessions/{id}", self.get_session)
        app.router.add_post("/v1/sessions/{id}/end", self.end_session)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/health", self.health)
        app.on_response_prepare.append(self._cors)
        return app

    async def start(self) -> "Gateway":
        """Starts listening on ``cfg.host:cfg.port`` (port 0: a free one, see :attr:`port`)."""
        self._runner = app_runner(self.app(), self.cfg.idle_timeout_s, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # the only way aiohttp exposes the bound port
        self._site_port = sockets[0].getsockname()[1] if sockets else self.cfg.port
        self._hosts = HostCheck(self._host_names(), self.port)
        self._expiry = asyncio.ensure_future(self._expire_loop())
        log.info("gateway listening on %s (model %r)", self.url, self.model_name)
        return self

    async def stop(self) -> None:
        """Stops listening; live sessions are ended as ``truncated`` (reward 0) into ``out`` when it is set."""
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
            self._expiry = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.store.shutdown()
        if self._out is not None:
            for sid in list(self.store.sessions):
                self.store.end(sid, 0.0, {"gateway/ended": "shutdown"}, "truncated")
            self._out.close()
            self._out = None

    async def __aenter__(self) -> "Gateway":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def _host_names(self) -> list[str] | None:
        return self.cfg.allowed_hosts if self.cfg.allowed_hosts is not None else default_hosts(self.cfg.host)

    @property
    def port(self) -> int:
        return int(self._site_port if self._site_port is not None else self.cfg.port)

    @property
    def url(self) -> str:
        host = self.cfg.host if self.cfg.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    async def _expire_loop(self) -> None:
        period = min(60.0, self.cfg.session_idle_s / 2)
        while True:
            await asyncio.sleep(period)
            try:
                self.store.expire_idle()
            except Exception:
                log.exception("gateway: ending idle sessions failed")

    def _write(self, traj: Trajectory) -> None:
        assert self._out is not None
        self._out.write(traj.to_json() + "\n")
        self._out.flush()

    # -- sessions for the manager integration ----------------------------------------------------------------------
    def open_session(self, sid: str, meta: dict[str, Any] | None = None) -> tuple[Session, str]:
        """Creates session ``sid`` and returns it with a new API key that authenticates as (and only as) it."""
        if sid in self.store.sessions:
            raise ValueError(f"session {sid!r} is already live")
        s = self.store.get(sid, True, meta)
        key, s.meta["_key_hash"] = self._keys.issue(sid)
        return s, key

    def close_session(self, sid: str) -> Session | None:
        """Forgets session ``sid`` and revokes its key; returns it (its tokens stay readable) or None."""
        s = self.store.discard(sid)
        if s is not None:
            self._keys.revoke(s.meta.get("_key_hash", ""))
        return s

    # -- request plumbing -------------------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if not self._hosts.allows(request.headers.get("Host")):
                raise APIError(421, f"unexpected Host header {request.headers.get('Host', '')[:100]!r}: this gateway is "
                                    f"reached as {sorted(self._hosts.names or [])} (allowed_hosts)",
                               code="misdirected_request")
            problem = cross_site_problem(request, self.cfg.allowed_origins)
            if problem is not None:
                status, code, message = problem
                raise APIError(status, message, "permission_error" if status == 403 else "invalid_request_error",
                               None, code)
            if request.method == "OPTIONS" and "Origin" in request.headers:  # an allowed origin's CORS preflight
                return web.Response(status=204, headers=PREFLIGHT_HEADERS)
            if request.method == "POST" and (why := self.engine.dead()):
                raise engine_dead(why)
            return await handler(request)
        except ConnectionResetError:  # the client hung up: not the server's fault (this answer reaches no one)
            self._hung_up(request)
            return _error_response(APIError(400, "the client hung up", code="client_disconnected"))
        except APIError as e:
            self.errors[e.code or e.type] += 1
            resp = _error_response(e, request)
            if e.status == 408:
                resp.force_close()  # the rest of a slow body is not waited for
            return resp
        except web.HTTPException as e:
            if e.status == 413:
                return _error_response(APIError(413, f"request body over {self.cfg.max_request_bytes} bytes "
                                                     f"(max_request_bytes)", code="request_too_large"), request)
            kind = "not_found" if e.status == 404 else "method_not_allowed" if e.status == 405 else "http_error"
            return _error_response(APIError(e.status, f"{request.method} {request.path}: {e.reason}", code=kind),
                                   request)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never crash: the error is the response, the session is unchanged
            if why := self.engine.dead():  # it died under this request
                self.errors["engine_dead"] += 1
                return _error_response(engine_dead(why), request)
            log.exception("gateway: %s %s failed", request.method, request.path)
            self.errors["server_error"] += 1
            return _error_response(APIError(500, f"internal error: {e!r:.500}", "server_error", None, "internal_error"),
                                   request)

    async def _cors(self, request: web.Request, response: web.StreamResponse) -> None:
        """Lets an allowed origin's page read the response (other origins get a 403 without CORS headers)."""
        origin = request.headers.get("Origin")
        if origin is not None and origin_allowed(origin, self.cfg.allowed_origins):  # before headers are written
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"

    def _hung_up(self, request: web.Request) -> None:
        self.errors["client_disconnected"] += 1
        log.debug("gateway: %s %s: the client hung up", request.method, request.path)

    def _auth(self, request: web.Request) -> tuple[str | None, str | None]:
        """``(session the key names or None, issued-key session or None)``; 401 for a bad key (see
        :mod:`agentrl.gateway.keys`)."""
        # Anthropic's clients send x-api-key, Azure-style ones api-key, Google's x-goog-api-key (or ?key= on its paths)
        h = request.headers
        key = h.get("x-api-key") or h.get("api-key") or h.get("x-goog-api-key") or \
            (request.query.get("key", "") if _GEMINI_PATH.search(request.path) else "")
        return self._keys.check(h.get("Authorization", ""), key)

    def _session(self, request: web.Request) -> Session:
        key_sid, issued = self._auth(request)
        sid = request.match_info.get("sid") or request.headers.get(SESSION_HEADER) or key_sid or "default"
        if not _SID.fullmatch(sid):
            raise bad(None, f"session id {sid[:60]!r} must be 1-128 letters, digits or ._:-", "invalid_session")
        if issued is not None and sid != issued:
            raise APIError(403, "this API key belongs to another session", "permission_error", None,
                           "wrong_session")
        if issued is None and sid in self.store.sessions and self.store.sessions[sid].meta.get("_key_hash"):
            raise APIError(403, f"session {sid!r} is only reachable with its own API key", "permission_error", None,
                           "wrong_session")
        return self.store.get(sid, create=True)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        limit = self.cfg.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            raise APIError(413, f"request body of {request.content_length} bytes is over max_request_bytes={limit}",
                           code="request_too_large")
        try:
            raw = await asyncio.wait_for(request.read(), self.cfg.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            raise APIError(413, f"request body over max_request_bytes={limit}", code="request_too_large") from None
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within body_timeout_s={self.cfg.body_timeout_s}",
                           code="body_timeout") from None
        request["body_bytes"] = len(raw)  # as read: a compressed body's Content-Length says less
        return parse_json(raw)

    def _check_model(self, model: str) -> None:
        if model != self.model_name and not any(fnmatch.fnmatchcase(model, a) for a in self.cfg.model_aliases):
            raise APIError(404, f"the model {model!r} does not exist; this gateway serves {self.model_name!r}",
                           "invalid_request_error", "model", "model_not_found")

    # -- handlers ---------------------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if why := self.engine.dead():  # 503, as vLLM's own server answers: a supervisor restarts it
            return web.json_response({"status": "dead", "reason": why, "model": self.model_name}, status=503)
        return web.json_response({"status": "ok", "model": self.model_name})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self._auth(request)  # an unauthenticated request learns nothing, not even whether its JSON is valid
        req = parse_chat(await self._body(request))
        return await self._serve(request, req, lambda: OpenAIWriter(req.model, req.sampling.n, req.include_usage, True),
                                 lambda d: chat_body(d, req.model, req.sampling.logprobs), self._clamp(req))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self._auth(request)
        req = parse_completion(await self._body(request))
        return await self._serve(request, req, lambda: OpenAIWriter(req.model, req.sampling.n, req.include_usage, False),
                                 lambda d: completion_body(d, req.model, req.sampling.logprobs), self._clamp(req))

    def _clamp(self, req: ChatRequest | CompletionRequest) -> list[str]:
        """A ``max_tokens`` over the gateway's cap is lowered to it, not refused (harnesses ask for 32,000 by
        default), as in every dialect; the note says so."""
        cap, asked = self.store.max_tokens, req.sampling.max_tokens
        if asked is not None and asked > cap:
            req.sampling.max_tokens = cap
            return [f"max_tokens {asked} clamped to this gateway's limit of {cap}"]
        return []

    async def _serve(self, request: web.Request, req: ChatRequest | CompletionRequest,
                     writer: Callable[[], Writer], body: Callable[[Completion], dict[str, Any]],
                     notes: list[str] | None = None, owner: str | None = None) -> web.StreamResponse:
        """Serves a parsed request on its session, whatever the dialect: ``writer`` (streaming, token by token) or
        ``body`` write the result in the dialect's form; ``notes`` (what the gateway changed in the request) go in a
        header; ``owner``: the session the request's history belongs to (``previous_response_id``)."""
        self._check_model(req.model)
        session = self._session(request)
        if owner is not None and owner != session.id:
            self.store.forget_unused(session.id)
            raise bad("previous_response_id", f"the previous response belongs to session {owner!r}, not to this "
                                              f"request's session {session.id!r}", "wrong_session")
        chat = isinstance(req, ChatRequest)
        req.body_bytes = request.get("body_bytes")
        run = (lambda live: self._forget_on_failure(  # type: ignore[arg-type]
            session, session.chat(req, live) if chat else session.complete(req, live)))
        # notes quote client-sent names: printable ASCII only, so a header cannot be split or refused
        headers = {"X-Agentrl-Note": "".join(ch if " " <= ch <= "~" else "?" for ch in "; ".join(notes))} \
            if notes else {}
        if req.stream:
            live = LiveRequest(self.renderer, chat, req.tools if chat else None, req.tool_choice if chat else "none",
                               lambda why: self.errors.update(["stream_mismatch"]))
            return await stream_live(request, run, live, writer(), keepalive_s=self.cfg.keepalive_s,
                                     on_hang_up=self._hung_up, errors=self.errors, headers=headers,
                                     dead=self.engine.dead)
        return web.json_response(body(await until_hung_up(request, run(None))), headers=headers)

    async def _forget_on_failure(self, session: Session, work: Any) -> Completion:
        """Awaits a session request; a failure leaves no session that served nothing (so failing requests cannot
        fill ``max_sessions``)."""
        try:
            return await work
        except BaseException:
            self.store.forget_unused(session.id)
            raise
