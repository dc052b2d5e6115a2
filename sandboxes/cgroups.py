"""Host-side cgroups: the limits group of a bwrap sandbox, and the per-exec groups of a docker container.

- :class:`Cgroup`: one bwrap sandbox's group ``agentrl/<run>/<sandbox>`` in each v1 controller (memory, pids, cpu)
  or in the v2 tree, with its limits. Every process of the sandbox runs in it.
- :class:`ContainerGroups`: the cgroup of one docker container, seen from the host, in the hierarchy where a whole
  tree can be killed at once: cgroup v2 (``cgroup.kill``; also the ``unified`` v2 tree of a hybrid v1 host), else
  the v1 freezer (freeze, kill, thaw). Each exec gets a child group there; its processes cannot leave it (the
  cgroup files are read-only inside the container and need root), so killing the group kills everything the exec
  started, ``setsid`` and ``env -i`` children included, from outside the sandbox user's reach.

Both need a driver running as root on the host that runs the processes; callers fall back when these return None
or raise OSError.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Callable

from .lifecycle import make_under_run_dir

CGROUP_ROOT = Path(os.environ.get("AGENTRL_CGROUP_ROOT", "/sys/fs/cgroup"))
V1_CONTROLLERS = ("memory", "pids", "cpu")


def _write(path: Path, value: str, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except OSError:
        if not optional:
            raise


def _procs(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


# bwrap sandboxes' limit groups ----------------------------------------------------------------------------------
_CGROUP_MODE: str | None = None


def cgroup_mode() -> str:
    """"v2", "v1" or "none": which cgroup hierarchy this process can create limited groups in.
    ``$AGENTRL_BWRAP_LIMITS=rlimit`` forces "none"."""
    global _CGROUP_MODE
    if _CGROUP_MODE is not None:
        return _CGROUP_MODE
    mode = "none"
    if os.environ.get("AGENTRL_BWRAP_LIMITS", "") != "rlimit" and os.geteuid() == 0:
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            candidate = "v2"
        elif all((CGROUP_ROOT / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
            candidate = "v1"
        else:
            candidate = "none"
        if candidate != "none":
            try:
                probe = Cgroup(candidate, f"probe-{os.getpid()}-{secrets.token_hex(3)}", "probe")
                probe.create(64 << 20, 16, 1.0)
                probe.remove()
                mode = candidate
            except OSError:
                mode = "none"
    _CGROUP_MODE = mode
    return mode


class Cgroup:
    """One sandbox's cgroup: ``agentrl/<run>/<sandbox>`` in each v1 controller, or in the v2 tree."""

    def __init__(self, mode: str, run: str, name: str):
        self.mode = mode
        if mode == "v2":
            self.dirs = [CGROUP_ROOT / "agentrl" / run / name]
        else:
            self.dirs = [CGROUP_ROOT / c / "agentrl" / run / name for c in V1_CONTROLLERS]

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _make_dirs(self) -> None:
        """Makes the sandbox's cgroup dirs and their parents (the run's dir may vanish meanwhile: made again)."""

        def make() -> None:
            if self.mode == "v2":
                d = self.dirs[0]
                for parent in (CGROUP_ROOT, CGROUP_ROOT / "agentrl", d.parent):
                    parent.mkdir(exist_ok=True)
                    _write(parent / "cgroup.subtree_control", "+memory +pids +cpu")
                d.mkdir(exist_ok=True)
            else:
                for d in self.dirs:
                    d.mkdir(parents=True, exist_ok=True)

        make_under_run_dir(make)

    def create(self, memory_bytes: int, pids: int, cpus: float) -> None:
        period = 100_000
        quota = max(1000, int(cpus * period))
        self._make_dirs()
        if self.mode == "v2":
            d = self.dirs[0]
            _write(d / "memory.max", str(memory_bytes))
            _write(d / "memory.swap.max", "0", optional=True)
            _write(d / "pids.max", str(pids))
            _write(d / "cpu.max", f"{quota} {period}")
            return
        mem, pid, cpu = self.dirs
        _write(mem / "memory.limit_in_bytes", str(memory_bytes))
        _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes), optional=True)
        _write(pid / "pids.max", str(pids))
        _write(cpu / "cpu.cfs_period_us", str(period))
        _write(cpu / "cpu.cfs_quota_us", str(quota))

    def pids(self) -> list[int]:
        return sorted({p for d in self.dirs for p in _procs(d)})

    def memory_bytes(self) -> int | None:
        name = "memory.current" if self.mode == "v2" else "memory.usage_in_bytes"
        try:
            return int((self.dirs[0] / name).read_text())
        except (OSError, ValueError):
            return None

    def kill_all(self) -> None:
        if self.mode == "v2":
            _write(self.dirs[0] / "cgroup.kill", "1", optional=True)
        deadline = time.monotonic() + GONE_WAIT_S
        while True:
            left = self.pids()
            if not left or time.monotonic() > deadline:
                return
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            _rmdir(d)
            try:
                d.parent.rmdir()  # the run's dir, once its last sandbox is gone
            except OSError:
                pass


# How long a stop waits for killed processes to leave their cgroup, and for the cgroup to go. Killed processes exit
# within milliseconds on a quiet host but took over a second at load ~250 (2,048 sandboxes stepping on 2 cores):
# a fixed count of short tries left hundreds of cgroups behind there (benchmarks/bench_fleet.py's leftovers).
GONE_WAIT_S = 30.0


