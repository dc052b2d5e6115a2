"""Backend-independent parts of the sandboxes: the spec, the exec result, the errors, the output cap, the exec
wrappers (the per-process registry that cleans up on exit and SIGTERM is :mod:`.lifecycle`).

Who ends a command: the host. Each backend runs a command under wrappers.EXEC_WRAPPER inside a group the sandbox user
cannot leave and the host can kill as a whole (docker: a cgroup of its own under the container's, bwrap: a PID
namespace of its own). When the command returns, or when its timeout passes on the driver's clock, the host kills the
group: nothing a command started outlives it, whatever it does (``setsid``, ``env -i``, killing the wrapper).
wrappers.WATCHDOG_WRAPPER is the weaker fallback for a docker engine whose cgroups the driver cannot reach (a remote
``DOCKER_HOST``, a non-root driver): a watchdog inside the container that the sandbox user could kill.
"""

from __future__ import annotations

import abc
import contextlib
import io
import json
import os
import secrets
import shlex
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

# The process-wide parts, re-exported: backends and tools import them from here.
from .lifecycle import (LABEL_DRIVER, LABEL_EXPIRES, LABEL_RUN, LABEL_SANDBOX, cleanup_all, default_run_id,  # noqa: F401
                        driver_tag, install_exit_hooks, register_live, run_id, state_root, to_thread,
                        unregister_live)
from .wrappers import WIPE_SCRIPT, check_text

if TYPE_CHECKING:
    from .pool import ExecGate

BACKENDS = ("docker", "bwrap")
DEFAULT_USER = (1000, 1000)
# The uid of the docker TTL process (the container's main process): no sandbox user may have it, so no command can
# signal or trace the dead-man timer (signals need the same uid or CAP_KILL, and every capability is dropped).
TTL_UID = 2_100_000_000
DEFAULT_READ_MAX = 64 << 20  # read_file: bytes held in the driver's memory
DEFAULT_DOWNLOAD_MAX = 1 << 30  # download / download_file: bytes streamed to the host's disk
PLAIN_TIMEOUT_S = 600.0  # file transfers


SANDBOX_FAILURE_CAUSES = ("sandbox_lost", "sandbox_engine", "sandbox_oom", "sandbox_disk")
"""Why an episode's sandbox failed it (``SandboxError.failure_cause``; the env manager counts them as
``failures/<cause>`` and retries the episode in a fresh sandbox): ``sandbox_lost``: its processes or container died
(killed from outside, expired, removed); ``sandbox_engine``: its engine (the docker daemon) did not answer;
``sandbox_oom``: a command hit its memory limit; ``sandbox_disk``: its work dir or /tmp filled up."""


class SandboxError(RuntimeError):
    """A sandbox cannot do what was asked: it failed to start, its container/process died, it was stopped or
    expired, or an engine call failed. Carries the sandbox id (or "") so logs can name it, and ``failure_cause``
    (one of :data:`SANDBOX_FAILURE_CAUSES`, or None when the raiser did not know it: see
    :func:`agentrl.sandboxes.faults.infra_error`)."""

    def __init__(self, message: str, *, sandbox_id: str = "", transient: bool = False, cause: str | None = None):
        super().__init__(f"sandbox {sandbox_id}: {message}" if sandbox_id else message)
        if cause is not None and cause not in SANDBOX_FAILURE_CAUSES:
            raise ValueError(f"SandboxError cause must be one of {SANDBOX_FAILURE_CAUSES}, got {cause!r}")
        self.sandbox_id = sandbox_id
        # True when retrying the same call may succeed (engine busy, rate limit): the pool retries these.
        self.transient = transient
        self.failure_cause = cause


