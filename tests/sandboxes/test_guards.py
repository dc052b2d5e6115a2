"""Host resource guards: the pool refuses what the host cannot hold, naming the limit and the numbers, before it
creates anything. The host's numbers are injected, so these run anywhere (no backend)."""

from __future__ import annotations

import pytest

from agentrl.sandboxes import SandboxPool, SandboxSpec
from agentrl.sandboxes.guards import FDS_PER_SANDBOX, FDS_RESERVED, HELD_FDS, HostCapacityError, HostGuard, HostLimits, probe_host


class FakeSandbox:
    def __init__(self, spec):
        self.spec = spec
        self.running = True
        self.expires_at = None
        self.stopped = False

    async def stop(self):
        self.stopped = True
        self.running = False

    async def dead_reason(self):
        return None


def pool_on(host: HostLimits, **kw) -> tuple[SandboxPool, list]:
    made: list = []

    async def factory(spec):
        made.append(FakeSandbox(spec))
        return made[-1]

    guard = HostGuard(overcommit=kw.pop("overcommit", 1.0), probe=lambda: host)
    return SandboxPool(factory=factory, guard=guard, create_rate=1000, create_burst=1000, **kw), made


SPEC = SandboxSpec(backend="bwrap", memory_mb=100, pids=50)


async def test_memory_guard_refuses_before_creating():
    pool, made = pool_on(HostLimits(memory_mb=350, pids=10_000, fds=10_000))
    held = []
    for _ in range(3):
        cm = pool.acquire(SPEC)
        await cm.__aenter__()
        held.append(cm)
    with pytest.raises(HostCapacityError, match=r"host memory: 4 sandboxes need 400 MiB, MemAvailable is 350 MiB") as e:
        async with pool.acquire(SPEC):
            pass
    assert e.value.limit == "memory" and e.value.need == 400 and e.value.have == 350
    assert len(made) == 3  # the refused one was never made
    await held[0].__aexit__(None, None, None)  # a release gives its share back
    async with pool.acquire(SPEC):
        assert len(made) == 4
    for cm in held[1:]:
        await cm.__aexit__(None, None, None)
    await pool.close()
    assert pool.guard.count == 0 and pool.guard.memory_mb == 0


async def test_pids_guard_names_the_limit_and_overcommit_divides():
    host = HostLimits(memory_mb=100_000, pids=120, fds=10_000, pids_source="pids cgroup /x")
    pool, made = pool_on(host)
    with pytest.raises(HostCapacityError, match=r"host PIDs: 3 sandboxes need 150 PIDs, pids cgroup /x leaves 120"):
        await pool.prewarm(SPEC, 3)
    assert made == []  # checked for all three before the first was made
    pool2, made2 = pool_on(host, overcommit=2.0)
    await pool2.prewarm(SPEC, 3)  # 3 x 50 / 2 = 75 <= 120
    assert len(made2) == 3
    await pool2.close()
    assert all(sb.stopped for sb in made2)


async def test_fd_guard_names_rlimit():
    """A bwrap sandbox holds descriptors for its whole life (its mount namespace, its tmpfs roots) besides those of
    a running command: both are charged."""
    per = FDS_PER_SANDBOX + HELD_FDS["bwrap"]
    n_ok = (500 - FDS_RESERVED) // per
    pool, made = pool_on(HostLimits(memory_mb=10**7, pids=10**7, fds=500))
    await pool.prewarm(SPEC, n_ok)
    need = FDS_RESERVED + (n_ok + 1) * per
    msg = rf"file descriptors: {n_ok + 1} sandboxes need {need} \(RLIMIT_NOFILE leaves 500\).*ulimit -n"
    with pytest.raises(HostCapacityError, match=msg) as e:
        async with pool.acquire(SPEC):
            pass
    assert e.value.limit == "fds" and len(made) == n_ok
    await pool.close()


async def test_keep_warm_refuses_a_target_the_host_cannot_hold():
    pool, made = pool_on(HostLimits(memory_mb=1000, pids=10**6, fds=10**6))
    with pytest.raises(HostCapacityError, match="host memory: 11 sandboxes"):
        await pool.keep_warm(SPEC, 11)
    assert made == []
    await pool.close()


