"""Any OpenEnv environment server as an agentrl env: ``agentrl.make("openenv/Client-v0", url="http://HOST:PORT")``.

Flow: ``reset`` opens a WebSocket session at ``<url>/ws`` (one per episode: OpenEnv's ``POST /reset`` and ``/step``
build a fresh env per request, so only the session keeps an episode) and sends ``{"type": "reset", "data":
{"seed": ...}}``; each ``step`` sends ``{"type": "step", "data": <the action>}``, made from the model's text per the
action schema the server publishes at ``/schema`` (:mod:`.openenv_actions`: one text field gets the text as is, a
number, boolean or list field the value answered, several fields a JSON object; ``action_field`` names a text field
and skips ``/schema``). A turn that does not fit the schema, or that the server refuses as invalid
(``VALIDATION_ERROR``), is an invalid-action observation with ``invalid_reward``, and the episode goes on; when the
action is not plain text, a system message says what to answer (unless ``system_prompt`` is given). Replies are
``{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}``: ``reward`` (None counts 0) and
``done`` (terminated; ``truncated`` when the observation says so) come from it, and the observation becomes the chat
messages: its ``messages`` when it carries chat messages (an agentrl env served by ``agentrl envs serve``), else
``observation_field``, else its one non-empty string field, else the observation as JSON, in a user message.

Invariants: every network wait is bounded (``connect_timeout_s``, ``call_timeout_s``); a refused connection, a
timeout, a session the server closes, an ``error`` reply or a reply outside the protocol raises
:class:`OpenEnvError` naming the server and the request (a failed episode in the manager), and the session is
closed. It has no ``task_key(seed)`` (that would take a server round trip per seed): ``info["task_key"]`` of
``reset`` is the served env's own ``task_key`` when its reset info has one, else
``openenv:<sha256 of the opening messages>``.
"""

from __future__ import annotations

import hashlib
import json
import math
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

from agentrl.core import Env, Message, StepResult
from agentrl.envs.bridges.openenv_actions import ActionShape, InvalidAction, action_shape, build_action
from agentrl.tools import JSON_ERRORS

try:
    from websockets.exceptions import ConnectionClosed, WebSocketException
    from websockets.sync.client import connect
except ImportError as e:  # an optional extra: say which
    raise ImportError(f"OpenEnv client envs need websockets: pip install 'agentrl[openenv]' ({e})") from e


class OpenEnvError(RuntimeError):
    """The OpenEnv server failed: unreachable, too slow, closed the session, or answered outside the protocol."""


