"""A private directory for vLLM's ZMQ sockets, removed with the process that made it.

vLLM names the IPC sockets between ``AsyncLLM``, its engine core and the workers ``$VLLM_RPC_BASE_PATH/<uuid4>``
(the temp directory by default) and leaves them there whenever a process ends without closing its ZMQ context,
which is how its engine core usually ends: 3-9 socket files in ``/tmp`` per engine start, thousands after a few
days of training runs and tests.

Flow: the first engine a process starts calls :func:`ensure`, which makes ``$TMPDIR/agentrl-vllm-<pid>-<random>``
(under ``/tmp`` if ``$TMPDIR`` is too long a path for a socket's), points ``VLLM_RPC_BASE_PATH`` at it (the
engine's child processes inherit it) and removes it at interpreter exit. A process killed outright cannot remove
its own, so :func:`ensure` also removes the directories of processes that no longer run. A ``VLLM_RPC_BASE_PATH``
set by the user is left as it is.

Invariant: one directory per process, kept while the process lives (vLLM may cache the variable after the first
engine, so a later engine of the same process reuses the directory); only directories whose PID is gone are swept.
"""

from __future__ import annotations

import os

from agentrl import proctemp

PREFIX = "agentrl-vllm-"
_made: str | None = None


def parent() -> str:
    """The temp directory, or ``/tmp`` when the temp directory's path is too long for a socket's: vLLM adds
    ``/<uuid4>`` (37 bytes) under this module's ``/agentrl-vllm-<pid>-<random>`` (at most 35)."""
    return proctemp.socket_parent(37 + 35)


def sweep(parent_dir: str | None = None) -> list[str]:
    """Removes the directories under ``parent_dir`` (:func:`parent`) left by processes that no longer run; returns
    their paths."""
    return proctemp.sweep(PREFIX, parent_dir or parent())


def ensure() -> str:
    """The directory vLLM's sockets go to in this process: the user's ``VLLM_RPC_BASE_PATH`` if set, else this
    process's private one (made on the first call)."""
    global _made
    if os.environ.get("VLLM_RPC_BASE_PATH"):
        return os.environ["VLLM_RPC_BASE_PATH"]
    if _made is None:
        _made = proctemp.make(PREFIX, directory=True, parent=parent())
    os.environ["VLLM_RPC_BASE_PATH"] = _made
    return _made
