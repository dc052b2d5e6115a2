"""Backend-independent parts of the sandboxes: the spec, the exec result, the error, the output cap, the in-sandbox
exec wrapper that enforces timeouts, and the per-process registry that cleans up on exit and SIGTERM."""

from __future__ import annotations

import abc
import asyncio
import atexit
import functools
import json
import os
import secrets
import shlex
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

BACKENDS = ("docker", "bwrap")
LABEL_RUN = "agentrl.run"
LABEL_SANDBOX = "agentrl.sandbox"
LABEL_EXPIRES = "agentrl.expires"
LABEL_DRIVER = "agentrl.driver"  # "<hostname>:<pid>" of the process that created it


class SandboxError(RuntimeError):
    """A sandbox cannot do what was asked: it failed to start, its container/process died, it was stopped or
    expired, or an engine call failed. Carries the sandbox id (or "") so logs can name it."""

    def __init__(self, message: str, *, sandbox_id: str = "", transient: bool = False):
        super().__init__(f"sandbox {sandbox_id}: {message}" if sandbox_id else message)
        self.sandbox_id = sandbox_id
        # True when retrying the same call may succeed (engine busy, rate limit): the pool retries these.
        self.transient = transient


@dataclass(frozen=True)
class Mount:
    """A host path made visible inside the sandbox (read-only unless ``read_only`` is false)."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox looks like. Defaults are the safe ones: no network, limits on memory/CPU/pids, read-only
    root with a writable ``workdir`` (and a private /tmp), no new privileges, all capabilities dropped.

    backend: "docker" or "bwrap".
    image: docker image; for bwrap the cached rootfs built for that image name is used as root when it exists
        (``agentrl sandboxes build-image``), otherwise the host's /usr, /bin, /lib*, /etc are bound read-only.
    root: bwrap only: explicit root filesystem directory (overrides ``image``).
    user: "uid[:gid]" to run commands as; None means the image's user (docker) or 1000:1000 (bwrap).
    ttl_s: dead-man timer: the sandbox ends itself this long after start even if the driver is gone.
    output_limit: bytes of output kept per exec (head and tail halves).
    """

    backend: str = "docker"
    image: str = "agentrl-base:latest"
    root: str | None = None
    workdir: str = "/workspace"
    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 256
    network: bool = False
    ttl_s: float = 3600.0
    workdir_size_mb: int = 1024
    tmp_size_mb: int = 256
    user: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    output_limit: int = 1 << 20

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the bad field."""
        if self.backend not in BACKENDS:
            raise ValueError(f"SandboxSpec.backend must be one of {BACKENDS}, got {self.backend!r}")
        if not self.workdir.startswith("/") or self.workdir in ("/", "/tmp", "/proc", "/dev"):
            raise ValueError(f"SandboxSpec.workdir must be an absolute, dedicated path, got {self.workdir!r}")
        for name in ("memory_mb", "pids", "workdir_size_mb", "tmp_size_mb", "output_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"SandboxSpec.{name} must be a positive int, got {value!r}")
        if not (self.cpus > 0):
            raise ValueError(f"SandboxSpec.cpus must be > 0, got {self.cpus!r}")
        if not (self.ttl_s > 0):
            raise ValueError(f"SandboxSpec.ttl_s must be > 0, got {self.ttl_s!r}")
        if self.user is not None and not all(p.isdigit() for p in self.user.split(":")):
            raise ValueError(f"SandboxSpec.user must be 'uid' or 'uid:gid' (numbers), got {self.user!r}")
        for m in self.mounts:
            if not isinstance(m, Mount) or not m.target.startswith("/"):
                raise ValueError(f"SandboxSpec.mounts entries must be Mount with an absolute target, got {m!r}")

    def key(self) -> str:
        """A stable string identifying equal specs (dicts are not hashable, so the pool keys warm sandboxes on it)."""
        d = asdict(self)
        d["mounts"] = [asdict(m) if not isinstance(m, dict) else m for m in self.mounts]
        return json.dumps(d, sort_keys=True, default=str)

    def uid_gid(self, default: tuple[int, int] = (1000, 1000)) -> tuple[int, int]:
        if self.user is None:
            return default
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)


@dataclass
class ExecResult:
    """Result of one command. ``output`` is stdout and stderr interleaved, decoded as UTF-8 with replacement.

    timed_out: the command ran past its timeout and its whole process tree was killed; exit_code is then 124.
    truncated: output exceeded the cap; the head and the tail are kept around a marker line.
    """

    output: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class OutputCap:
    """Keeps the first ``limit // 2`` and the last ``limit - limit // 2`` bytes of a stream.

    Invariant: memory held is at most ``limit`` bytes (+ one incoming chunk), whatever the stream length.
    """

    def __init__(self, limit: int):
        self.limit = max(2, int(limit))
        self.head_cap = self.limit // 2
        self.tail_cap = self.limit - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        dropped = self.total - len(self.head) - len(self.tail)
        marker = f"\n[... {dropped} bytes of output truncated ...]\n"
        return (
            bytes(self.head).decode("utf-8", errors="replace")
            + marker
            + bytes(self.tail).decode("utf-8", errors="replace")
        )


# The exec wrapper, a POSIX sh script run inside the sandbox (dash and busybox ash both run it) as
#   sh -c WRAPPER sh MARKER TIMEOUT_S COMMAND
# The wrapper starts a new session (setsid) whose leader first forks a watchdog, waits until the watchdog's timer
# runs (a USR1 handshake, spinning on builtins), and only then execs the command: so the watchdog needs no new process
# to act even when a fork bomb holds every pid the sandbox may have. When the time is up the watchdog reports
# "agentrl:timeout" on fd 3 (the exec's stderr, a channel apart from the output) and SIGKILLs its whole process group,
# i.e. the command's tree, with the `kill` builtin. When the command returns (or was killed), the wrapper kills what
# is left of the group, then every process still carrying AGENTRL_EXEC_ID=MARKER in its environment (children that
# called setsid themselves), so nothing the command started outlives it, and reports "agentrl:done".
EXEC_WRAPPER = r"""
m=$1; t=$2; c=$3
exec 3>&2
inner='
trap "ready=1" USR1
(
    trap - USR1
    sleep "$1" </dev/null >/dev/null 2>&1 3>&- &
    kill -USR1 $$
    wait $!
    echo agentrl:timeout >&3
    kill -KILL 0
) </dev/null >/dev/null 2>&1 &
n=0
while [ -z "$ready" ] && [ $n -lt 200000 ]; do n=$((n + 1)); done
trap - USR1
exec sh -c "$2" 3>&-
'
AGENTRL_EXEC_ID=$m setsid sh -c "$inner" sh "$t" "$c" </dev/null 2>&1 &
pid=$!
wait "$pid"; rc=$?
kill -KILL -"$pid" 2>/dev/null
i=0
while [ $i -lt 30 ]; do
    left=
    for f in $(grep -lszF "AGENTRL_EXEC_ID=$m" /proc/[0-9]*/environ 2>/dev/null); do
        f=${f#/proc/}; left="$left ${f%/environ}"
    done
    [ -n "$left" ] || break
    kill -STOP $left 2>/dev/null; kill -KILL $left 2>/dev/null
    i=$((i + 1))
done
echo agentrl:done >&3
exit $rc
"""

TIMEOUT_EXIT = 124
STATUS_TIMEOUT = b"agentrl:timeout"
STATUS_DONE = b"agentrl:done"


def wrap_command(cmd: str | Sequence[str], timeout: float, marker: str) -> list[str]:
    """The argv that runs ``cmd`` (a shell string, or an argv list that gets shell-quoted) under the wrapper."""
    if not isinstance(cmd, str):
        cmd = shlex.join([str(c) for c in cmd])
    if not (timeout > 0):
        raise ValueError(f"exec timeout must be > 0 seconds, got {timeout!r}")
    return ["sh", "-c", EXEC_WRAPPER, "sh", marker, f"{float(timeout):.3f}", cmd]


def new_marker() -> str:
    return secrets.token_hex(8)


def default_run_id() -> str:
    """``$AGENTRL_RUN_ID`` or a fresh ``<host>-<pid>-<rand>`` id; all sandboxes of this process carry it."""
    return os.environ.get("AGENTRL_RUN_ID") or f"{socket.gethostname()[:20]}-{os.getpid()}-{secrets.token_hex(3)}"


_RUN_ID: str | None = None


def run_id() -> str:
    global _RUN_ID
    if _RUN_ID is None:
        _RUN_ID = default_run_id()
    return _RUN_ID


def driver_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Sandbox(abc.ABC):
    """One isolated place to run commands. Use as ``async with create_sandbox(spec) as sb:``.

    Every method raises SandboxError when the sandbox is not running (never started, stopped, expired, or its
    container/process died); none of them hangs past its timeout plus a grace period.
    """

    backend: str = ""

    def __init__(self, spec: SandboxSpec, *, run: str | None = None):
        spec.validate()
        self.spec = spec
        self.run_id = run or run_id()
        self.id = f"{self.backend}-{secrets.token_hex(6)}"
        self.started_at: float | None = None
        self.expires_at: float | None = None
        self._stopped = False

    # lifecycle ----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def start(self) -> "Sandbox":
        """Create the sandbox; returns self. Raises SandboxError (``transient`` set when a retry may help)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Destroy the sandbox and everything in it. Idempotent; never raises for an already-gone sandbox."""

    @abc.abstractmethod
    def stop_sync(self) -> None:
        """Blocking best-effort stop, for atexit and signal handlers."""

    async def __aenter__(self) -> "Sandbox":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self.started_at is not None and not self._stopped

    # commands and files -------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (shell string or argv) in ``cwd`` (default: the work dir). The timeout is enforced inside
        the sandbox and kills the command's whole process tree; processes the command leaves behind are killed
        when it returns. Returns ExecResult; raises SandboxError if the sandbox is dead."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (relative paths are under the work dir), creating parent directories."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Return the bytes of ``path``; SandboxError if it does not exist or cannot be read."""

    @abc.abstractmethod
    async def upload(self, local_dir: str | os.PathLike, remote_dir: str | None = None) -> None:
        """Copy the contents of host directory ``local_dir`` into ``remote_dir`` (default: the work dir)."""

    @abc.abstractmethod
    async def download(self, remote_dir: str, local_dir: str | os.PathLike) -> None:
        """Copy the contents of sandbox directory ``remote_dir`` into host directory ``local_dir``."""

    async def reset(self) -> None:
        """Make a used sandbox look fresh: kill its processes, empty the work dir and /tmp (for warm reuse)."""
        res = await self.exec(
            f"find {shlex.quote(self.spec.workdir)} /tmp -mindepth 1 -maxdepth 1 -exec rm -rf {{}} + ; true",
            timeout=60,
        )
        if res.exit_code != 0:
            raise SandboxError(f"reset failed: {res.output[-500:]}", sandbox_id=self.id)

    # helpers ------------------------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir.rstrip('/')}/{path}"

    def _check_alive(self) -> None:
        if self.started_at is None:
            raise SandboxError("not started", sandbox_id=self.id)
        if self._stopped:
            raise SandboxError("already stopped", sandbox_id=self.id)
        if self.expires_at is not None and time.time() > self.expires_at:
            raise SandboxError(f"expired (ttl {self.spec.ttl_s:g}s)", sandbox_id=self.id)

    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self._stopped else "new")
        return f"<{type(self).__name__} {self.id} run={self.run_id} {state}>"


