"""Any agentrl env served as an OpenEnv environment server: ``agentrl envs serve ID [key=value ...]``.

The server is openenv-core's own (``create_fastapi_app``: ``/reset``, ``/step``, ``/state``, ``/schema``,
``/health`` and the ``/ws`` WebSocket session), so OpenEnv's clients (``EnvClient`` subclasses such as the one
``openenv init`` writes, ``GenericEnvClient``, trl's OpenEnv integration) work against it unchanged. Each WebSocket
session gets its own agentrl env (``agentrl.make(ID, **kwargs)``), whose sync ``reset``/``step`` openenv-core runs on
that session's own executor thread; the session's end closes the env.

Wire format: the action is ``{"message": <the model's text>}`` (the field name of the echo template's action, so its
client drives any agentrl env); the observation is ``{"messages": [chat messages to append], "truncated": bool,
"info": {...}}`` with ``reward`` and ``done`` (terminated or truncated) beside it, as openenv-core serialises every
observation. ``reset`` takes ``seed`` (and ``task``, passed as ``options={"task": ...}``). A session's env steps only
between its reset and its episode's end: a step before the reset or after ``done`` (and so openenv-core's stateless
HTTP ``/step``, a fresh env per request) is refused, 409 over HTTP and an error frame over ``/ws``, the env untouched.

:func:`serve` puts the server behind agentrl's Host and Origin rules (:func:`guarded`): a web page on another site,
or one reaching loopback through a rebound DNS name, is refused (403 / 421), while OpenEnv's clients, which send no
``Origin``, are served.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from pydantic import Field

try:
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from fastapi import HTTPException
    from starlette.websockets import WebSocketDisconnect
except ImportError as e:  # an optional extra: say which
    raise ImportError(f"serving OpenEnv needs openenv-core: pip install 'agentrl[openenv]' ({e})") from e

from agentrl.core import Env, as_messages
from agentrl.netguard import ASGIGuard, HostCheck, default_hosts
from agentrl.registration import make


class AgentrlAction(Action):
    """The model's text for one step."""

    message: str = Field(..., description="the model's message (its whole turn, as text)")


class AgentrlObservation(Observation):
    """The chat messages the env appends after a reset or a step."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="chat messages: {role, content, ...}")
    truncated: bool = Field(default=False, description="the episode was cut short (done is set too)")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict (JSON-safe)")


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def _observation(obs: Any, info: dict[str, Any], reward: float = 0.0, terminated: bool = False,
                 truncated: bool = False) -> AgentrlObservation:
    return AgentrlObservation(messages=as_messages(obs), truncated=bool(truncated), info=_json_safe(info),
                              done=bool(terminated or truncated), reward=float(reward))


def environment_class(env_id: str, env_kwargs: dict[str, Any] | None = None, native_async: bool = False) -> type:
    """An OpenEnv ``Environment`` class wrapping fresh ``agentrl.make(env_id, **env_kwargs)`` envs.

    A sync env runs on its session's own executor thread (openenv-core's): ``reset`` and ``step`` of one episode
    always on the same thread, as thread-bound libraries need. An env whose async methods are its own
    (``native_async``) is awaited on the server's loop instead."""
    kwargs = dict(env_kwargs or {})

    class AgentrlEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # one agentrl env per session, nothing shared

        def __init__(self) -> None:
            super().__init__()
            self.env = make(env_id, **kwargs)
            self._state = State(episode_id=None, step_count=0)
            self._playing = False  # reset and not done: the only state in which the env may step

        def reset(self, seed: int | None = None, episode_id: str | None = None, task: Any = None,
                  **_: Any) -> AgentrlObservation:
            self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
            self._playing = False
            out = _observation(*self.env.reset(seed=seed, options={"task": task} if task is not None else None))
            self._playing = True
            return out

        def step(self, action: AgentrlAction, timeout_s: float | None = None, **_: Any) -> AgentrlObservation:
            self._before_step()
            obs, reward, terminated, truncated, info = self.env.step(action.message)
            return self._after_step(_observation(obs, info, reward, terminated, truncated))

        def _before_step(self) -> None:
            # An agentrl env steps only between its reset and its end (as gymnasium's OrderEnforcing has it); an
            # OpenEnv client may do otherwise, and openenv-core's HTTP /step always does (a fresh env per request).
            if not self._playing:  # 409 on HTTP; on /ws openenv-core sends it as an error frame with this text
                raise HTTPException(409, (
                    "no episode to step: reset it first (an episode lives in one /ws session; HTTP /step makes a "
                    "fresh env per request)" if self._state.episode_id is None else
                    f"episode {self._state.episode_id} is over (done); reset to start another"))
            self._state.step_count += 1

        def _after_step(self, out: AgentrlObservation) -> AgentrlObservation:
            self._playing = not out.done
            return out

        @property
        def state(self) -> State:
            return self._state

        def close(self) -> None:
            self.env.close()

    if native_async:
        async def reset_async(self: Any, seed: int | None = None, episode_id: str | None = None, task: Any = None,
                              **_: Any) -> AgentrlObservation:
            self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
            self._playing = False
            out = _observation(*await self.env.areset(seed=seed, options={"task": task} if task is not None else None))
            self._playing = True
            return out

        async def step_async(self: Any, action: AgentrlAction, timeout_s: float | None = None,
                             **_: Any) -> AgentrlObservation:
            self._before_step()
            obs, reward, terminated, truncated, info = await self.env.astep(action.message)
            return self._after_step(_observation(obs, info, reward, terminated, truncated))

        AgentrlEnvironment.reset_async, AgentrlEnvironment.step_async = reset_async, step_async

    AgentrlEnvironment.__name__ = AgentrlEnvironment.__qualname__ = f"Agentrl[{env_id}]"
    return AgentrlEnvironment


