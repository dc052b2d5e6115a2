"""An env that runs in another interpreter (another venv, other pins) behind agentrl's Env API:
``agentrl.make("outproc/Env-v0", python=".../bin/python", factory="module:callable", kwargs={...})``.

Flow: the first ``reset`` starts ``python outproc_host.py`` (:mod:`agentrl.envs.bridges.outproc_host`, standard
library only, run as a file so the other venv needs no agentrl), reads its hello, and sends ``make``; each ``reset``
and ``step`` is one JSON line to the host's stdin and one back from its stdout. The host lives as long as the env (one
env per host process, so libraries that seed the process-global ``random``, like GEM and TextArena, need no lock), and
``close`` ends it. Observations become chat messages: a string is one user message, a list of ``{role, content}``
messages is taken as is, anything else is shown as JSON. A step that sets both ``terminated`` and ``truncated`` is
reported as terminated only.

Invariants: every wait is bounded (``start_timeout_s`` for start-up and ``make``, ``call_timeout_s`` per call); a host
that does not start, exits, times out (it is then killed, its whole process group) or answers outside the protocol
raises :class:`HostError` naming the interpreter, the request and the tail of the host's stderr: a failed episode in
the manager, never a hung one. An exception inside the foreign env raises :class:`HostError` with its type and
message, and the host stays usable. An env dropped without ``close`` has its host ended by a finalizer.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import signal
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

from agentrl import core
from agentrl.core import Env, Message, StepResult
from agentrl.envs.bridges.errors import one_line
from agentrl.tools import JSON_ERRORS

HOST_SCRIPT = Path(__file__).with_name("outproc_host.py")
PROTOCOL = 1


class HostError(RuntimeError):
    """The out-of-process env host failed: did not start, exited, timed out, or its env raised."""


class _Host:
    """One started host process and its line reader (a thread: the pipe is read with a bounded wait)."""

    def __init__(self, python: str, argv: list[str], env: dict[str, str] | None):
        self.python = python
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in end())
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.stderr, env=env,
                                         start_new_session=True)  # its own group: a timeout ends all it started
        except OSError as e:
            self.stderr.close()
            raise HostError(f"env host {python!r} cannot start: {type(e).__name__}: {e}") from e
        self.lines: queue.Queue = queue.Queue()
        self.next_id = 0
        self.dead: str | None = None  # why it can no longer serve (then every request says so at once)
        threading.Thread(target=self._read, name="agentrl-outproc-reader", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line)
        self.lines.put(None)  # end of stream: the host exited

    def stderr_tail(self, limit: int = 600) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - limit))
            return self.stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def receive(self, timeout: float, what: str) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise self.fail(f"env host {self.python!r} did not answer {what} within {timeout:g} s (killed)") from None
        if line is None:
            code = self.proc.wait()
            tail = self.stderr_tail()
            raise self.fail(f"env host {self.python!r} exited (code {code}) during {what}"
                            + (f"; its stderr ends: {tail}" if tail else ""))
        try:
            reply = json.loads(line)
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except JSON_ERRORS:
            raise self.fail(f"env host {self.python!r} answered {what} outside the protocol: {line[:120]!r}") from None
        return reply

    def fail(self, message: str) -> HostError:
        """Ends the host and remembers why; returns the error to raise."""
        self.dead = self.dead or message
        self.end()
        return HostError(message)

    def request(self, timeout: float, op: str, **fields: Any) -> Any:
        self.next_id += 1
        rid = self.next_id
        what = op if op != "call" else f"call {fields.get('method')!r}"
        if self.dead:
            raise HostError(f"env host {self.python!r} is no longer usable ({what}): {self.dead}")
        try:
            self.proc.stdin.write((json.dumps({"id": rid, "op": op, **fields}) + "\n").encode())  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass  # it has exited: receive() reports it with its stderr
        except TypeError as e:
            raise HostError(f"env host {self.python!r}: {what}'s arguments are not JSON: {e}") from None
        reply = self.receive(timeout, what)
        if reply.get("id") != rid or not isinstance(reply.get("ok"), bool):
            raise self.fail(f"env host {self.python!r} answered {what} outside the protocol: {str(reply)[:120]!r}")
        if not reply["ok"]:
            raise HostError(f"env host {self.python!r}: {what} failed in the env: {one_line(str(reply.get('error')))}")
        return reply.get("result")

    def end(self, grace_s: float = 5.0) -> None:
        """Asks the host to close (if it runs), then kills its process group; idempotent."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"id": 0, "op": "close"}\n')  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                self.proc.wait(grace_s)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever the env started in its group
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.stderr):
            try:
                f.close()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass


