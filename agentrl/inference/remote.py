"""Remote vLLM servers over HTTP (aiohttp): vLLM's token-in/token-out endpoint ``POST /inference/v1/generate``,
several servers, least-in-flight load balancing with sticky sessions (:class:`agentrl.inference.router.Router`).

Server side (``vllm serve`` or ``python -m vllm.entrypoints.openai.api_server``, vLLM >= 0.32)::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --enable-scale-out \\
        --worker-extension-cls agentrl.inference.vllm_worker.WeightSyncExtension   # for weight_sync="http"/"file"

On a CPU server add ``--no-enable-chunked-prefill --max-num-batched-tokens N`` (N at least ``--max-model-len``): a
prefill split over steps crashes vLLM CPU's engine core when the request is seeded, as this client's requests are
(the in-process engine sets the same, :mod:`agentrl.inference.vllm_engine`).

``--enable-scale-out`` turns on ``/inference/v1/generate`` (token ids in, token ids, log-probabilities and weight
versions out); dev mode turns on ``/pause``, ``/resume``, ``/update_weight_version``, ``/collective_rpc``.

Versions are exact by construction: each token's version is the weight-version label the server's engine core
attached to the step that sampled it (the ``weight_versions`` spans of the request's final stream chunk), not
a label this client keeps. The server label ``"default"`` (never relabelled since start) means ``initial_version``;
any other label must be an integer (a server labelled otherwise raises :class:`RemoteEngineError`). A request
whose stream ends without its final chunk (connection cut, cancelled before the server knew its id) returns no
tokens (``finish_reason="abort"``, the caller resubmits): a token is never returned without its server version.
:meth:`RemoteEngine.generate_streaming` (the gateway's path) tells each chunk's ids as they arrive; a stream of
its cut after some were told raises instead, since those cannot be taken back.
So versions stay exact however the servers' labels change -- through :meth:`RemoteEngine.update_weights`, or by a
trainer that pushes weights itself (vLLM's NCCL weight transfer with ``finish_weight_update(weight_version=...)``).

Aborting: :meth:`RemoteEngine.abort` asks the server to abort (``/inference/v1/abort_requests``); the stream then
ends with the tokens so far and their versions. A server paused in ``abort`` mode ends in-flight streams the same
way.

Weight updates, per ``weight_sync``: ``"http"`` POSTs the safetensors bytes (base64) to every server's
``/collective_rpc`` (needs dev mode and the worker extension; fine for small models, use NCCL for big ones);
``"file"`` writes the state dict once under ``weight_dir`` and asks every server to load that file (same host or
shared FS); ``"version_only"`` just pauses, sets the label (``/update_weight_version``) and resumes. Pausing uses
``/pause?mode=abort|keep`` and ``/resume`` (dev mode).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.inference.config import EngineConfig
from agentrl.inference.router import Router
from agentrl.tools import JSON_ERRORS

GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"


class RemoteEngineError(RuntimeError):
    """A server answered with an error, or no server could be reached."""


def versions_from_spans(spans: Any, n_tokens: int, default_version: int) -> list[int] | None:
    """One int version per output token from vLLM's weight-version spans (objects with ``version``/``start``/``end``
    or their JSON dicts). ``"default"`` (a server never relabelled) is ``default_version``. Returns None when the
    spans do not cover every token exactly once; raises :class:`RemoteEngineError` for a label that is not an int."""
    out: list[int | None] = [None] * n_tokens
    for span in spans or []:
        get = span.get if isinstance(span, dict) else (lambda k, _s=span: getattr(_s, k))
        label, start, end = get("version"), int(get("start")), int(get("end"))
        if label == "default":
            v = default_version
        else:
            try:
                v = int(label)
            except (TypeError, ValueError):
                raise RemoteEngineError(
                    f"weight version label {label!r} is not an integer: agentrl labels weights with its step number; "
                    "another client relabelled this server") from None
        if start < 0 or end > n_tokens:
            return None
        for k in range(start, end):
            out[k] = v
    if any(v is None for v in out):
        return None
    return out  # type: ignore[return-value]


@dataclass
class _Server:
    url: str


class RemoteEngine(InferenceEngine):
    """Generation on one or more vLLM servers (``--enable-scale-out``).

    One idea: the :class:`InferenceEngine` contract over vLLM's HTTP API; routing, version labels and weight loads
    are one protocol against the same servers.

    Routing (:class:`~agentrl.inference.router.Router`): a request with a ``session_id`` goes to the server that
    session used before (its prefix cache holds the conversation so far); a new session or a request without one
    goes to the server with the fewest requests in flight. A server that fails a request is marked unhealthy and
    its sessions move elsewhere on their next request.
    """

    DEAD_AFTER_S = 120.0  # no server answering this long: :meth:`dead` (a run stops rather than drop its tasks)

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
        self.router = Router(len(self.servers))
        self.model = model
        self.model_path = model_path or model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_model_len = max_model_len
        self.pause_mode = pause_mode
        self.weight_sync = weight_sync
        self.weight_dir = weight_dir
        self.initial_version = initial_version
        self._version = initial_version
        self._inflight: dict[str, _Request] = {}  # by our request id
        self._unanswered_since: float | None = None  # first "no server answered" since the last answer
        self._http: Any = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._update_lock: asyncio.Lock | None = None
        self._closed = False

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> "RemoteEngine":
        model = None if cfg.model == "tiny" else cfg.model
        return cls(cfg.urls, model=model, api_key=cfg.api_key, timeout_s=cfg.request_timeout_s,
                   max_retries=cfg.max_retries, max_model_len=cfg.max_model_len, pause_mode=cfg.pause_mode,
                   weight_sync=cfg.resolved_weight_sync(), weight_dir=cfg.weight_dir,
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
    def server_for(self, session_id: str) -> str | None:
        """The URL a session is pinned to (None before its first request)."""
        i = self.router.backend_for(session_id)
        return None if i is None else self.servers[i].url

    def end_session(self, session_id: str) -> None:
        """Forgets a finished trajectory's pin (the router also forgets the oldest pins by itself)."""
        self.router.end_session(session_id)

    # ---- InferenceEngine ------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The version of the last :meth:`update_weights` (or :meth:`set_version`); tokens carry the servers'."""
        return self._version

    def set_version(self, version: int) -> None:
        """Records the version new tokens will carry when something else pushed weights and relabelled the
        servers. Token versions themselves always come from the servers."""
        self._version = version

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None
    ) -> Generation:
        return await self._generate(prompt_ids, params, request_id, session_id, None)

    async def generate_streaming(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None,
        on_tokens: Callable[[list[int]], None],
    ) -> Generation:
        """:meth:`generate`, telling ``on_tokens`` each SSE chunk's new ids as the server sends them. A stream cut
        after ids were told raises :class:`RemoteEngineError` (they have no server-reported version, and what the
        caller was told cannot be taken back); one cut before any is retried as :meth:`generate` retries."""
        return await self._generate(prompt_ids, params, request_id, session_id, on_tokens)

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str, session_id: str | None,
                        tell: Callable[[list[int]], None] | None) -> Generation:
        """Streams a continuation of ``prompt_ids`` from one server. Returns ids, per-token log-probs, per-token
        versions as the server reports them (see the module docstring) and the finish reason; ``"abort"`` (server
        paused in abort mode, :meth:`abort`) keeps the tokens generated so far. Connection errors before any token
        is received are retried on another server up to ``max_retries`` times; a request the server rejects
        (HTTP 4xx) raises ``ValueError``."""
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
            i = self.router.pick(session_id)
            try:
                gen = await self._generate_on(i, list(prompt_ids), params, max_tokens, request_id, tell)
                self._unanswered_since = None
                return gen
            except _Retryable as e:
                self.router.mark_unhealthy(i)
                attempt += 1
                if attempt > self.max_retries or not any(self.router.healthy):
                    for k in range(len(self.servers)):
                        self.router.mark_healthy(k)  # give every server another chance next time
                    if self._unanswered_since is None:
                        self._unanswered_since = time.monotonic()
                    raise RemoteEngineError(f"request {request_id}: no server answered ({e})") from e

    def dead(self) -> str | None:
        """Servers may come back, but a run that waits on none for ``DEAD_AFTER_S`` stops: its failing episodes
        would otherwise give up task after task."""
        since = self._unanswered_since
        if since is not None and time.monotonic() - since >= self.DEAD_AFTER_S:
            return (f"no server answered for {time.monotonic() - since:.0f} s "
                    f"({', '.join(s.url for s in self.servers)})")
        return None

    def _body(self, prompt: list[int], params: SamplingParams, max_tokens: int, request_id: str,
              streamed: bool) -> dict[str, Any]:
        # The server sends the first token at once, then every stream_interval tokens, and the rest at the end: a
        # whole answer needs no chunks between (each one is parsed here).
        interval = params.stream_interval if streamed else max_tokens
        sp: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else 0,
            "logprobs": 0,  # the sampled token's log-probability only
            "ignore_eos": params.ignore_eos,
            "skip_special_tokens": False,  # stop strings may be special tokens (e.g. "<|im_end|>")
        }
        if interval > 1:
            sp["stream_interval"] = interval
        if params.stop:
            sp["stop"] = list(params.stop)
        else:  # text only to match stop strings: the server decodes none (output_mode "tokens" needs none)
            sp["detokenize"] = False
        if params.stop_token_ids:
            sp["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sp["seed"] = params.seed
        body: dict[str, Any] = {"request_id": request_id, "token_ids": prompt, "sampling_params": sp, "stream": True}
        if self.model is not None:
            body["model"] = self.model
        return body

    async def _generate_on(self, i: int, prompt: list[int], params: SamplingParams, max_tokens: int,
                           request_id: str, tell: Callable[[list[int]], None] | None = None) -> Generation:
        import aiohttp

        server = self.servers[i]
        req = _Request(server=i, tell=tell)
        self.router.started(i)
        req.task = asyncio.ensure_future(self._stream(server, self._body(prompt, params, max_tokens, request_id,
                                                                       tell is not None), req))
        self._inflight[request_id] = req
        try:
            await req.task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if not (req.task.cancelled() and req.aborted and (me is None or not me.cancelling())):
                req.task.cancel()
                raise
            # abort() closed a stream the server did not know by id yet: nothing with a version came back
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            if not req.token_ids and not req.aborted:
                raise _Retryable(str(e)) from e
        finally:
            self.router.finished(i)
            self._inflight.pop(request_id, None)
        versions = versions_from_spans(req.spans, len(req.token_ids), self.initial_version) if req.done else None
        if versions is None:
            # No final chunk (stream cut or closed): these tokens have no server-reported version, so none is
            # returned; the caller resubmits the prompt. Streamed ones were already told: that cannot be undone.
            if tell is not None and req.token_ids:
                raise RemoteEngineError(f"request {request_id}: the stream from {server.url} was cut after "
                                        f"{len(req.token_ids)} streamed tokens, before their versions")
            return Generation(token_ids=[], logprobs=[], versions=[], finish_reason="abort")
        finish = "abort" if req.aborted else req.finish
        reason = finish if finish in ("stop", "length", "abort") else ("abort" if finish is None else "stop")
        return Generation(token_ids=req.token_ids, logprobs=req.logprobs, versions=versions,
                          finish_reason=reason, stop_reason=req.stop_reason)  # type: ignore[arg-type]

    async def _stream(self, server: _Server, body: dict[str, Any], req: "_Request") -> None:
        """Reads the SSE stream of one request into ``req``; the final chunk carries the weight-version spans."""
        async with self._session().post(server.url + GENERATE_PATH, json=body) as r:
            if r.status >= 400:
                text = await r.text()
                if r.status >= 500:
                    raise _Retryable(f"HTTP {r.status}: {text[:300]}")
                if r.status in (403, 404):
                    raise RemoteEngineError(
                        f"{server.url}{GENERATE_PATH}: HTTP {r.status}: {text[:300]} -- agentrl's remote backend "
                        "needs vLLM >= 0.32 started with --enable-scale-out (token-in/token-out with weight versions)")
                raise ValueError(f"{server.url}{GENERATE_PATH} rejected request {body['request_id']}: "
                                 f"HTTP {r.status}: {text[:500]}")
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except JSON_ERRORS:
                    raise RemoteEngineError(f"{server.url}: request {body['request_id']}: a stream line is not JSON: "
                                            f"{data[:200]!r}") from None
                if not isinstance(chunk, dict):
                    raise RemoteEngineError(f"{server.url}: request {body['request_id']}: a stream chunk is not an "
                                            f"object: {data[:200]!r}")
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": chunk["error"]}
                    if 400 <= int(err.get("code") or 500) < 500:
                        raise ValueError(f"{server.url}{GENERATE_PATH} rejected request {body['request_id']}: "
                                         f"{err.get('message')}")
                    raise RemoteEngineError(f"{server.url}: request {body['request_id']} failed: {err.get('message')}")
                if req.server_id is None:
                    req.server_id = chunk.get("request_id")  # the server's id (vLLM prefixes ours)
                for choice in chunk.get("choices", []):
                    new = list(choice.get("token_ids") or [])
                    content = ((choice.get("logprobs") or {}).get("content")) or []
                    req.token_ids.extend(new)
                    if req.tell is not None and new:
                        req.tell(new)
                    req.logprobs.extend(float(c["logprob"]) if c.get("logprob") is not None else float("nan")
                                        for c in content[: len(new)])
                    req.logprobs.extend([float("nan")] * (len(new) - len(content)))
                    if choice.get("finish_reason") is not None:
                        req.finish, req.stop_reason = choice["finish_reason"], choice.get("stop_reason")
                        req.spans, req.done = choice.get("weight_versions"), True

    async def _abort_on(self, server: _Server, server_id: str | None) -> None:
        if server_id is None:
            return
        try:
            await self._post(server, ABORT_PATH, {"request_ids": [server_id]})
        except Exception:
            pass  # the request may have finished meanwhile

    async def abort(self, request_id: str) -> None:
        """Stops one request: the server aborts it and its ``generate`` returns the tokens so far (with their
        versions) and ``finish_reason == "abort"``. A request the server has not acknowledged yet is cut off (it
        returns no tokens). Only requests started from the same event loop can be aborted; unknown ids are
        ignored."""
        req = self._inflight.get(request_id)
        if req is None or req.task is None or req.task.done():
            return
        req.aborted = True
        if req.server_id is not None:
            await self._abort_on(self.servers[req.server], req.server_id)
        else:
            req.task.cancel()  # closing the stream makes the server abort the request

    async def update_weights(self, state_dict: dict[str, Any], version: int, *, pause_mode: str | None = None) -> int:
        """Pauses every server (``pause_mode`` or the engine's), loads ``state_dict`` per ``weight_sync``, sets
        the version label on the servers and here, resumes. Servers are resumed even if loading fails. Tokens
        sampled after the relabel carry ``version`` because the servers say so (module docstring). Returns the
        bytes sent to one server (0 when ``weight_sync`` loads nothing)."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, got {type(version).__name__}")
        mode = pause_mode or self.pause_mode
        if mode not in ("abort", "keep"):
            raise ValueError(f"pause_mode must be 'abort' or 'keep', got {mode!r}")
        payload: str | None = None
        path: str | None = None
        nbytes = 0
        if self.weight_sync in ("http", "file"):
            payload_bytes = await asyncio.to_thread(self._serialize, state_dict)
            nbytes = len(payload_bytes)
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
        return nbytes

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
class _Request:
    """One request in flight: the server it went to, its stream task, the server's id for it, what came back."""

    server: int
    task: asyncio.Task[Any] | None = None
    server_id: str | None = None
    tell: Callable[[list[int]], None] | None = None  # generate_streaming's on_tokens
    aborted: bool = False
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: Any = None
    done: bool = False  # the final chunk (with finish reason and version spans) arrived
    finish: str | None = None
    stop_reason: Any = None


class _Retryable(Exception):
    """The server could not be reached (or failed with 5xx) before any token arrived."""


def new_request_id() -> str:
    return uuid.uuid4().hex
