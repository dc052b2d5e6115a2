"""The gateway's typed config (``gateway:`` in YAML, or built in Python).

::

    host: 127.0.0.1          # any other address needs api_key
    port: 8000               # 0: a free port (the server reports the one it got)
    api_key: null            # clients send "Authorization: Bearer <api_key>" (or "<api_key>:<session>")
    model_name: null         # the name clients ask for; null: the model directory's name ("tiny" for the tiny model)
    model_aliases: []        # other names served as it (shell patterns: "claude-*", "gpt-*"; "*": any name)
    max_request_bytes: 8388608
    max_tokens: null         # cap on a request's max_tokens; null: the engine's max_model_len
    max_n: 8
    max_sessions: 1024
    max_session_tokens: 1000000
    session_idle_s: 3600
    stream_interval: 1       # a streamed answer's tokens per delta after the first (1: every token as sampled)
    sampling: client         # client: the request's temperature/top_p/top_k; config: the fields below, always
    temperature: 1.0
    top_p: 1.0
    top_k: -1
    out: null                # JSONL file the finished sessions' trajectories are appended to
    allowed_hosts: null      # Host names clients reach the server by; null: loopback names + host ("*": any)
    allowed_origins: []      # browser origins allowed to call the API (requests with any other Origin: 403)
    idle_timeout_s: 15       # a connection without a complete request header for this long is closed
    body_timeout_s: 60       # a request body not received within this: 408
    render_timeout_s: 30     # rendering + tokenizing one request's prompt (in a worker thread): else 503
    chat: {family: auto}     # agentrl.chat.ChatConfig
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.chat import ChatConfig

LOOPBACK = ("127.0.0.1", "::1", "localhost")
ISSUED_PREFIX = "sk-agentrl-"  # the keys Gateway.open_session issues; a token with it that is not live is refused


@dataclass
class GatewayConfig:
    """How the gateway listens, what it bounds and how it samples (see the module docstring for the YAML form).

    ``sampling: config`` makes every request sample with ``temperature``/``top_p``/``top_k`` whatever the client
    asks (training: the behaviour policy is the one the trainer's ratios assume); ``client`` takes the request's
    values (these fields are then the defaults for requests that give none). ``max_resubmits``: aborted engine
    requests (weight updates in abort mode) of one completion that are resubmitted with the tokens so far.
    ``keepalive_s``: a streaming response sends an SSE comment this often while the completion is being generated.
    ``stream_interval``: a streamed answer's first token is sent at once, the rest in deltas of this many tokens
    (vLLM's ``--stream-interval``); each delta costs the engine's front end, the gateway and the client one event.
    ``chat``: the model family and template options; its ``template_mode`` is not used, because the gateway never
    changes what a harness sends: a conversation the template renders differently from the session's tokens starts
    a new segment (the agent loop's ``split``). Metrics are cumulative since the gateway started.

    Exposure (:mod:`agentrl.gateway.guard`): ``allowed_hosts`` are the names (no port) a request's ``Host`` may
    carry, on the bound port (421 otherwise: DNS rebinding); ``None`` means the loopback names plus ``host``, or
    any name when ``host`` is a wildcard (0.0.0.0, ::), which requires ``api_key``. ``allowed_origins`` lists the
    browser origins (``scheme://host[:port]``) whose requests are served (with CORS headers, so their pages can
    read the answers); requests with any other ``Origin`` are refused. ``model_aliases``: model names (shell patterns)
    a request may ask for and still be served this model, for harnesses whose model name is fixed or checked
    (Claude Code asks for ``claude-*``); empty: only ``model_name``. ``idle_timeout_s`` closes connections that send no complete request header in time (slow or idle
    clients, before any key is checked); ``body_timeout_s`` bounds reading a body; ``render_timeout_s`` bounds
    rendering and tokenizing a prompt, which run in a worker thread so that the event loop keeps serving.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_name: str | None = None
    model_aliases: list[str] = field(default_factory=list)
    max_request_bytes: int = 8 * 1024 * 1024
    max_tokens: int | None = None
    max_n: int = 8
    max_sessions: int = 1024
    max_session_tokens: int = 1_000_000
    session_idle_s: float = 3600.0
    sampling: Literal["client", "config"] = "client"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_resubmits: int = 64
    keepalive_s: float = 15.0
    stream_interval: int = 1
    out: str | None = None
    allowed_hosts: list[str] | None = None
    allowed_origins: list[str] = field(default_factory=list)
    idle_timeout_s: float = 15.0
    body_timeout_s: float = 60.0
    render_timeout_s: float = 30.0
    chat: ChatConfig = field(default_factory=ChatConfig)

    def validate(self) -> None:
        if self.host not in LOOPBACK and not self.api_key:
            raise ValueError(f"api_key: binding to {self.host!r} (reachable from other machines) requires an API key; "
                             f"set api_key (or bind to 127.0.0.1)")
        if self.api_key is not None and (len(self.api_key) < 8 or ":" in self.api_key or not self.api_key.isascii()
                                         or not self.api_key.isprintable() or self.api_key.startswith(ISSUED_PREFIX)):
            raise ValueError(f"api_key must be at least 8 printable ASCII characters without ':' (':' separates a "
                             f"session id), not starting with {ISSUED_PREFIX!r} (the issued session keys' prefix)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("max_request_bytes", "max_n", "max_sessions", "max_session_tokens", "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or null, got {self.max_tokens}")
        for name in ("session_idle_s", "keepalive_s", "idle_timeout_s", "body_timeout_s", "render_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.allowed_hosts is not None and (not isinstance(self.allowed_hosts, list) or not all(
                isinstance(h, str) and h and h.count(":") != 1 for h in self.allowed_hosts)):
            raise ValueError(f"allowed_hosts must be a list of host names without a port (or '*'), got "
                             f"{self.allowed_hosts!r:.200}")
        if not isinstance(self.allowed_origins, list) or not all(isinstance(o, str) for o in self.allowed_origins):
            raise ValueError(f"allowed_origins must be a list of origins such as 'https://app.example', got "
                             f"{self.allowed_origins!r:.200}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"temperature >= 0, top_p in (0, 1], top_k -1 or >= 1; got {self.temperature}, "
                             f"{self.top_p}, {self.top_k}")
        if self.max_resubmits < 0:
            raise ValueError(f"max_resubmits must be >= 0, got {self.max_resubmits}")
        if not isinstance(self.model_aliases, list) or not all(isinstance(a, str) and a for a in self.model_aliases):
            raise ValueError(f"model_aliases must be a list of model names or patterns such as 'claude-*', got "
                             f"{self.model_aliases!r:.200}")
        self.chat.validate()