class FileTooLarge(SandboxError):
    """A read or download would pass its ``max_bytes``: nothing was kept (no partial file on the host). ``path`` is
    the sandbox path, ``size`` its size in bytes when known (None for a stream such as /dev/zero)."""

    def __init__(self, what: str, path: str, size: int | None, max_bytes: int, hint: str, *, sandbox_id: str = ""):
        have = f"{size} bytes" if size is not None else f"more than {max_bytes} bytes"
        super().__init__(f"{what}: {path} is {have}, over max_bytes={max_bytes}; {hint}", sandbox_id=sandbox_id)
        self.path, self.size, self.max_bytes = path, size, max_bytes


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
    user: "uid[:gid]" to run commands as; None means 1000:1000 on both backends, whatever the image's USER (images
        such as SWE-bench's say ``USER root``); "0:0" asks for root (still without capabilities).
    ttl_s: dead-man timer: the sandbox ends this long after start even if the driver is gone, and nothing inside can
        stop it (docker: a process of a uid no command has; bwrap: nothing runs between execs, and expired state is
        swept when a pool starts or a sandbox finds itself expired).
    workdir_size_mb / tmp_size_mb: sizes of the work dir and /tmp (tmpfs; their pages count against memory_mb).
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
        if self.user is not None and TTL_UID in self.uid_gid():
            raise ValueError(f"SandboxSpec.user must not use id {TTL_UID} (reserved for the TTL process), got {self.user!r}")
        for m in self.mounts:
            if not isinstance(m, Mount) or not m.target.startswith("/"):
                raise ValueError(f"SandboxSpec.mounts entries must be Mount with an absolute target, got {m!r}")

    def key(self) -> str:
        """A stable string identifying equal specs (dicts are not hashable, so the pool keys warm sandboxes on it)."""
        d = asdict(self)
        d["mounts"] = [asdict(m) if not isinstance(m, dict) else m for m in self.mounts]
        return json.dumps(d, sort_keys=True, default=str)

    def uid_gid(self, default: tuple[int, int] = DEFAULT_USER) -> tuple[int, int]:
        """(uid, gid) that commands run as."""
        if self.user is None:
            return default
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)


@dataclass
class ExecResult:
    """Result of one command. ``output`` is stdout and stderr interleaved, decoded as UTF-8 with replacement.

    timed_out: the command ran past its timeout and its whole process tree was killed; exit_code is then 124.
    truncated: output exceeded the cap; the head and the tail are kept around a marker line.
    oom_killed: the kernel's OOM killer killed a process of the sandbox while the command ran (the sandbox hit its
        memory limit: the cause of an exit 137), read from the sandbox's memory cgroup; False where unreadable.
    """

    output: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    oom_killed: bool = False
    disk_full: bool = False  # the work dir or /tmp was full when the command ended (its disk limit hit)

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


class ByteSink:
    """Where a read's bytes go: memory (``path`` None) or a host file, at most ``max_bytes`` (None: no bound).
    ``feed`` raises :class:`FileTooLarge`'s cause, ``Overflow``, once the bound is passed; nothing past it is kept."""

    class Overflow(Exception):
        pass

    def __init__(self, max_bytes: int | None, path: Path | None = None):
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"max_bytes must be a non-negative int or None, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.total = 0
        self.buf = bytearray()
        self.path = path
        self._file = open(path, "wb") if path is not None else None

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self.max_bytes is not None and self.total > self.max_bytes:
            raise ByteSink.Overflow()
        if self._file is not None:
            self._file.write(data)
        else:
            self.buf += data

    def close(self, keep: bool) -> None:
        """Closes the host file; removes it unless ``keep``."""
        if self._file is not None:
            self._file.close()
            self._file = None
            if not keep and self.path is not None:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