def _rmdir(d: Path, wait_s: float = GONE_WAIT_S) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # busy for a moment while killed processes exit
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


# docker containers' per-exec groups -----------------------------------------------------------------------------
def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root inside the hierarchy, fs type, super options) of every cgroup mount this process sees."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
            out.append((f[4].replace("\\040", " "), f[3], r[0], r[2]))
    return out


class ContainerGroups:
    """A docker container's cgroup seen from the host, for per-exec groups (see the module docstring).

    ``mode``: "v2" (cgroup.kill) or "v1-freezer". Group names start with ``agentrl-x-``; the engine removes them
    with the container.
    """

    def __init__(self, mode: str, path: Path):
        self.mode = mode
        self.path = path

    @classmethod
    def find(cls, pid: int, container_id: str) -> "ContainerGroups | None":
        """The groups of the container whose init has host pid ``pid``; None when the driver cannot use them (not
        root, a remote engine, another PID namespace, a kernel without cgroup.kill or freezer)."""
        if os.geteuid() != 0 or pid <= 0 or os.environ.get("AGENTRL_DOCKER_REAPER", "") == "in-sandbox":
            return None
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        paths: dict[str, str] = {}
        for line in lines:
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
        mounts = _mounts()
        choices: list[tuple[str, Path]] = []
        if "" in paths:
            for point, root, fstype, _ in mounts:
                if fstype == "cgroup2" and root == "/":
                    choices.append(("v2", Path(point + paths[""])))
        if "freezer" in paths:
            for point, root, fstype, opts in mounts:
                if fstype == "cgroup" and root == "/" and "freezer" in opts.split(","):
                    choices.append(("v1-freezer", Path(point + paths["freezer"])))
        for mode, path in choices:
            if container_id not in str(path) or pid not in _procs(path):
                continue  # not this container's group as seen from here
            if mode == "v2" and not (path / "cgroup.kill").exists():
                continue  # kernel before 5.14
            return cls(mode, path)
        return None

    def find_pid(self, marker: str, deadline: float, stop: Callable[[], bool] = lambda: False) -> int | None:
        """The host pid of the exec whose command line holds ``marker``, waiting (polling the container's own
        group, where a new exec's process lands and waits for its "go") until ``deadline`` or until ``stop()``;
        None if it never came."""
        needle = marker.encode()
        wait = 0.001
        while True:
            for pid in _procs(self.path):
                try:
                    if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                        return pid
                except OSError:
                    continue
            if time.monotonic() >= deadline or stop():
                return None
            time.sleep(wait)
            wait = min(wait * 1.5, 0.005)

    def new_group(self, pid: int) -> Path:
        """A fresh child group holding ``pid``. Raises OSError."""
        d = self.path / f"agentrl-x-{secrets.token_hex(6)}"
        d.mkdir()
        try:
            _write(d / "cgroup.procs", str(pid))
        except OSError:
            _rmdir(d, wait_s=1.0)
            raise
        return d

    def kill(self, group: Path) -> None:
        """SIGKILL every process of ``group`` (and of groups below it), atomically with respect to forks."""
        if self.mode == "v2":
            _write(group / "cgroup.kill", "1", optional=True)
            return
        for _ in range(100):
            left = _procs(group)
            if not left:
                return
            _write(group / "freezer.state", "FROZEN", optional=True)
            for _ in range(200):  # FREEZING -> FROZEN, usually at once
                try:
                    if (group / "freezer.state").read_text().strip() == "FROZEN":
                        break
                except OSError:
                    break
                time.sleep(0.001)
            for p in _procs(group):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _write(group / "freezer.state", "THAWED", optional=True)  # killed tasks die once thawed
            time.sleep(0.001)

    def remove(self, group: Path) -> None:
        """Kill and remove ``group``; a group still busy after a second is left for the engine to remove."""
        self.kill(group)
        _rmdir(group, wait_s=1.0)

    def procs(self, group: Path) -> list[int]:
        """Host pids of the processes in ``group``."""
        return _procs(group)

    def groups(self) -> list[Path]:
        try:
            return [d for d in self.path.iterdir() if d.is_dir() and d.name.startswith("agentrl-x-")]
        except OSError:
            return []

    def kill_all_but(self, keep_uid: int) -> None:
        """Kill every exec group, and every process in the container's own group not run by ``keep_uid`` (the
        container's init and TTL process run as that uid)."""
        for g in self.groups():
            self.remove(g)
        for p in _procs(self.path):
            try:
                status = Path(f"/proc/{p}/status").read_text()
                uid = int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1])
            except (OSError, StopIteration, ValueError):
                continue
            if uid != keep_uid:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def memory_cgroup_of(pid: int) -> Path | None:
    """The memory cgroup directory of host process ``pid`` (v1 memory controller, else the v2 group), or None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = CGROUP_ROOT / "memory" / path.lstrip("/")
            return d if d.is_dir() else None
    for line in lines:
        if line.startswith("0::"):
            d = CGROUP_ROOT / line[3:].lstrip("/")
            return d if (d / "memory.events").exists() else None
    return None


def oom_kills(memory_dir: Path | None) -> int | None:
    """Processes the kernel's OOM killer has killed in a memory cgroup so far (v1 ``memory.oom_control``, v2
    ``memory.events``), None when unreadable: an exec compares it before and after to name an OOM kill its cause."""
    if memory_dir is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (memory_dir / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None
