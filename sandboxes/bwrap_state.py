"""The host-side state of a bwrap sandbox: its state directory under ``state_root()/<run>/<id>`` and the tmpfs
mounts of its work dir and /tmp. Kept apart from the backend so that the sweep (which releases what crashed
drivers left) and the backend share it without importing each other."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


def mount_tmpfs(target: Path, size_mb: int, mode: int, uid: int) -> None:
    """Mount a tmpfs of ``size_mb`` MiB owned by ``uid`` on ``target``. Raises OSError."""
    opts = f"size={size_mb}m,mode={mode:o},uid={uid},gid={uid}".encode()
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount tmpfs on {target}: {os.strerror(e)}")


def _umount(path: Path) -> None:
    """Detach the mount on ``path`` (lazily: a process still in it cannot keep it); nothing mounted there is fine.
    Raises OSError otherwise."""
    if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point
            raise OSError(e, f"umount {path}: {os.strerror(e)}")


def release_state(state_dir: Path) -> None:
    """Unmount a sandbox's tmpfs mounts and remove its state dir. Raises OSError when a mount cannot be removed
    (then nothing is deleted through it)."""
    for sub in ("work", "tmp"):
        _umount(state_dir / sub)
    shutil.rmtree(state_dir, ignore_errors=True)
    try:
        state_dir.parent.rmdir()  # the run's dir, once its last sandbox is gone
    except OSError:
        pass


def release_state_mounts(state_dir: Path) -> None:
    """Unmount whatever of a state dir's tmpfs mounts got mounted (a failed create)."""
    for sub in ("work", "tmp"):
        try:
            _umount(state_dir / sub)
        except OSError:
            pass


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
