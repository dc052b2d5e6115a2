"""The host-side state of a bwrap sandbox: its state directory under ``state_root()/<run>/<id>`` and the tmpfs
mounts of its work dir and /tmp. Kept apart from the backend so that the sweep (which releases what crashed
drivers left) and the backend share it without importing each other.

The tmpfs mounts (the disk caps) live in a mount namespace of the sandbox's own (:func:`private_tmpfs`), not the
host's: every bwrap exec copies the mount table of the namespace it starts in, ~14 µs of CPU per mount
(``benchmarks/bench_exec_mounts.py``), so two host mounts per live sandbox made each exec of a 2,048-sandbox fleet
~9x dearer than a lone sandbox's. The namespace is held by a file descriptor in the driver, not a process: it and
its tmpfs go when the sandbox stops or the driver dies, so a crash leaves no mount behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Sequence

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
MNT_DETACH = 2


class PrivateMounts:
    """A sandbox's tmpfs mounts, made in a mount namespace of its own. ``ns`` is that namespace's descriptor (an
    exec enters it through a dup: ``nsenter --mount=/proc/<driver>/fd/N``); ``dirs`` are descriptors of the tmpfs
    roots, so the host can see their free space though the mounts are not in its namespace. Closing them releases the namespace and the tmpfs
    (once the last process in it is gone)."""

    def __init__(self, ns: int, dirs: Sequence[int]):
        self._lock = threading.Lock()  # dup and close race when a stop runs in a thread while an exec starts
        self.ns: int | None = ns
        self.dirs = tuple(dirs)

    def dup_ns(self) -> int:
        """A new descriptor of the namespace, for one exec (closed by its caller). Raises OSError once closed."""
        with self._lock:
            if self.ns is None:
                raise OSError(errno.EBADF, "the sandbox's mount namespace was released")
            return os.dup(self.ns)

    def free_blocks(self) -> list[tuple[int, int]]:
        """(blocks, available blocks) of each tmpfs; [] once closed."""
        with self._lock:
            if self.ns is None:
                return []
            return [(st.f_blocks, st.f_bavail) for st in map(os.fstatvfs, self.dirs)]

    def close(self) -> None:
        with self._lock:
            if self.ns is None:
                return
            for fd in (self.ns, *self.dirs):
                os.close(fd)
            self.ns = None


_MOUNT_ALL = 'm=$1; shift; while [ $# -gt 0 ]; do "$m" -t tmpfs -o "$2" tmpfs "$1" || exit 1; shift 2; done; ' \
    'echo ready; read _'


def private_tmpfs(mounts: Sequence[tuple[Path, int, int]], uid: int, *, timeout: float = 30.0) -> PrivateMounts:
    """Mount a tmpfs of ``size_mb`` MiB, mode ``mode``, owned by ``uid`` on each ``(target, size_mb, mode)``, in a new
    mount namespace (private propagation: nothing mounted there shows on the host, nor the reverse afterwards).

    A short-lived helper makes the namespace and the mounts, then waits; the driver opens the namespace and the
    tmpfs roots through ``/proc/<helper>/`` and lets it go. Raises OSError (no CAP_SYS_ADMIN, no util-linux)."""
    tools = {t: shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") for t in ("unshare", "mount")}
    if None in tools.values():
        raise OSError(errno.ENOENT, f"private tmpfs: util-linux's {tools} not all installed")
    args: list[str] = []
    for target, size_mb, mode in mounts:
        args += [str(target), f"size={size_mb}m,mode={mode:o},uid={uid},gid={uid},nosuid,nodev"]
    p = subprocess.Popen([tools["unshare"], "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _MOUNT_ALL,
                          "sh", tools["mount"], *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, cwd="/")
    opened: list[int] = []
    try:
        poll = select.poll()  # not select(): the driver of a fleet holds descriptors past select's 1,024
        poll.register(p.stdout, select.POLLIN)
        ready = poll.poll(timeout * 1e3) and p.stdout.readline() == b"ready\n"
        if not ready:
            p.kill()
            err = p.communicate(timeout=timeout)[1].decode(errors="replace").strip()
            raise OSError(errno.EPERM, f"private tmpfs: the mount helper failed: {err[-500:] or 'no answer'}")
        opened.append(os.open(f"/proc/{p.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
        for target, _, _ in mounts:
            opened.append(os.open(f"/proc/{p.pid}/root{target}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        return PrivateMounts(opened[0], opened[1:])
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    finally:
        if p.poll() is None:
            p.stdin.close()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in (p.stdout, p.stderr, p.stdin):
            if not f.closed:
                f.close()


def _umount(path: Path) -> None:
    """Detach the mount on ``path`` (lazily: a process still in it cannot keep it); nothing mounted there is fine.
    Raises OSError otherwise."""
    if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point
            raise OSError(e, f"umount {path}: {os.strerror(e)}")


def release_state(state_dir: Path) -> None:
    """Remove a sandbox's state dir, unmounting first what an older driver mounted on the host under it. Raises
    OSError when a mount cannot be removed (then nothing is deleted through it)."""
    for sub in ("work", "tmp"):
        _umount(state_dir / sub)
    shutil.rmtree(state_dir, ignore_errors=True)
    try:
        state_dir.parent.rmdir()  # the run's dir, once its last sandbox is gone
    except OSError:
        pass


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
