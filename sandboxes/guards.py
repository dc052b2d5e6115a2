"""Host resource guards: a pool refuses to start a sandbox the host cannot hold, with an error that names the limit
and the numbers, instead of letting the thousandth sandbox fail half-made (ENOMEM, EAGAIN on fork, EMFILE).

Flow: the pool probes the host once (``probe_host``: available memory, the PID ceiling, the open-file limit) and
from then on accounts for its own sandboxes itself (``HostGuard.admit`` before each creation, ``release`` after
each stop), so a check costs no system call and the count cannot drift with what other processes do meanwhile.

What a sandbox is charged: its spec's ``memory_mb`` and ``pids`` divided by ``overcommit`` (limits are ceilings
that most sandboxes never reach; 1.0 reserves them in full), plus its backend's ``HOST_OVERHEAD`` outside those
limits, and ``FDS_PER_SANDBOX`` of the driver's file descriptors; neither is overcommitted (a live sandbox really
holds them: docker's shim, bwrap's pipes, docker's exec socket).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .base import SandboxError, SandboxSpec

# Driver-side descriptors a sandbox holds while a command runs in it (bwrap: stdin/stdout/stderr pipes and the args
# memfd; docker: the exec's socket and the engine connection it comes from), with room for the driver's own.
FDS_PER_SANDBOX = 4
FDS_RESERVED = 64  # the driver's own files, sockets, the event loop
# Descriptors a live sandbox holds for its whole life: a bwrap sandbox's mount namespace and its two tmpfs roots.
HELD_FDS = {"bwrap": 3}
# What a sandbox costs the host outside its own limits, charged in full: a docker container's containerd shim
# (seen here: 11 threads, ~3 MiB PSS per container, benchmarks/RESULTS-sandboxes.md) and its init + TTL process.
# A bwrap sandbox's processes all live in its cgroup, so within its spec's limits.
HOST_OVERHEAD = {"docker": (4, 13), "bwrap": (0, 0)}  # backend -> (MiB, PIDs)


@dataclass(frozen=True)
class HostLimits:
    """What the host can give, as probed. ``None`` where there is no such limit."""

    memory_mb: int  # MemAvailable, or less where the sandboxes' parent memory cgroup allows less
    pids: int  # free PIDs: pid_max (or the sandboxes' parent pids cgroup limit) minus the tasks that exist now
    fds: int  # RLIMIT_NOFILE soft limit minus the descriptors open now
    memory_source: str = "MemAvailable"
    pids_source: str = "kernel.pid_max"


class HostCapacityError(SandboxError):
    """The host cannot hold one more sandbox of this spec: ``limit`` names the resource ("memory", "pids", "fds"),
    ``need`` and ``have`` are the numbers compared. Not transient: waiting does not raise a host limit."""

    def __init__(self, limit: str, message: str, need: int, have: int):
        super().__init__(message, transient=False)
        self.limit, self.need, self.have = limit, need, have


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _sandbox_cgroup(controller: str) -> Path | None:
    """The cgroup that bwrap sandboxes' groups are made under (``agentrl``, v1 then v2): a limit set there caps
    them all (an operator's cap on the fleet). None when it does not exist yet."""
    from .cgroups import CGROUP_ROOT

    for d in (CGROUP_ROOT / controller / "agentrl", CGROUP_ROOT / "agentrl"):
        if d.is_dir():
            return d
    return None


def probe_host() -> HostLimits:
    """Read the host's limits now (Linux /proc and cgroup v1 files; absent files leave that limit to the others)."""
    meminfo = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        meminfo[name] = int(rest.split()[0])  # kB
    memory_mb, memory_source = meminfo.get("MemAvailable", meminfo.get("MemFree", 0)) // 1024, "MemAvailable"
    mem_cg = _sandbox_cgroup("memory")
    if mem_cg is not None:
        limit = _read_int(str(mem_cg / "memory.limit_in_bytes")) or _read_int(str(mem_cg / "memory.max"))
        usage = _read_int(str(mem_cg / "memory.usage_in_bytes")) or _read_int(str(mem_cg / "memory.current"))
        if limit is not None and usage is not None and (limit - usage) >> 20 < memory_mb:
            memory_mb, memory_source = max(0, (limit - usage) >> 20), f"memory cgroup {mem_cg}"
    tasks = sum(1 for d in os.listdir("/proc") if d.isdigit())  # processes; threads count too but are few here
    pid_max = _read_int("/proc/sys/kernel/pid_max") or 32768
    pids, pids_source = pid_max - tasks, "kernel.pid_max"
    pids_cg = _sandbox_cgroup("pids")
    if pids_cg is not None:
        cg_max, cg_now = _read_int(str(pids_cg / "pids.max")), _read_int(str(pids_cg / "pids.current"))
        if cg_max is not None and cg_now is not None and cg_max - cg_now < pids:
            pids, pids_source = cg_max - cg_now, f"pids cgroup {pids_cg}"
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 0
    fds = (soft if soft != resource.RLIM_INFINITY else 1 << 20) - open_now
    return HostLimits(memory_mb=memory_mb, pids=pids, fds=fds, memory_source=memory_source, pids_source=pids_source)


class HostGuard:
    """Admits sandboxes while the host can hold them. ``probe`` is read once, at the first admission (tests inject
    the host's numbers through it)."""

    def __init__(self, *, overcommit: float = 4.0, probe: Callable[[], HostLimits] = probe_host):
        if not (overcommit >= 1.0):
            raise ValueError(f"HostGuard.overcommit must be >= 1.0, got {overcommit!r}")
        self.overcommit = overcommit
        self._probe = probe
        self._host: HostLimits | None = None
        self.memory_mb = 0.0  # charged to this pool's live sandboxes
        self.pids = 0.0
        self.fds = 0
        self.count = 0

    def _cost(self, spec: SandboxSpec) -> tuple[float, float, int]:
        mem, pids = HOST_OVERHEAD.get(spec.backend, (0, 0))
        fds = FDS_PER_SANDBOX + HELD_FDS.get(spec.backend, 0)
        return mem + spec.memory_mb / self.overcommit, pids + spec.pids / self.overcommit, fds

    def check(self, spec: SandboxSpec, n: int = 1) -> None:
        """Raise HostCapacityError when ``n`` more sandboxes of ``spec`` would not fit; charge nothing."""
        if self._host is None:
            self._host = self._probe()
        host = self._host
        mem, pids, fds = self._cost(spec)
        total = self.count + n
        hint = (f"(spec memory_mb={spec.memory_mb}, pids={spec.pids}, overcommit={self.overcommit:g}); lower the "
                "pool's size or the spec's limits, or raise overcommit")
        need = self.memory_mb + n * mem
        if need > host.memory_mb:
            raise HostCapacityError(
                "memory", f"host memory: {total} sandboxes need {need:.0f} MiB, {host.memory_source} is "
                f"{host.memory_mb} MiB {hint}", int(need), host.memory_mb)
        need = self.pids + n * pids
        if need > host.pids:
            raise HostCapacityError(
                "pids", f"host PIDs: {total} sandboxes need {need:.0f} PIDs, {host.pids_source} leaves "
                f"{host.pids} free {hint}", int(need), host.pids)
        need_fds = self.fds + n * fds + FDS_RESERVED
        if need_fds > host.fds:
            raise HostCapacityError(
                "fds", f"file descriptors: {total} sandboxes need {need_fds} (RLIMIT_NOFILE leaves {host.fds}); "
                "raise `ulimit -n` for the driver or lower the pool's size", need_fds, host.fds)

    def admit(self, spec: SandboxSpec) -> None:
        """Check and charge one sandbox of ``spec`` (undo with ``release``)."""
        self.check(spec)
        mem, pids, fds = self._cost(spec)
        self.memory_mb += mem
        self.pids += pids
        self.fds += fds
        self.count += 1

    def release(self, spec: SandboxSpec) -> None:
        mem, pids, fds = self._cost(spec)
        self.memory_mb = max(0.0, self.memory_mb - mem)
        self.pids = max(0.0, self.pids - pids)
        self.fds = max(0, self.fds - fds)
        self.count = max(0, self.count - 1)