class OpenEnvClientEnv(Env):
    """An episode of a remote OpenEnv environment over its WebSocket session (see the module docstring).

    kwargs: ``url`` (the server's base URL, ``http://`` or ``ws://``), ``action_field`` (default: from
    ``/schema``), ``observation_field`` (default: see the module docstring), ``system_prompt`` (a system message
    before the first observation, for servers whose observations do not say what to answer), ``reset_data``
    (extra fields of every reset message), ``invalid_reward`` (0: the reward of an action that does not fit the
    schema), ``connect_timeout_s`` (30), ``call_timeout_s`` (60).
    """

    description = "A remote OpenEnv environment over its /ws WebSocket session (kwarg url=http://HOST:PORT)"

    def __init__(self, url: str, action_field: str | None = None, observation_field: str | None = None,
                 system_prompt: str | None = None, reset_data: dict[str, Any] | None = None,
                 invalid_reward: float = 0.0, connect_timeout_s: float = 30.0, call_timeout_s: float = 60.0):
        super().__init__()
        parsed = urlparse(str(url))
        if parsed.scheme not in ("http", "https", "ws", "wss") or not parsed.netloc:
            raise ValueError(f"OpenEnvClientEnv: url must look like http://HOST:PORT, got {url!r}")
        for name, value in (("connect_timeout_s", connect_timeout_s), ("call_timeout_s", call_timeout_s)):
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"OpenEnvClientEnv: {name} must be in (0, 3600] seconds, got {value!r}")
        secure = parsed.scheme in ("https", "wss")
        base = parsed._replace(path=parsed.path.rstrip("/"), query="", fragment="")
        self.http_url = base._replace(scheme="https" if secure else "http").geturl()
        self.ws_url = base._replace(scheme="wss" if secure else "ws").geturl() + "/ws"
        self.action_field, self.observation_field = action_field, observation_field
        self.shape: ActionShape | None = ActionShape(action_field, "string", (), "") if action_field else None
        self.invalid_reward = float(invalid_reward)
        self.system_prompt, self.reset_data = system_prompt, dict(reset_data or {})
        self.connect_timeout_s, self.call_timeout_s = float(connect_timeout_s), float(call_timeout_s)
        self._ws: Any = None
        self.current_key = ""

    # -- the wire -------------------------------------------------------------------------------------------------
    def _schema_shape(self) -> ActionShape:
        try:
            with urllib.request.urlopen(self.http_url + "/schema", timeout=self.connect_timeout_s) as resp:
                return action_shape(json.loads(resp.read())["action"])
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise OpenEnvError(f"OpenEnv server {self.http_url}: cannot read the action schema at /schema: "
                               f"{type(e).__name__}: {e}") from e

    def _request(self, message: dict[str, Any], what: str, invalid_ok: bool = False) -> dict[str, Any]:
        try:
            try:
                self._ws.send(json.dumps(message))
            except ConnectionClosed:
                pass  # a server that refuses the session sends why, then closes: recv gives the reason if it came
            raw = self._ws.recv(timeout=self.call_timeout_s)
        except TimeoutError:
            self._drop()
            raise OpenEnvError(f"OpenEnv server {self.ws_url} did not answer {what} within "
                               f"{self.call_timeout_s:g} s") from None
        except (ConnectionClosed, WebSocketException, OSError) as e:
            self._drop()
            raise OpenEnvError(f"OpenEnv server {self.ws_url} closed the session during {what}: "
                               f"{type(e).__name__}: {e}") from e
        try:
            reply = json.loads(raw)
        except (TypeError, *JSON_ERRORS):
            self._drop()
            raise OpenEnvError(f"OpenEnv server {self.ws_url} answered {what} with something that is not JSON: "
                               f"{str(raw)[:80]!r}") from None
        kind = reply.get("type") if isinstance(reply, dict) else None
        if kind == "error":
            data = reply.get("data") if isinstance(reply.get("data"), dict) else {}
            if invalid_ok and data.get("code") == "VALIDATION_ERROR":  # the model's action, not the server: go on
                errors = data.get("errors") if isinstance(data.get("errors"), list) else []
                why = "; ".join(str(e.get("msg", e))[:100] for e in errors[:3] if isinstance(e, dict))
                raise InvalidAction(f"the server refused the action: {str(data.get('message'))[:100]}"
                                    + (f" ({why})" if why else ""))
            self._drop()
            raise OpenEnvError(f"OpenEnv server {self.ws_url} refused {what}: "
                               f"{data.get('code', '?')}: {str(data.get('message', reply))[:300]}")
        data = reply.get("data") if kind == "observation" else None
        if not isinstance(data, dict) or not isinstance(data.get("observation"), dict):
            self._drop()
            raise OpenEnvError(f"OpenEnv server {self.ws_url} answered {what} outside the protocol: {str(reply)[:120]!r}")
        return data

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # already broken: nothing more to release
                pass

    # -- observations ---------------------------------------------------------------------------------------------
    def _messages(self, observation: dict[str, Any]) -> list[Message]:
        chat = observation.get("messages")
        if isinstance(chat, list) and chat and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in chat):
            return [dict(m) for m in chat]
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise OpenEnvError(f"OpenEnv server {self.ws_url}: the observation has no field "
                                   f"{self.observation_field!r} (fields: {sorted(observation)})")
            value = observation[self.observation_field]
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        else:
            strings = [v for v in observation.values() if isinstance(v, str) and v]
            text = strings[0] if len(strings) == 1 else json.dumps(observation, sort_keys=True, default=repr)
        return [{"role": "user", "content": text}]

    # -- gymnasium API --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Opens a new WebSocket session (closing the last one) and resets the remote env."""
        super().reset(seed=seed)
        self.close()
        if self.shape is None:
            self.shape = self._schema_shape()
            self.action_field = self.shape.field
        try:
            # Entered by hand: the connection outlives this call (the episode), and close() ends it.
            self._ws = connect(self.ws_url, open_timeout=self.connect_timeout_s, close_timeout=5).__enter__()
        except (OSError, TimeoutError, WebSocketException) as e:
            raise OpenEnvError(f"OpenEnv server {self.ws_url}: cannot open a session: {type(e).__name__}: {e}") from e
        data = {**self.reset_data, **({"seed": seed} if seed is not None else {})}
        if options and options.get("task") is not None:
            data["task"] = options["task"]
        reply = self._request({"type": "reset", "data": data}, "reset")
        obs = self._messages(reply["observation"])
        system = self.system_prompt or self.shape.hint()
        if system:
            obs = [{"role": "system", "content": system}] + obs
        info = reply["observation"].get("info")
        info = dict(info) if isinstance(info, dict) else {}
        # The served env's own content key when it has one (an agentrl env behind `agentrl envs serve`), else the
        # opening's: content, not the server's address, so the same task served elsewhere keeps its key.
        key = info.get("task_key")
        digest = hashlib.sha256(json.dumps(obs, sort_keys=True).encode()).hexdigest()[:16]
        self.current_key = key if isinstance(key, str) and key else f"openenv:{digest}"
        return obs, {**info, "task_key": self.current_key}

    def step(self, action: str) -> StepResult:
        """Sends the action made from the model's text; the reply's reward and done end the step."""
        if self._ws is None or self.shape is None:
            raise OpenEnvError(f"OpenEnv server {self.ws_url}: no open session (call reset first)")
        try:
            reply = self._request({"type": "step", "data": build_action(self.shape, str(action))}, "step",
                                  invalid_ok=True)
        except InvalidAction as e:
            hint = self.shape.hint()
            return ([{"role": "user", "content": f"Invalid action: {e}." + (f" {hint}" if hint else "")}],
                    self.invalid_reward, False, False, {"invalid_action": str(e), "task_key": self.current_key})
        observation = reply["observation"]
        reward = reply.get("reward")
        if reward is None:
            reward = 0.0
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            self._drop()
            raise OpenEnvError(f"OpenEnv server {self.ws_url} answered step with reward {reward!r}, not a finite number")
        done = bool(reply.get("done"))
        truncated = done and bool(observation.get("truncated"))
        info = observation.get("info")
        info = {**(info if isinstance(info, dict) else {}), "task_key": self.current_key}
        messages = self._messages(observation)
        if done:
            self.close()  # the session is the episode
        return messages, float(reward), done and not truncated, truncated, info

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
            except Exception:  # the server may be gone already
                pass
            self._drop()