def new_marker() -> str:
    return secrets.token_hex(8)


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
        # Set by a pool with ``max_running_execs``: commands wait here for a slot before they start.
        self.exec_gate: ExecGate | None = None

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

    async def dead_reason(self) -> str | None:
        """None when the sandbox can take commands, else why not (the pool asks before handing out an idle one)."""
        try:
            self._check_alive()
        except SandboxError as e:
            return str(e)
        return None

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
        """Run ``cmd`` (shell string or argv) in ``cwd`` (default: the work dir) as the spec's user. When it returns,
        or ``timeout`` seconds after it started, the host kills its whole process tree (see the module docstring).
        With an ``exec_gate`` (a pool's ``max_running_execs``) the command first waits for a slot, and ``timeout``
        counts from when it starts. Returns ExecResult; raises SandboxError if the sandbox is dead."""

    def _exec_slot(self) -> contextlib.AbstractAsyncContextManager:
        return self.exec_gate.slot() if self.exec_gate is not None else contextlib.nullcontext()

    @abc.abstractmethod
    async def _plain(
        self, cmd: str, *, stdin: bytes | None = None, sink: Callable[[bytes], None] | None = None,
        timeout: float = PLAIN_TIMEOUT_S,
    ) -> tuple[int, bytes]:
        """Run one of our own shell commands (file transfer) with raw stdin and stdout: stdout goes to ``sink``.
        Returns (exit code, stderr). Its tree is killed like an exec's; what ``sink`` raises propagates after that.
        Raises SandboxError if the sandbox is dead or the command outlives ``timeout``."""

    async def _checked(self, cmd: str, what: str, **kw: Any) -> None:
        code, err = await self._plain(cmd, **kw)
        if code != 0:
            text = err.decode("utf-8", errors="replace").strip()
            raise SandboxError(f"{what} failed (exit {code}): {text[-2000:]}", sandbox_id=self.id)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (relative paths are under the work dir), creating parent directories."""
        self._check_alive()
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write_file({path!r}): data must be bytes or str, got {type(data).__name__}")
        q = shlex.quote(self._abs(path))
        await self._checked(f'mkdir -p "$(dirname {q})" && cat > {q} && chmod {mode:o} {q}', f"write_file({path!r})",
                            stdin=data)

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX) -> bytes:
        """Return the bytes of ``path``. Raises :class:`FileTooLarge` (naming the path and its size) when it holds
        more than ``max_bytes`` (use :meth:`download_file` for big files), SandboxError if it cannot be read."""
        self._check_alive()
        full = self._abs(path)
        sink = ByteSink(max_bytes)
        try:
            code, err = await self._plain(f"exec head -c {max_bytes + 1} -- {shlex.quote(full)}", sink=sink.feed)
        except ByteSink.Overflow:
            raise FileTooLarge("read_file", full, await self._size(full), max_bytes, sandbox_id=self.id,
                               hint="read a part with exec('head -c N FILE'), or stream it to the host with "
                               "download_file(path, local_path)") from None
        if code != 0:
            text = err.decode("utf-8", errors="replace").strip()
            raise SandboxError(f"read_file({path!r}) failed (exit {code}): {text[-2000:]}", sandbox_id=self.id)
        return bytes(sink.buf)

    async def download_file(self, remote_path: str, local_path: str | os.PathLike, *,
                            max_bytes: int | None = DEFAULT_DOWNLOAD_MAX) -> int:
        """Stream sandbox file ``remote_path`` into host file ``local_path`` (memory stays flat); returns its size.
        Over ``max_bytes`` (None: no bound) raises :class:`FileTooLarge` and leaves no file behind."""
        self._check_alive()
        full = self._abs(remote_path)
        dest = Path(local_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        sink = ByteSink(max_bytes, dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part"))
        ok = False
        try:
            code, err = await self._plain(f"exec cat -- {shlex.quote(full)}", sink=sink.feed)
            if code != 0:
                text = err.decode("utf-8", errors="replace").strip()
                raise SandboxError(f"download_file({remote_path!r}) failed (exit {code}): {text[-2000:]}",
                                   sandbox_id=self.id)
            ok = True
        except ByteSink.Overflow:
            raise FileTooLarge("download_file", full, await self._size(full), max_bytes or 0, sandbox_id=self.id,
                               hint="pass a larger max_bytes (None for no bound)") from None
        finally:
            sink.close(keep=ok)
        os.replace(sink.path, dest)  # type: ignore[arg-type]
        return sink.total

    async def upload(self, local_dir: str | os.PathLike, remote_dir: str | None = None) -> None:
        """Copy the contents of host directory ``local_dir`` into ``remote_dir`` (default: the work dir)."""
        self._check_alive()
        local = Path(local_dir)
        if not local.is_dir():
            raise SandboxError(f"upload: {local} is not a directory", sandbox_id=self.id)
        data = await to_thread(_tar_dir, local)
        target = self._abs(remote_dir or self.spec.workdir)
        q = shlex.quote(target)
        await self._checked(f"mkdir -p {q} && tar -C {q} -xof -", f"upload to {target}", stdin=data)

    async def download(self, remote_dir: str, local_dir: str | os.PathLike, *,
                       max_bytes: int | None = DEFAULT_DOWNLOAD_MAX) -> None:
        """Copy the contents of sandbox directory ``remote_dir`` into host directory ``local_dir``, streamed through
        a temporary tar file on the host. Over ``max_bytes`` of tar (None: no bound) raises :class:`FileTooLarge`
        and extracts nothing."""
        self._check_alive()
        source = self._abs(remote_dir)
        dest = Path(local_dir)
        dest.mkdir(parents=True, exist_ok=True)
        sink = ByteSink(max_bytes, dest.parent / f".{dest.name}.{secrets.token_hex(4)}.tar")
        try:
            try:
                code, err = await self._plain(f"exec tar -C {shlex.quote(source)} -cf - .", sink=sink.feed)
            except ByteSink.Overflow:
                raise FileTooLarge("download", source, None, max_bytes or 0, sandbox_id=self.id,
                                   hint="pass a larger max_bytes (None for no bound), or download less") from None
            if code != 0:
                text = err.decode("utf-8", errors="replace").strip()
                raise SandboxError(f"download of {source} failed (exit {code}): {text[-2000:]}", sandbox_id=self.id)
            sink.close(keep=True)
            await to_thread(_untar, sink.path, dest)
        finally:
            sink.close(keep=False)
            if sink.path is not None and sink.path.exists():
                sink.path.unlink()

    async def _size(self, full: str) -> int | None:
        """Size in bytes of a regular file, None for anything else (a device, a pipe, a /proc file)."""
        q = shlex.quote(full)
        out = ByteSink(4096)
        try:
            await self._plain(f"[ -f {q} ] && exec stat -L -c %s -- {q}", sink=out.feed, timeout=60)
        except (SandboxError, ByteSink.Overflow):
            return None
        text = bytes(out.buf).strip()
        return int(text) if text.isdigit() else None

    def _wipe_dirs(self) -> list[str]:
        """Directories whose contents a reset removes."""
        return [self.spec.workdir, "/tmp"]

    async def reset(self, *, restore: bytes | None = None) -> None:
        """Make a used sandbox look fresh: kill its processes, empty the work dir and /tmp (and, per backend, any
        other place a command could leave state), for warm reuse. SandboxError if anything is left. ``restore``: a
        tar of the work dir (a snapshot) unpacked into it by the same command once it is empty (one exec, not
        two: on bwrap the exec is most of a restore's cost)."""
        if restore is None:
            res = await self.exec(["sh", "-c", WIPE_SCRIPT, "sh", *self._wipe_dirs()], timeout=120)
            if res.exit_code != 0:
                raise SandboxError(f"reset failed: {res.output[-500:]}", sandbox_id=self.id)
            return
        dirs = " ".join(shlex.quote(d) for d in self._wipe_dirs())
        # -p: the snapshot's modes exactly (the sandbox user's umask would narrow them); -o: owned by that user.
        await self._checked(f"sh -c {shlex.quote(WIPE_SCRIPT)} sh {dirs} >&2 && "
                            f"exec tar -C {shlex.quote(self.spec.workdir)} -xpof -", "reset to snapshot",
                            stdin=restore, timeout=120)

    # helpers ------------------------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        check_text(path, f"the path {path!r}")  # BadCommand: no process can take it as an argument
        return path if path.startswith("/") else f"{self.spec.workdir.rstrip('/')}/{path}"

    def _check_alive(self) -> None:
        if self.started_at is None:
            raise SandboxError("not started", sandbox_id=self.id)
        if self._stopped:
            raise SandboxError("already stopped", sandbox_id=self.id)
        if self.expires_at is not None and time.time() > self.expires_at:
            # The TTL logic of a live driver: its own expired sandboxes, and other drivers' leftovers, go now.
            from .sweep import auto_sweep

            auto_sweep(self.backend, force=True)
            raise SandboxError(f"expired (ttl {self.spec.ttl_s:g}s)", sandbox_id=self.id)

    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self._stopped else "new")
        return f"<{type(self).__name__} {self.id} run={self.run_id} {state}>"


def _tar_dir(local: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(local.iterdir()):
            tar.add(str(child), arcname=child.name)
    return buf.getvalue()


def _untar(tar_path: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, mode="r") as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python without extraction filters
            tar.extractall(dest)


def full_dirs(host_paths: Sequence[str | os.PathLike]) -> bool:
    """True when one of a sandbox's size-capped dirs (work dir, /tmp), seen from the host, has no free block left:
    the sandbox hit its disk limit (the cause of a command's ENOSPC). Unreadable paths count as not full."""
    for p in host_paths:
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        if st.f_blocks and st.f_bavail == 0:
            return True
    return False
