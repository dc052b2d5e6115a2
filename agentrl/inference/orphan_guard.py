"""Kills an engine's processes when the driver that owns them dies without shutting them down.

vLLM's workers watch their EngineCore through a death pipe, but the EngineCore that ``AsyncLLM`` spawns from the
driver has no watch on the driver: a driver killed outright (the OOM killer, a scheduler's SIGKILL, ``kill -9``)
leaves EngineCore and its workers running, holding their memory (a GPU's, on a GPU host), reparented to PID 1.

Flow: :func:`guard` starts a watcher process (this file run as a script, stdlib only, in its own session so that a
Ctrl-C to the driver's process group does not take it before the driver's clean shutdown) that holds the read end
of a pipe whose write end only the driver holds. The driver ends the watch with :meth:`Guard.release`: a byte
``r`` (leave the processes, they were shut down) or ``k`` (kill them: the shutdown failed). End of file without a
byte, or the driver's PID gone (a process the driver forked may hold the write end open), means the driver died:
the watcher stops the guarded processes and their descendants (SIGSTOP first, so none can spawn or be reparented
while the tree is read), then SIGKILLs them.

Invariant: the watcher never signals a process other than the one it was given. Each PID is checked against the
start time read when it was guarded, so a PID reused after the engine exited on its own is left alone.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from typing import Iterable

POLL_S = 1.0  # how often the watcher checks that the driver's PID still exists, besides the pipe


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")"
            return f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None if it is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def _alive(pid: int, started: int) -> bool:
    """``pid`` runs and is the process that started at ``started`` (a zombie counts as dead)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != b"Z" and int(fields[19]) == started


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(name)) is not None:
            out.setdefault(int(fields[1]), []).append(int(name))
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (not ``pid`` itself), parents before children."""
    children, out, todo = _children(), [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def kill_tree(targets: Iterable[tuple[int, int]]) -> list[int]:
    """SIGSTOPs then SIGKILLs each ``(pid, start_time)`` still alive with that start time, and its descendants.
    Returns the PIDs signalled."""
    roots = [pid for pid, started in targets if start_time(pid) == started]
    stopped: list[int] = []
    # two passes: a child spawned between the first listing and its parent's stop is listed by the second, when
    # nothing in the tree runs any more
    for _ in range(2):
        for pid in roots:
            for p in [pid, *descendants(pid)]:
                if p not in stopped and _signal(p, signal.SIGSTOP):
                    stopped.append(p)
    for p in stopped:
        _signal(p, signal.SIGKILL)
    return stopped


class Guard:
    """The driver's side of a watch (:func:`guard`): its write end and the watcher process."""

    def __init__(self, write_fd: int, proc: subprocess.Popen):
        self._fd: int | None = write_fd
        self.proc = proc

    def release(self, kill: bool = False) -> None:
        """Ends the watch: the guarded processes are left alone (they shut down cleanly), or with ``kill`` killed
        by the watcher. Waits for the watcher to exit; idempotent."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.write(fd, b"k" if kill else b"r")
        except OSError:
            pass
        finally:
            os.close(fd)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def guard(pids: Iterable[int]) -> Guard | None:
    """Starts a watcher that kills ``pids`` (and their descendants) if this process dies before
    :meth:`Guard.release`. None when there is nothing to guard (every PID already gone)."""
    targets = [(pid, t) for pid in pids if (t := start_time(pid)) is not None]
    if not targets:
        return None
    me = os.getpid()
    read_fd, write_fd = os.pipe()  # both non-inheritable: only the watcher gets the read end, by pass_fds
    try:
        args = [str(read_fd), str(me), str(start_time(me))] + [f"{p}:{t}" for p, t in targets]
        proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), *args], pass_fds=(read_fd,),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return Guard(write_fd, proc)


def engine_core_pids(llm: object) -> list[int]:
    """The PIDs of the engine-core processes an ``AsyncLLM`` spawned (none when its engine core runs in this
    process: its workers then watch this process themselves)."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    return [p.pid for p in getattr(manager, "processes", None) or [] if p.pid is not None]


def _watch(read_fd: int, driver: int, driver_start: int, targets: list[tuple[int, int]]) -> None:
    while True:
        ready, _, _ = select.select([read_fd], [], [], POLL_S)
        if ready:
            byte = os.read(read_fd, 1)
            if byte == b"r":
                return
            break  # b"k", or end of file: the driver died
        if not _alive(driver, driver_start):
            break
    kill_tree(targets)


if __name__ == "__main__":
    fd, drv, drv_start, *rest = sys.argv[1:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(int(fd), int(drv), int(drv_start), [(int(p), int(t)) for p, t in (a.split(":") for a in rest)])
