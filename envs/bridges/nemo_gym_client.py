"""A NeMo Gym Gymnasium-style resources server as an agentrl env:
``agentrl.make("nemo_gym/Gymnasium-v0", url="http://HOST:PORT", tasks="rows.jsonl")``.

The wire is NeMo Gym's own (``resources_servers/gymnasium/base.py`` and ``responses_api_agents/gymnasium_agent`` in
the nemo-gym 0.7.0 wheel), spoken by this client without importing nemo-gym (it needs Python >= 3.13 and pins that
cannot share agentrl's venv):

- ``POST /reset`` with a task row (``{"responses_create_params": {"input": [...]}, ...extra fields}``) answers
  ``{"observation": str | null, "info": {...}}``; the server's session middleware sets a cookie, and the episode is
  that cookie (a fresh cookie jar per episode).
- ``POST /step`` with the row plus ``"response"``: an OpenAI Responses object whose ``output`` holds the model's
  message (``output_text``), answers ``{"observation", "reward", "terminated", "truncated", "info"}``; tool results
  come as ``info["tool_outputs"]`` (``{"call_id", "output"}``). The server drops the session when the episode ends.
- ``POST /close`` only when reset's ``info["supports_explicit_close"]`` is true.

Flow: ``reset(seed)`` takes row ``seed % len(rows)``; the row's input messages, then the reset observation as a user
message, open the episode. Each ``step`` sends the model's text and returns tool outputs as tool messages and the
observation as a user message.

Invariants: every request is bounded (``call_timeout_s``); a refused connection, a timeout, an HTTP error (FastAPI's
422 for a request outside the schema), a reply that is not JSON or lacks the fields, or a non-finite reward raises
:class:`NeMoGymError` naming the server, the endpoint and what came back: a failed episode, never a hung manager.
``task_key(seed)`` is the rows file's name and the row's hash (no server needed). Whether a seed reproduces an
episode is the server's business: NeMo Gym's reset gets no seed (its blackjack deals from an unseeded ``Random``).
The HTTP calls (:func:`post`, :func:`post_json`) and the row helpers are shared with the env of NeMo Gym's tool +
``/verify`` servers, :mod:`agentrl.envs.bridges.nemo_gym_tools`.
"""

from __future__ import annotations

import hashlib
import http.client
import http.cookiejar
import json
import math
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agentrl.core import Env, Message, StepResult
from agentrl.tools import JSON_ERRORS, json_error


class NeMoGymError(RuntimeError):
    """The NeMo Gym server failed: unreachable, too slow, an HTTP error, or a reply outside the protocol."""


#: The most bytes read from one reply: a server streaming without end fails the call instead of filling memory.
MAX_REPLY_BYTES = 4 << 20


def row_key(tasks_path: Path, row: dict[str, Any]) -> str:
    """A task row's content identity: the rows file's name and the row's hash (``task_key``; no server needed)."""
    return f"nemo_gym/{tasks_path.stem}:{hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()[:16]}"


def check_endpoint(who: str, url: Any, call_timeout_s: Any) -> tuple[str, float]:
    """``url`` (http(s)://HOST:PORT, no trailing slash) and ``call_timeout_s`` (in (0, 3600]) checked for ``who``."""
    parsed = urlparse(str(url))
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{who}: url must look like http://HOST:PORT, got {url!r}")
    if isinstance(call_timeout_s, bool) or not isinstance(call_timeout_s, (int, float)) or not 0 < call_timeout_s <= 3600:
        raise ValueError(f"{who}: call_timeout_s must be in (0, 3600] seconds, got {call_timeout_s!r}")
    return str(url).rstrip("/"), float(call_timeout_s)


def post(opener: urllib.request.OpenerDirector, url: str, path: str, body: Any, timeout_s: float) -> tuple[int, bytes]:
    """POSTs ``body`` as JSON; returns ``(HTTP status, reply bytes)`` for any answer, error statuses included.
    Raises :class:`NeMoGymError` when no answer comes (refused, reset, timed out) or it exceeds
    :data:`MAX_REPLY_BYTES`."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        try:
            resp = opener.open(req, timeout=timeout_s)
        except urllib.error.HTTPError as e:  # an answer all the same: the caller decides what a status means
            resp = e
        with resp:
            status, raw = resp.getcode(), resp.read(MAX_REPLY_BYTES + 1)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # HTTPException: a cut or non-HTTP reply
        reason = getattr(e, "reason", e)
        raise NeMoGymError(f"NeMo Gym server {url}: POST {path} failed: {type(reason).__name__}: {reason}") from None
    if len(raw) > MAX_REPLY_BYTES:
        raise NeMoGymError(f"NeMo Gym server {url}: POST {path} answered more than {MAX_REPLY_BYTES} bytes")
    return status, raw


def post_json(opener: urllib.request.OpenerDirector, url: str, path: str, body: Any, timeout_s: float) -> dict[str, Any]:
    """:func:`post` for an endpoint that must answer a JSON object with a success status (NeMo Gym's own agents
    ``raise_for_status`` on these); anything else raises :class:`NeMoGymError` naming what came back."""
    status, raw = post(opener, url, path, body, timeout_s)
    if status >= 400:
        detail = raw[:300].decode(errors="replace")
        raise NeMoGymError(f"NeMo Gym server {url}: POST {path} answered HTTP {status}: {detail}")
    try:
        reply = json.loads(raw)
    except JSON_ERRORS:
        raise NeMoGymError(f"NeMo Gym server {url}: POST {path} answered with something that is not JSON: "
                           f"{raw[:80]!r}") from None
    if not isinstance(reply, dict):
        raise NeMoGymError(f"NeMo Gym server {url}: POST {path} answered {str(reply)[:80]!r}, not an object")
    return reply


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """A NeMo Gym JSONL of task rows; each needs ``responses_create_params.input`` (a string or messages)."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except JSON_ERRORS as e:
            raise ValueError(f"{path}:{n}: not JSON: {json_error(e)}") from None
        params = row.get("responses_create_params") if isinstance(row, dict) else None
        if not isinstance(params, dict) or not isinstance(params.get("input"), (str, list)):
            raise ValueError(f"{path}:{n}: a row needs responses_create_params.input (a string or a message list)")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no task rows")
    return rows


