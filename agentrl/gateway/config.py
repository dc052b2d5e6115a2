"""The gateway's typed config (``gateway:`` in YAML, or built in Python).

::

    host: 127.0.0.1          # any other address needs api_key
    port: 8000               # 0: a free port (the server reports the one it got)
    api_key: null            # clients send "Authorization: Bearer <api_key>" (or "<api_key>:<session>")
    model_name: null         # the name clients ask for; null: the model directory's name ("tiny" for the tiny model)
    max_request_bytes: 8388608
    max_tokens: null         # cap on a request's max_tokens; null: the engine's max_model_len
    max_n: 8
    max_sessions: 1024
    max_session_tokens: 1000000
    session_idle_s: 3600
    sampling: client         # client: the request's temperature/top_p/top_k; config: the fields below, always
    temperature: 1.0
    top_p: 1.0
    top_k: -1
    out: null                # JSONL file the finished sessions' trajectories are appended to
    chat: {family: auto}     # agentrl.chat.ChatConfig
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.chat import ChatConfig

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass
class GatewayConfig:
    """How the gateway listens, what it bounds and how it samples (see the module docstring for the YAML form).

    ``sampling: config`` makes every request sample with ``temperature``/``top_p``/``top_k`` whatever the client
    asks (training: the behaviour policy is the one the trainer's ratios assume); ``client`` takes the request's
    values (these fields are then the defaults for requests that give none). ``max_resubmits``: aborted engine
    requests (weight updates in abort mode) of one completion that are resubmitted with the tokens so far.
    ``keepalive_s``: a streaming response sends an SSE comment this often while the completion is being generated.
    ``chat``: the model family and template options; its ``template_mode`` is not used, because the gateway never
    changes what a harness sends: a conversation the template renders differently from the session's tokens starts
    a new segment (the agent loop's ``split``). Metrics are cumulative since the gateway started.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_name: str | None = None
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
    out: str | None = None
    chat: ChatConfig = field(default_factory=ChatConfig)

    def validate(self) -> None:
        if self.host not in LOOPBACK and not self.api_key:
            raise ValueError(f"api_key: binding to {self.host!r} (reachable from other machines) requires an API key; "
                             f"set api_key (or bind to 127.0.0.1)")
        if self.api_key is not None and (len(self.api_key) < 8 or ":" in self.api_key):
            raise ValueError("api_key must be at least 8 characters without ':' (':' separates a session id)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("max_request_bytes", "max_n", "max_sessions", "max_session_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or null, got {self.max_tokens}")
        if self.session_idle_s <= 0 or self.keepalive_s <= 0:
            raise ValueError("session_idle_s and keepalive_s must be > 0")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"temperature >= 0, top_p in (0, 1], top_k -1 or >= 1; got {self.temperature}, "
                             f"{self.top_p}, {self.top_k}")
        if self.max_resubmits < 0:
            raise ValueError(f"max_resubmits must be >= 0, got {self.max_resubmits}")
        self.chat.validate()