# Per-process registry: normal exit and SIGTERM stop every live sandbox at once. --------------------------------
# Strong references: a started sandbox is a resource until stopped, even when its owner dropped it.
_LIVE: "set[Sandbox]" = set()
_HOOKS_LOCK = threading.Lock()
_EXIT_HOOKED = False
_SIGTERM_HOOKED = False


def cleanup_all() -> int:
    """Stop every sandbox this process still holds (blocking). Returns how many were stopped."""
    n = 0
    for sb in list(_LIVE):  # stop_sync unregisters
        try:
            sb.stop_sync()
            n += 1
        except Exception:  # cleanup must go on for the others
            pass
    return n


def _on_sigterm(prev: Any):
    def handler(signum: int, frame: Any) -> None:
        cleanup_all()
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    return handler


def register_live(sb: Sandbox) -> None:
    """Track ``sb`` for exit/SIGTERM cleanup."""
    _LIVE.add(sb)
    install_exit_hooks()


def install_exit_hooks() -> None:
    """Install, once each, the exit and SIGTERM hooks that stop this process's sandboxes. Backends call it from
    ``start()`` on the event loop's thread. The SIGTERM handler can only be set from the main thread; it chains any
    handler already there, else re-raises the default action, so the process still terminates."""
    global _EXIT_HOOKED, _SIGTERM_HOOKED
    with _HOOKS_LOCK:
        if not _EXIT_HOOKED:
            _EXIT_HOOKED = True
            atexit.register(cleanup_all)
            # Interpreter exit joins executor threads before atexit handlers run, and a thread blocked in a docker
            # exec would hold the exit up until its command ends: stopping the sandboxes first ends those execs.
            register_threading_atexit = getattr(threading, "_register_atexit", None)
            if register_threading_atexit is not None:
                try:
                    register_threading_atexit(cleanup_all)
                except RuntimeError:
                    pass
        if not _SIGTERM_HOOKED and threading.current_thread() is threading.main_thread():
            _SIGTERM_HOOKED = True
            try:
                prev = signal.getsignal(signal.SIGTERM)
                signal.signal(signal.SIGTERM, _on_sigterm(prev))
            except (ValueError, OSError):
                pass


def unregister_live(sb: Sandbox) -> None:
    _LIVE.discard(sb)


def state_root() -> Path:
    """Host directory for bwrap sandboxes' work dirs: ``$AGENTRL_SANDBOX_STATE`` or ``/tmp/agentrl-sandboxes``."""
    return Path(os.environ.get("AGENTRL_SANDBOX_STATE", "/tmp/agentrl-sandboxes"))


_EXECUTOR: ThreadPoolExecutor | None = None


async def to_thread(fn, *args, **kwargs):
    """Run a blocking engine call off the event loop, in a dedicated pool: asyncio's default pool has only
    cpu+4 threads, and a long exec holds a thread for its whole duration (``$AGENTRL_SANDBOX_THREADS``, 256)."""
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = ThreadPoolExecutor(
            max_workers=int(os.environ.get("AGENTRL_SANDBOX_THREADS", "256")), thread_name_prefix="agentrl-sandbox"
        )
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, functools.partial(fn, *args, **kwargs))