def input_messages(value: str | list[Any]) -> list[Message]:
    """A row's ``responses_create_params.input`` as chat messages: a string is one user message; of a list, the
    messages with text (``developer`` read as ``system``); other items (earlier calls and their outputs) are left out."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[Message] = []
    for m in value:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # Responses-API content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        role = m.get("role") if isinstance(m, dict) else None
        if role in ("system", "developer", "user", "assistant") and isinstance(content, str):
            # the Responses API's "developer" is the system prompt of a chat template
            out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def response_object(text: str, model: str = "agentrl") -> dict[str, Any]:
    """The model's turn as the OpenAI Responses object NeMo Gym's ``/step`` validates (``NeMoGymResponse``)."""
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": time.time(), "model": model,
        "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [{"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
    }


class NeMoGymEnv(Env):
    """An episode of a NeMo Gym Gymnasium-style resources server (see the module docstring). kwargs: ``url``,
    ``tasks`` (JSONL rows), ``call_timeout_s`` (60)."""

    description = "A NeMo Gym Gymnasium-style resources server (/reset + /step; kwargs url=, tasks=)"

    def __init__(self, url: str, tasks: str, call_timeout_s: float = 60.0):
        super().__init__()
        self.url, self.call_timeout_s = check_endpoint("NeMoGymEnv", url, call_timeout_s)
        self.tasks_path = Path(tasks)
        self.rows = load_rows(self.tasks_path)
        self._opener: urllib.request.OpenerDirector | None = None
        self.row: dict[str, Any] = self.rows[0]
        self.explicit_close = False
        self.current_key = ""

    def task_key(self, seed: int) -> str:
        return row_key(self.tasks_path, self.rows[seed % len(self.rows)])

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self._opener is not None
        return post_json(self._opener, self.url, path, body, self.call_timeout_s)

    @staticmethod
    def _observation(reply: dict[str, Any], where: str) -> str | None:
        obs = reply.get("observation")
        if obs is not None and not isinstance(obs, str):
            raise NeMoGymError(f"{where}: observation must be a string or null, got {type(obs).__name__}")
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        self.close()
        index = seed % len(self.rows) if seed is not None else int(self.np_random.integers(len(self.rows)))
        self.row = self.rows[index]
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        reply = self._post("/reset", self.row)
        obs_text = self._observation(reply, f"NeMo Gym server {self.url}: /reset")
        info = reply.get("info") if isinstance(reply.get("info"), dict) else {}
        self.explicit_close = info.get("supports_explicit_close") is True
        obs = input_messages(self.row["responses_create_params"]["input"])
        if obs_text:
            obs.append({"role": "user", "content": obs_text})
        self.current_key = self.task_key(index)
        return obs, {**info, "task_key": self.current_key, "row": index}

    def step(self, action: str) -> StepResult:
        if self._opener is None:
            raise NeMoGymError(f"NeMo Gym server {self.url}: no open episode (call reset first)")
        reply = self._post("/step", {**self.row, "response": response_object(str(action))})
        where = f"NeMo Gym server {self.url}: /step"
        obs_text = self._observation(reply, where)
        reward = reply.get("reward", 0.0)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise NeMoGymError(f"{where} answered reward {reward!r}, not a finite number")
        terminated, truncated = reply.get("terminated", False), reply.get("truncated", False)
        if not isinstance(terminated, bool) or not isinstance(truncated, bool):
            raise NeMoGymError(f"{where}: terminated and truncated must be booleans, got {terminated!r}, {truncated!r}")
        info = reply.get("info") if isinstance(reply.get("info"), dict) else {}
        out: list[Message] = [{"role": "tool", "content": str(t.get("output", ""))}
                              for t in info.get("tool_outputs") or () if isinstance(t, dict)]
        if obs_text:
            out.append({"role": "user", "content": obs_text})
        if terminated or truncated:
            self.close()
        return out, float(reward), terminated, truncated, {**info, "task_key": self.current_key}

    def close(self) -> None:
        if self._opener is not None and self.explicit_close:
            try:
                self._post("/close", {})
            except NeMoGymError:  # the episode is over either way; the server reaps what it holds
                pass
        self._opener, self.explicit_close = None, False
