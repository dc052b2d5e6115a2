"""The host side of an out-of-process env: run by *another* Python (another venv, other pins), it makes one env and
serves it over its stdin/stdout to :class:`agentrl.envs.bridges.outproc_env.HostedEnv`. Standard library only, and it
imports nothing of agentrl: it must start in a venv where agentrl is not installed.

Protocol (version 1): one JSON object per line each way. The host first writes ``{"hello": {"protocol": 1, "python":
..., "pid": ...}}``; then each request ``{"id": N, "op": OP, ...}`` gets exactly one reply ``{"id": N, "ok": true,
"result": ...}`` or ``{"id": N, "ok": false, "error": "Type: message", "traceback": "..."}``, in order. Ops:

- ``make``: ``factory`` (``"module:attr"``, a callable) and ``kwargs``; the env is ``factory(**kwargs)``.
- ``reset``: ``seed``, ``options`` -> ``[observation, info]``.
- ``step``: ``action`` (text) -> ``[observation, reward, terminated, truncated, info]``.
- ``call``: ``method`` (a public method of the env) and ``args`` -> its result (e.g. GEM's ``sample_random_action``).
- ``close``: closes the env, replies, and the host exits.

Invariants: the protocol owns the real stdout; everything the env prints (to ``sys.stdout`` or file descriptor 1) goes
to stderr instead, so a chatty env cannot corrupt a reply. Results that JSON cannot carry (numpy scalars, tuples,
arbitrary objects) are converted (``tolist``/``item`` where they exist, else ``repr``). An exception in the env is a
reply, never the host's death; end of stdin (agentrl went away) ends the host.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any

PROTOCOL = 1


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    for attr in ("item", "tolist"):  # numpy scalars and arrays, torch tensors
        fn = getattr(value, attr, None)
        if callable(fn):
            try:
                return _jsonable(fn())
            except Exception:
                pass
    return repr(value)


def _factory(path: str) -> Any:
    module, _, attr = str(path).partition(":")
    if not module or not attr:
        raise ValueError(f"factory must be 'module:attr', got {path!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"factory {path!r} is not callable")
    return obj


class _Host:
    def __init__(self) -> None:
        self.env: Any = None

    def handle(self, request: dict[str, Any]) -> Any:
        op = request.get("op")
        if op == "make":
            if self.env is not None:
                raise RuntimeError("the env is already made (one env per host)")
            kwargs = request.get("kwargs") or {}
            if not isinstance(kwargs, dict):
                raise TypeError(f"make: kwargs must be an object, got {type(kwargs).__name__}")
            self.env = _factory(request.get("factory", ""))(**kwargs)
            return {"type": type(self.env).__name__}
        if self.env is None:
            raise RuntimeError(f"{op!r} before make")
        if op == "reset":
            seed, options = request.get("seed"), request.get("options")
            return list(self.env.reset(seed=seed, **({"options": options} if options else {})))
        if op == "step":
            return list(self.env.step(request.get("action")))
        if op == "call":
            method = str(request.get("method", ""))
            if not method or method.startswith("_"):
                raise ValueError(f"call: {method!r} is not a public method")
            return getattr(self.env, method)(*(request.get("args") or []))
        raise ValueError(f"unknown op {op!r} (make, reset, step, call, close)")


def main() -> int:
    # The protocol keeps the real stdout; fd 1 and sys.stdout become stderr for whatever the env prints.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    send({"hello": {"protocol": PROTOCOL, "python": sys.version.split()[0], "executable": sys.executable,
                    "pid": os.getpid()}})
    host = _Host()
    for line in sys.stdin:
        if not line.strip():
            continue
        rid = None
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise TypeError("a request must be a JSON object")
            rid = request.get("id")
            if request.get("op") == "close":
                if host.env is not None and callable(getattr(host.env, "close", None)):
                    host.env.close()
                send({"id": rid, "ok": True, "result": None})
                return 0
            send({"id": rid, "ok": True, "result": _jsonable(host.handle(request))})
        except Exception as e:
            send({"id": rid, "ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