class QuietDisconnects:
    """ASGI wrapper: a WebSocket session whose client has left ends quietly. openenv-core's ``/ws`` handler closes
    the socket after its client is gone, which raises ``WebSocketDisconnect`` out of the app, and uvicorn logged that
    as an "Exception in ASGI application" traceback at the end of every session, drowning real errors."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass  # the client is gone: nobody to answer, nothing lost (the session's env is closed by then)


def make_app(env_id: str, env_kwargs: dict[str, Any] | None = None, max_sessions: int = 64) -> Any:
    """The ASGI app serving ``env_id`` (checked by making one env first, so a bad id or kwarg fails here)."""
    probe = make(env_id, **(env_kwargs or {}))
    native_async = type(probe.unwrapped).areset is not Env.areset  # its own async methods: await them
    probe.close()
    return QuietDisconnects(create_fastapi_app(environment_class(env_id, env_kwargs, native_async), AgentrlAction,
                                               AgentrlObservation, max_concurrent_envs=max_sessions))


def guarded(app: Any, host: str, port: int, allowed_hosts: list[str] | None = None,
            allowed_origins: list[str] | None = None) -> ASGIGuard:
    """``app`` behind the Host and Origin rules of every agentrl server (:mod:`agentrl.netguard`): reached by the
    loopback names, ``host`` and ``allowed_hosts`` on ``port`` (any name on a wildcard bind, or with ``"*"``), from no
    web page but those of ``allowed_origins``. openenv-core's server has no such check, and a page the user opens
    could otherwise drive the served env over ``/ws`` (a WebSocket needs no CORS preflight)."""
    names = default_hosts(host)
    return ASGIGuard(app, HostCheck(None if names is None else [*names, *(allowed_hosts or [])], port),
                     allowed_origins or ())


def serve(env_id: str, env_kwargs: dict[str, Any] | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = 64, allowed_hosts: list[str] | None = None,
          allowed_origins: list[str] | None = None) -> None:
    """Serves ``env_id`` with uvicorn until interrupted (behind :func:`guarded`)."""
    import uvicorn

    app = guarded(make_app(env_id, env_kwargs, max_sessions), host, port, allowed_hosts, allowed_origins)
    uvicorn.run(app, host=host, port=port, log_level="warning")