async def test_docker_host_overhead_is_charged_in_full():
    """A docker sandbox also costs its shim's memory and threads, which no overcommit divides."""
    from dataclasses import replace

    from agentrl.sandboxes.guards import HOST_OVERHEAD

    mem, pids = HOST_OVERHEAD["docker"]
    guard = HostGuard(overcommit=1000.0, probe=lambda: HostLimits(memory_mb=10**6, pids=10 * pids, fds=10**6))
    spec = replace(SPEC, backend="docker")
    for _ in range(9):
        guard.admit(spec)  # 9 x (13 + 0.05) PIDs
    with pytest.raises(HostCapacityError, match="host PIDs: 10 sandboxes"):
        guard.admit(spec)
    bwrap = HostGuard(overcommit=1000.0, probe=lambda: HostLimits(memory_mb=10**6, pids=10 * pids, fds=10**6))
    for _ in range(100):
        bwrap.admit(SPEC)  # bwrap's processes are within its spec's pids: 100 x 0.05


def test_guard_rejects_bad_overcommit_and_probes_this_host():
    with pytest.raises(ValueError, match="overcommit"):
        HostGuard(overcommit=0.5)
    host = probe_host()
    assert host.memory_mb > 0 and host.pids > 0 and host.fds > 0


def test_probe_reads_a_cap_set_on_the_sandboxes_parent_cgroup(tmp_path, monkeypatch):
    """An operator's cap on the fleet (limits on the ``agentrl`` cgroup every bwrap sandbox's group is made under)
    is what the guard holds the pool to, and the error would name that cgroup."""
    from agentrl.sandboxes import cgroups

    (tmp_path / "pids" / "agentrl").mkdir(parents=True)
    (tmp_path / "pids" / "agentrl" / "pids.max").write_text("100\n")
    (tmp_path / "pids" / "agentrl" / "pids.current").write_text("10\n")
    (tmp_path / "memory" / "agentrl").mkdir(parents=True)
    (tmp_path / "memory" / "agentrl" / "memory.limit_in_bytes").write_text(str(300 << 20))
    (tmp_path / "memory" / "agentrl" / "memory.usage_in_bytes").write_text(str(100 << 20))
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    host = probe_host()
    assert host.pids == 90 and host.pids_source == f"pids cgroup {tmp_path / 'pids' / 'agentrl'}"
    assert host.memory_mb == 200 and host.memory_source == f"memory cgroup {tmp_path / 'memory' / 'agentrl'}"


async def test_refill_stops_at_the_host_limit_and_says_why():
    """The background refill meets the guard like any creation: what does not fit is refused with the cause
    (``refill_error``, ``keep_warm(wait=True)`` raises it) instead of waiting for ever; releases make room again."""
    pool, made = pool_on(HostLimits(memory_mb=450, pids=10**6, fds=10**6))  # 4 sandboxes of 100 MiB
    await pool.keep_warm(SPEC, 3, wait=True)
    held = []
    for _ in range(2):  # two taken: the refill wants two more, the host holds one more
        cm = pool.acquire(SPEC)
        await cm.__aenter__()
        held.append(cm)
    async with pool._fresh_ready:  # the refill has run: one made, one refused
        await pool._fresh_ready.wait_for(lambda: pool.stats.refill_failures >= 1 and pool._making[next(iter(pool._making))] == 0)
    assert isinstance(pool.refill_error, HostCapacityError) and "host memory" in str(pool.refill_error)
    assert pool.fresh_count == 2 and len(made) == 4
    with pytest.raises(HostCapacityError, match="host memory"):
        await pool.keep_warm(SPEC, 3, wait=True)
    for cm in held:
        await cm.__aexit__(None, None, None)
    await pool.keep_warm(SPEC, 3, wait=True)  # the released ones' share lets the refill finish
    assert pool.fresh_count == 3 and pool.refill_error is None
    await pool.close()
    assert pool.guard.count == 0