def _as_messages(obs: Any) -> list[Message]:
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    if isinstance(obs, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                     and isinstance(m.get("content"), str) for m in obs):
        return [dict(m) for m in obs]
    return [{"role": "user", "content": json.dumps(obs, sort_keys=True)}]


class HostedEnv(Env):
    """An env made by ``factory(**kwargs)`` in the interpreter ``python`` (see the module docstring).

    kwargs: ``python`` (the other interpreter), ``factory`` (``"module:callable"`` importable there), ``kwargs`` (its
    keyword arguments, JSON), ``pythonpath`` (directories put first on the host's ``PYTHONPATH``), ``host_env``
    (extra environment variables for the host), ``launcher`` (a command the host runs under, e.g.
    ``["unshare", "--user", "--map-root-user", "--net"]`` for no network), ``sandbox`` (``"bwrap"``: the host runs
    in a bubblewrap sandbox, as :mod:`.mcp_sandbox` runs an MCP server: no network unless ``sandbox_network``, the
    host's system dirs, the interpreter's install, ``pythonpath``, agentrl's own source and ``sandbox_binds``
    read-only, a private /tmp, its own PID namespace, seccomp, and only ``PYTHONPATH`` and ``host_env`` of the
    environment: for libraries that run the model's code, such as SkyRL-Gym's ``lcb`` and ``searchcode``),
    ``system_prompt`` (a system message before the first observation), ``start_timeout_s`` (120), ``call_timeout_s``
    (60).
    """

    description = "An env run by another Python (own venv and pins) behind a stdin/stdout host"

    def __init__(self, python: str, factory: str, kwargs: dict[str, Any] | None = None,
                 pythonpath: list[str] | None = None, host_env: dict[str, str] | None = None,
                 launcher: list[str] | None = None, sandbox: str | None = None, sandbox_binds: list[str] | None = None,
                 sandbox_network: bool = False, system_prompt: str | None = None, start_timeout_s: float = 120.0,
                 call_timeout_s: float = 60.0):
        super().__init__()
        if not isinstance(factory, str) or ":" not in factory:
            raise ValueError(f"HostedEnv: factory must be 'module:callable', got {factory!r}")
        for name, value in (("start_timeout_s", start_timeout_s), ("call_timeout_s", call_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"HostedEnv: {name} must be in (0, 3600] seconds, got {value!r}")
        try:
            json.dumps(kwargs or {})
        except TypeError as e:
            raise ValueError(f"HostedEnv: kwargs must be JSON (they cross to the host): {e}") from None
        self.python, self.factory, self.env_kwargs = str(python), factory, dict(kwargs or {})
        self.pythonpath, self.host_env = [str(p) for p in pythonpath or ()], dict(host_env or {})
        if launcher is not None and (not isinstance(launcher, list) or not all(isinstance(a, str) for a in launcher)):
            raise ValueError(f"HostedEnv: launcher must be a list of strings, got {launcher!r}")
        self.launcher = list(launcher or ())
        if sandbox not in (None, "bwrap"):
            raise ValueError(f"HostedEnv: sandbox must be 'bwrap' or None, got {sandbox!r}")
        if sandbox and self.launcher:
            raise ValueError("HostedEnv: give launcher or sandbox, not both")
        self.sandbox, self.sandbox_network = sandbox, bool(sandbox_network)
        self.sandbox_binds = [os.path.abspath(p) for p in sandbox_binds or ()]
        if self.sandbox:  # the sandbox starts in its own /tmp: relative paths would name nothing there
            self.python = os.path.abspath(self.python) if os.sep in self.python else self.python
            self.pythonpath = [os.path.abspath(p) for p in self.pythonpath]
        self.system_prompt = system_prompt
        self.start_timeout_s, self.call_timeout_s = float(start_timeout_s), float(call_timeout_s)
        self.host: _Host | None = None
        self.hello: dict[str, Any] = {}
        self.current_key = ""
        self._finalizer: weakref.finalize | None = None

    def _start(self) -> _Host:
        if self.host is not None and not self.host.dead and self.host.proc.poll() is None:
            return self.host
        self.close()
        host = _Host(self.python, *self._command())
        self.host = host
        self._finalizer = weakref.finalize(self, host.end)
        hello = host.receive(self.start_timeout_s, "start-up").get("hello")
        if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
            self.close()
            raise HostError(f"env host {self.python!r} greeted outside the protocol (want protocol {PROTOCOL}): {hello!r}")
        self.hello = hello
        try:
            host.request(self.start_timeout_s, "make", factory=self.factory, kwargs=self.env_kwargs)
        except HostError:
            self.close()  # a host whose env cannot be made is of no use: end it now
            raise
        return host

    def _command(self) -> tuple[list[str], dict[str, str] | None]:
        """The host's argv and environment (None: bwrap sets it inside)."""
        own = {"PYTHONPATH": os.pathsep.join(self.pythonpath)} if self.pythonpath else {}
        command = [self.python, "-u", str(HOST_SCRIPT)]
        if self.sandbox == "bwrap":
            from agentrl.envs.bridges.mcp_sandbox import bwrap_command

            # agentrl's source (an editable install's checkout, or site-packages): a factory may import agentrl
            source = {str(Path(core.__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])}
            return bwrap_command(command, binds=[*self.pythonpath, *sorted(source), *self.sandbox_binds],
                                 env={**own, **self.host_env}, network=self.sandbox_network), None
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        return [*self.launcher, *command], {**env, **own, **self.host_env}

    def call(self, method: str, *args: Any) -> Any:
        """Calls a public method of the foreign env (e.g. GEM's ``sample_random_action``)."""
        return self._start().request(self.call_timeout_s, "call", method=method, args=list(args))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        host = self._start()
        # No seed: one drawn from this env's np_random (seeded by the last seeded reset), so that a run of resets
        # after reset(seed=s) is as reproducible as the foreign env's own seeding makes it.
        host_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        got = host.request(self.call_timeout_s, "reset", seed=host_seed, options=options)
        if not isinstance(got, list) or len(got) != 2:
            raise HostError(f"env host {self.python!r}: reset returned {str(got)[:80]!r}, not (observation, info)")
        obs = _as_messages(got[0])
        if self.system_prompt:
            obs = [{"role": "system", "content": self.system_prompt}] + obs
        info = got[1] if isinstance(got[1], dict) else {}
        self.current_key = "outproc:" + hashlib.sha256(
            json.dumps([self.factory, self.env_kwargs, obs], sort_keys=True).encode()).hexdigest()[:16]
        return obs, {**info, "task_key": self.current_key}

    def step(self, action: str) -> StepResult:
        if self.host is None:
            raise HostError("HostedEnv: step before reset")
        got = self.host.request(self.call_timeout_s, "step", action=str(action))
        if not isinstance(got, list) or len(got) != 5:
            raise HostError(f"env host {self.python!r}: step returned {str(got)[:80]!r}, not a 5-tuple")
        obs, reward, terminated, truncated, info = got
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise HostError(f"env host {self.python!r}: step returned reward {reward!r}, not a finite number")
        info = {**(info if isinstance(info, dict) else {}), "task_key": self.current_key}
        # GEM's single-turn tasks end with both flags set; an episode that terminated was not cut short (the manager
        # reads it so too), and gymnasium's checker takes a truncation after one step for a broken env.
        return _as_messages(obs), float(reward), bool(terminated), bool(truncated) and not terminated, info

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # ends the host, once
            self._finalizer = None
        self.host = None
