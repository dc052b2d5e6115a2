"""Remote vLLM servers over HTTP (aiohttp): OpenAI-compatible ``/v1/completions`` with token ids in and token ids
and log-probabilities out, several servers, least-in-flight load balancing, sticky sessions.

Server side (``python -m vllm.entrypoints.openai.api_server`` or ``vllm serve``)::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR \\
        --worker-extension-cls agentrl.inference.vllm_worker.WeightSyncExtension   # for weight_sync="http"/"file"

Requests: ``prompt`` is the token-id list, ``return_token_ids`` gives the generated ids, ``logprobs: 1`` the sampled
token's log-probability (``token_logprobs``), ``stream: true`` so an aborted request keeps its tokens so far.

Versions (what is and is not exact): the OpenAI completions API carries no weight version, so this client labels
each token with the version it has recorded when the token's chunk arrives. Versions change only through
:meth:`RemoteEngine.update_weights` (or :meth:`set_version` when something else pushes weights), which pauses every
server first. In ``abort`` mode that labelling is exact (no token crosses an update). In ``keep`` mode a token
that was sampled just before the pause but whose chunk arrives after the version bump would be labelled new; the
client therefore bumps its label only after the servers resumed, so the error can only go the other way, and at
most the tokens of one in-flight chunk per request.

Weight updates, per ``weight_sync``: ``"http"`` POSTs the safetensors bytes (base64) to every server's
``/collective_rpc`` (needs dev mode and the worker extension; fine for small models, use NCCL for big ones);
``"file"`` writes the state dict once under ``weight_dir`` and asks every server to load that file (same host or
shared FS); ``"version_only"`` just pauses, sets the label (``/update_weight_version`` on dev-mode servers) and
resumes. Pausing uses ``/pause?mode=abort|keep`` and ``/resume`` (dev mode).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.inference.config import EngineConfig


class RemoteEngineError(RuntimeError):
    """A server answered with an error, or no server could be reached."""


@dataclass
class _Server:
    url: str
    inflight: int = 0
    sessions: set[str] = field(default_factory=set)
    healthy: bool = True


class RemoteEngine(InferenceEngine):
    """Generation on one or more vLLM OpenAI-compatible servers.

    Routing: a request with a ``session_id`` goes to the server that session used before (its prefix cache holds
    the conversation so far); a new session or a request without one goes to the server with the fewest requests
    in flight (ties: fewest sessions, then list order). A server that fails a request is marked unhealthy and its
    sessions move elsewhere on their next request.
    """

    def __init__(
        self,
        urls: list[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        max_model_len: int | None = None,
        pause_mode: str = "abort",
        weight_sync: str = "http",
        weight_dir: str | None = None,
        model_path: str | None = None,
        initial_version: int = 0,
    ):
        if not urls:
            raise ValueError("urls: need at least one server URL")
        self.servers = [_Server(u.rstrip("/")) for u in urls]
        self.model = model
        self.model_path = model_path or model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_model_len = max_model_len
        self.pause_mode = pause_mode
        self.weight_sync = weight_sync
        self.weight_dir = weight_dir
        self._version = initial_version
        self._session_server: dict[str, _Server] = {}
        self._inflight: dict[str, tuple[_Server, asyncio.Task[Any] | None]] = {}
        self._aborted: set[str] = set()
        self._http: Any = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._update_lock: asyncio.Lock | None = None
        self._closed = False

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> "RemoteEngine":
        model = None if cfg.model == "tiny" else cfg.model
        return cls(cfg.urls, model=model, api_key=cfg.api_key, timeout_s=cfg.request_timeout_s,
                   max_retries=cfg.max_retries, max_model_len=cfg.max_model_len, pause_mode=cfg.pause_mode,
                   weight_sync=cfg.weight_sync, weight_dir=cfg.weight_dir,
                   model_path=cfg.resolved_model() if cfg.model == "tiny" else cfg.model)

    # ---- HTTP plumbing --------------------------------------------------------------------------------------
    def _session(self) -> Any:
        """An aiohttp session for the running event loop (sessions cannot be shared across loops)."""
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop or self._http.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._http = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10),
                connector=aiohttp.TCPConnector(limit=0))
            self._http_loop = loop
        return self._http

    async def _model_name(self, server: _Server) -> str:
        """The served model name: ``model`` if given, else the first model the server lists."""
        import aiohttp

        if self.model is None:
            try:
                async with self._session().get(server.url + "/v1/models") as r:
                    data = await r.json()
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                raise _Retryable(str(e)) from e
            self.model = data["data"][0]["id"]
        return self.model

    async def _post(self, server: _Server, path: str, body: Any = None, params: dict | None = None) -> Any:
        async with self._session().post(server.url + path, json=body, params=params) as r:
            text = await r.text()
            if r.status >= 400:
                raise RemoteEngineError(f"{server.url}{path}: HTTP {r.status}: {text[:500]}")
            try:
                return json.loads(text) if text else None
            except ValueError:
                return text

    async def _get(self, server: _Server, path: str) -> Any:
        async with self._session().get(server.url + path) as r:
            if r.status >= 400:
                raise RemoteEngineError(f"{server.url}{path}: HTTP {r.status}: {(await r.text())[:500]}")
            return await r.json()

    # ---- routing --------------------------------------------------------------------------------------------
    def _pick(self, session_id: str | None) -> _Server:
        if session_id is not None:
            s = self._session_server.get(session_id)
            if s is not None and s.healthy:
                return s
        candidates = [s for s in self.servers if s.healthy] or self.servers
        best = min(candidates, key=lambda s: (s.inflight, len(s.sessions)))
        if session_id is not None:
            old = self._session_server.get(session_id)
            if old is not None:
                old.sessions.discard(session_id)
            self._session_server[session_id] = best
            best.sessions.add(session_id)
        return best

    def server_for(self, session_id: str) -> str | None:
        """The URL a session is pinned to (None before its first request)."""
        s = self._session_server.get(session_id)
        return s.url if s else None

    def end_session(self, session_id: str) -> None:
        """Forgets a finished trajectory's pin (keeps the session table small)."""
        s = self._session_server.pop(session_id, None)
        if s is not None:
            s.sessions.discard(session_id)

    # ---- InferenceEngine ------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Sets the label for new tokens without touching servers (weights pushed by other means)."""
        self._version = version

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None
    ) -> Generation:
        """Streams a completion of ``prompt_ids`` from one server. Returns ids, per-token log-probs, per-token
        versions (see the module docstring) and the finish reason; ``"abort"`` (server paused in abort mode,
        :meth:`abort`, or the stream cut) keeps the tokens received. Connection errors before any token is
        received are retried on another server up to ``max_retries`` times; HTTP 4xx raises ``ValueError``."""
        params.validate()
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        max_tokens = params.max_tokens
        if self.max_model_len is not None:
            room = self.max_model_len - len(prompt_ids)
            if room < 1:
                raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room under max_model_len={self.max_model_len}")
            max_tokens = min(max_tokens, room)
        attempt = 0
        while True:
            server = self._pick(session_id)
            try:
                return await self._generate_on(server, list(prompt_ids), params, max_tokens, request_id)
            except _Retryable as e:
                server.healthy = False
                attempt += 1
                if attempt > self.max_retries or not any(s.healthy for s in self.servers):
                    for s in self.servers:
                        s.healthy = True  # give every server another chance next time
                    raise RemoteEngineError(f"request {request_id}: no server answered ({e})") from e

    async def _generate_on(self, server: _Server, prompt: list[int], params: SamplingParams, max_tokens: int,
                           request_id: str) -> Generation:
        import aiohttp

        body: dict[str, Any] = {
            "model": await self._model_name(server),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "return_token_ids": True,
            "stream": True,
            "ignore_eos": params.ignore_eos,
            "skip_special_tokens": False,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        acc = _Stream()
        server.inflight += 1
        inner = asyncio.ensure_future(self._stream(server, body, request_id, acc))
        self._inflight[request_id] = (server, inner)
        try:
            await inner
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if not (inner.cancelled() and request_id in self._aborted and (me is None or not me.cancelling())):
                inner.cancel()
                raise
            acc.finish = "abort"  # abort() cancelled only the stream: keep the tokens received
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            if not acc.token_ids and request_id not in self._aborted:
                raise _Retryable(str(e)) from e
            acc.finish = "abort"  # the stream broke after some tokens: return them, the caller may resubmit
        finally:
            server.inflight -= 1
            self._inflight.pop(request_id, None)
            aborted = request_id in self._aborted
            self._aborted.discard(request_id)
        finish = "abort" if aborted else acc.finish
        reason = finish if finish in ("stop", "length", "abort") else ("abort" if finish is None else "stop")
        return Generation(token_ids=acc.token_ids, logprobs=acc.logprobs, versions=acc.versions,
                          finish_reason=reason, stop_reason=acc.stop_reason)  # type: ignore[arg-type]

    async def _stream(self, server: _Server, body: dict[str, Any], request_id: str, acc: "_Stream") -> None:
        """Reads the SSE stream of one completion into ``acc``; each token is labelled with the version current
        when its chunk arrives."""
        async with self._session().post(server.url + "/v1/completions", json=body,
                                        headers={"X-Request-Id": request_id}) as r:
            if r.status >= 400:
                text = await r.text()
                if r.status >= 500:
                    raise _Retryable(f"HTTP {r.status}: {text[:300]}")
                raise ValueError(f"{server.url}/v1/completions rejected request {request_id}: HTTP {r.status}: {text[:500]}")
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": chunk["error"]}
                    if 400 <= int(err.get("code") or 500) < 500:
                        raise ValueError(f"{server.url}/v1/completions rejected request {request_id}: {err.get('message')}")
                    raise RemoteEngineError(f"{server.url}: request {request_id} failed: {err.get('message')}")
                for choice in chunk.get("choices", []):
                    new = list(choice.get("token_ids") or [])
                    lp = ((choice.get("logprobs") or {}).get("token_logprobs")) or []
                    acc.token_ids.extend(new)
                    acc.logprobs.extend(float(x) if x is not None else float("nan") for x in lp[: len(new)])
                    acc.logprobs.extend([float("nan")] * (len(new) - len(lp)))
                    acc.versions.extend([self._version] * len(new))
                    if choice.get("finish_reason") is not None:
                        acc.finish, acc.stop_reason = choice["finish_reason"], choice.get("stop_reason")

    async def abort(self, request_id: str) -> None:
        """Stops one request by closing its stream (vLLM aborts a request whose client disconnects); its
        ``generate`` returns the tokens received so far with ``finish_reason == "abort"``. Only requests started
        from the same event loop can be aborted; unknown ids are ignored."""
        entry = self._inflight.get(request_id)
        if entry is None:
            return
        _, stream = entry
        if stream is not None and not stream.done():
            self._aborted.add(request_id)
            stream.cancel()

    async def update_weights(self, state_dict: dict[str, Any], version: int, *, pause_mode: str | None = None) -> None:
        """Pauses every server (``pause_mode`` or the engine's), loads ``state_dict`` per ``weight_sync``, sets
        the version label on the servers and here, resumes. Servers are resumed even if loading fails."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, got {type(version).__name__}")
        mode = pause_mode or self.pause_mode
        if mode not in ("abort", "keep"):
            raise ValueError(f"pause_mode must be 'abort' or 'keep', got {mode!r}")
        payload: str | None = None
        path: str | None = None
        if self.weight_sync in ("http", "file"):
            payload_bytes = await asyncio.to_thread(self._serialize, state_dict)
            if self.weight_sync == "http":
                payload = base64.b64encode(payload_bytes).decode()
            else:
                assert self.weight_dir, "weight_dir is required for weight_sync='file'"
                os.makedirs(self.weight_dir, exist_ok=True)
                fd, path = tempfile.mkstemp(prefix=f"weights-v{version}-", suffix=".safetensors", dir=self.weight_dir)
                with os.fdopen(fd, "wb") as f:
                    f.write(payload_bytes)
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            await asyncio.gather(*[self._post(s, "/pause", params={"mode": mode}) for s in self.servers])
            try:
                if payload is not None:
                    body = {"method": "agentrl_load_weights", "args": [payload]}
                    await asyncio.gather(*[self._post(s, "/collective_rpc", body) for s in self.servers])
                elif path is not None:
                    body = {"method": "agentrl_load_weights_from_file", "args": [path]}
                    await asyncio.gather(*[self._post(s, "/collective_rpc", body) for s in self.servers])
                if payload is not None or path is not None:
                    await asyncio.gather(*[self._post(s, "/reset_prefix_cache", params={"reset_running_requests": str(mode == "keep").lower()})
                                           for s in self.servers])
                await asyncio.gather(*[self._post(s, "/update_weight_version", {"new_version": str(version)}) for s in self.servers])
            finally:
                await asyncio.gather(*[self._post(s, "/resume") for s in self.servers], return_exceptions=True)
                if path is not None:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
            self._version = version

    def _serialize(self, state_dict: dict[str, Any]) -> bytes:
        import torch

        from agentrl.inference.weights import checkpoint_schema, prepare_state_dict, serialize, tied_embeddings

        path = self.model_path if self.model_path and os.path.isdir(self.model_path) else None
        schema = checkpoint_schema(path) if path else None
        dtype = None
        if path:
            try:
                with open(os.path.join(path, "config.json")) as f:
                    dtype = getattr(torch, json.load(f).get("dtype") or "float32")
            except (OSError, ValueError, AttributeError):
                dtype = None
        tensors = prepare_state_dict(state_dict, schema, dtype or torch.float32, tied=bool(path and tied_embeddings(path)))
        return serialize(tensors)

    async def server_versions(self) -> list[str]:
        """Each server's weight-version label (``GET /weight_info``, dev mode)."""
        out = []
        for s in self.servers:
            out.append((await self._get(s, "/weight_info"))["weight_version"])
        return out

    async def close(self) -> None:
        """Closes the HTTP session; the servers keep running (they are not ours)."""
        self._closed = True
        if self._http is not None and not self._http.closed:
            await self._http.close()
        self._http = None


@dataclass
class _Stream:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_reason: Any = None


class _Retryable(Exception):
    """The server could not be reached (or failed with 5xx) before any token arrived."""


def new_request_id() -> str:
    return uuid.uuid4().hex
