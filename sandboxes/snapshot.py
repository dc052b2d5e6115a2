"""Snapshot reset: a prepared work-dir state captured once and restored per episode, instead of rebuilding it.

Flow: prepare one sandbox (upload a repo, install, build), ``snap = await take_snapshot(sb)``; then for each
episode ``await restore_snapshot(sb, snap)`` on any sandbox of an equal spec: the backend's reset (the previous
episode's processes killed; work dir, /tmp and, on docker, /dev/shm, /dev/mqueue and SysV IPC emptied), whose
wipe command then unpacks the snapshot into the empty work dir. The pool does it for warm sandboxes
(``keep_warm(spec, n, snapshot=snap)``, ``acquire(spec, reuse=True, snapshot=snap)``).

Invariants: the snapshot is a tar of the work dir held in the driver's memory (at most ``max_bytes``), so it needs
no host files and leaves nothing behind; a restore leaves exactly the snapshot's entries in the work dir (names,
contents, modes, symlinks) and nothing of the episode before; a restore that fails raises SandboxError and the
pool then stops that sandbox rather than hand it out.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field

from .base import DEFAULT_READ_MAX, ByteSink, FileTooLarge, Sandbox, SandboxError


@dataclass(frozen=True)
class Snapshot:
    """A work dir's content as a tar archive. ``key`` (a digest of the archive and the work dir) tells the pool
    which warm sandboxes hold this state."""

    data: bytes = field(repr=False)
    workdir: str
    key: str


async def take_snapshot(sb: Sandbox, *, max_bytes: int = DEFAULT_READ_MAX) -> Snapshot:
    """Capture ``sb``'s work dir. FileTooLarge over ``max_bytes`` of archive (nothing kept)."""
    sink = ByteSink(max_bytes)
    workdir = sb.spec.workdir
    try:
        code, err = await sb._plain(f"exec tar -C {shlex.quote(workdir)} -cf - .", sink=sink.feed)
    except ByteSink.Overflow:
        raise FileTooLarge("snapshot", workdir, None, max_bytes, sandbox_id=sb.id,
                           hint="pass a larger max_bytes, or keep less in the prepared work dir") from None
    if code != 0:
        text = err.decode("utf-8", errors="replace").strip()
        raise SandboxError(f"snapshot of {workdir} failed (exit {code}): {text[-2000:]}", sandbox_id=sb.id)
    data = bytes(sink.buf)
    digest = hashlib.sha256(workdir.encode() + b"\0" + data).hexdigest()[:16]
    return Snapshot(data=data, workdir=workdir, key=digest)


async def restore_snapshot(sb: Sandbox, snap: Snapshot) -> None:
    """Reset ``sb`` and unpack ``snap`` into its (now empty) work dir."""
    if snap.workdir != sb.spec.workdir:
        raise SandboxError(f"snapshot of work dir {snap.workdir} cannot restore into {sb.spec.workdir}",
                           sandbox_id=sb.id)
    await sb.reset(restore=snap.data)
