"""Isolation and limits, against the real backends: network, read-only root, pid and memory limits, dead
sandboxes, TTL expiry, cleanup on stop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from agentrl.sandboxes import SandboxError, SandboxSpec, create_sandbox
from agentrl.sandboxes.base import state_root

from .conftest import unavailable, until_gone, until_running


def _host_ips() -> list[str]:
    """Addresses of this host a sandbox could try besides loopback (docker0's gateway, the primary IP)."""
    ips = set()
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    ips.update(ip for ip in out if ":" not in ip)
    return sorted(ips)


class _Server:
    """A TCP server on 0.0.0.0 that counts connections."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.hits += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self._stop = True
        self.thread.join()
        self.sock.close()


async def test_network_is_unreachable_by_default(busybox_spec):
    server = _Server()
    try:
        # positive control: the server does accept connections from the host
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        time.sleep(0.3)
        assert server.hits == 1
        async with create_sandbox(busybox_spec) as sb:
            targets = ["127.0.0.1"] + _host_ips()
            for ip in targets:
                res = await sb.exec(f"nc -w 2 {ip} {server.port} </dev/null && echo CONNECTED", timeout=15)
                assert "CONNECTED" not in res.output and res.exit_code != 0, (ip, res)
            ifaces = (await sb.exec("cat /proc/net/dev", timeout=10)).output
            assert [ln.split(":")[0].strip() for ln in ifaces.splitlines()[2:]] == ["lo"]
        time.sleep(0.3)
        assert server.hits == 1, "a sandbox reached the host's server"
    finally:
        server.close()


async def test_writes_outside_workdir_fail(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        for path in ("/etc/x", "/x", "/bin/x", "/usr/x"):
            res = await sb.exec(f"echo hi > {path}", timeout=10)
            assert res.exit_code != 0, path
            assert "Read-only file system" in res.output or "Permission denied" in res.output, res.output
        ok = await sb.exec("echo a > /workspace/f && echo b > /tmp/f && cat /workspace/f /tmp/f", timeout=10)
        assert ok.ok and ok.output == "a\nb\n"
        # no privileges to regain: no capabilities and no_new_privs
        status = (await sb.exec("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status", timeout=10)).output
        assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status, status


async def test_fork_bomb_is_stopped_by_pid_limit(busybox_spec):
    spec = replace(busybox_spec, pids=64)
    async with create_sandbox(spec) as bomb, create_sandbox(busybox_spec) as neighbour:
        bomb_task = asyncio.create_task(bomb.exec("(b() { b | b & }; b); exec sleep 8", timeout=5))
        await asyncio.sleep(2)
        # while the bomb holds every pid it may: the neighbour and the host carry on
        t0 = time.monotonic()
        res = await neighbour.exec("echo fine", timeout=10)
        assert res.ok and res.output == "fine\n" and time.monotonic() - t0 < 5
        assert subprocess.run(["true"]).returncode == 0
        res = await bomb_task
        assert res.timed_out
        low = res.output.lower()
        assert "fork" in low and ("unavailable" in low or "cannot" in low or "can't" in low), res.output[:500]
        after = await bomb.exec("echo usable; ls /proc | grep -c '^[0-9]'", timeout=20)
        assert after.ok and after.output.startswith("usable"), after.output
        assert int(after.output.split()[1]) < 10, after.output  # the bomb is gone


async def test_a_pid_limited_sandbox_runs_more_execs_than_its_pid_limit(busybox_spec):
    # Each bwrap exec used to leave its namespace's reaper process to the host's PID 1; where that init reaps
    # lazily (this VM's agent, a container's init) the zombie stayed charged to the sandbox's pids cgroup, and a
    # sandbox with pids=16 could no longer fork after ~16 execs ("Can't fork for pid 1").
    spec = replace(busybox_spec, pids=16)
    async with create_sandbox(spec) as sb:
        for i in range(3 * spec.pids):
            res = await sb.exec("echo $((1 + 1))", timeout=30)
            assert res.ok and res.output == "2\n", (i, res.output)


async def test_memory_hog_is_stopped_by_memory_limit(base_spec):
    spec = replace(base_spec, memory_mb=128)
    async with create_sandbox(spec) as sb:
        hog = "python3 -c \"b = b'x' * (1 << 30); print('survived', len(b))\""
        res = await sb.exec(hog, timeout=60)
        assert "survived" not in res.output
        assert res.exit_code != 0 and not res.timed_out
        assert res.exit_code == 137 or "MemoryError" in res.output, res
        small = await sb.exec("python3 -c \"b = b'x' * (32 << 20); print('ok', len(b))\"", timeout=60)
        assert small.ok and small.output.startswith("ok"), small


def _kill_backing(sb) -> None:
    """Kill the sandbox's container / bwrap process from outside, as the OOM killer or an operator would."""
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        docker_client().api.kill(sb.container_id)
    else:
        for proc in list(sb._procs):
            os.kill(proc.pid, signal.SIGKILL)


async def test_dead_sandbox_raises_sandbox_error_not_hang(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        task = asyncio.create_task(sb.exec("sleep 100", timeout=60))
        await until_running(sb, "sleep 100")
        _kill_backing(sb)
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="killed|not running|no longer exists"):
            await asyncio.wait_for(task, 20)
        assert time.monotonic() - t0 < 15
        with pytest.raises(SandboxError):
            await asyncio.wait_for(sb.exec("echo hi", timeout=5), 20)
        with pytest.raises(SandboxError):
            await asyncio.wait_for(sb.read_file("x"), 20)


async def test_not_started_and_stopped_raise(busybox_spec):
    sb = create_sandbox(busybox_spec)
    with pytest.raises(SandboxError, match="not started"):
        await sb.exec("true", timeout=5)
    await sb.start()
    await sb.stop()
    await sb.stop()  # idempotent
    with pytest.raises(SandboxError, match="stopped"):
        await sb.exec("true", timeout=5)


async def test_ttl_expiry(busybox_spec):
    spec = replace(busybox_spec, ttl_s=5)  # room for a container start on a loaded engine
    async with create_sandbox(spec) as sb:
        assert (await sb.exec("echo alive", timeout=5)).ok
        await asyncio.sleep(max(0.0, sb.expires_at - time.time()) + 1.5)
        with pytest.raises(SandboxError, match="expired|no longer exists|not running"):
            await sb.exec("true", timeout=5)
        if sb.backend == "docker":
            from agentrl.sandboxes.docker import docker_client

            # the dead-man timer ended the container by itself, and auto-remove deleted it
            assert not docker_client().api.containers(all=True, filters={"id": sb.container_id})


async def test_stop_removes_everything(busybox_spec):
    sb = await create_sandbox(busybox_spec).start()
    await sb.exec("echo x > f", timeout=5)
    await sb.stop()
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        assert not docker_client().api.containers(all=True, filters={"id": sb.container_id})
    else:
        assert not sb.state_dir.exists()
        if sb.cgroup is not None:
            assert not any(d.exists() for d in sb.cgroup.dirs)


async def test_cancelled_exec_leaves_nothing_running(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        task = asyncio.create_task(sb.exec("sleep 1007", timeout=10))
        await until_running(sb, "sleep 1007")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        left = await until_gone(sb, "sleep 1007", 60)  # the in-sandbox timeout (10 s) still fires for it
        assert not left, left


def test_spec_validation_names_the_field():
    with pytest.raises(ValueError, match="backend"):
        SandboxSpec(backend="podman")
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxSpec(memory_mb=0)
    with pytest.raises(ValueError, match="workdir"):
        SandboxSpec(workdir="relative")
    with pytest.raises(ValueError, match="user"):
        SandboxSpec(user="agent")
    assert SandboxSpec().key() == SandboxSpec().key() != SandboxSpec(pids=7).key()


def test_bwrap_uses_cgroup_limits_here():
    """As root with writable cgroups (this machine, CI) the bwrap backend must use real cgroup limits."""
    from agentrl.sandboxes.bwrap import cgroup_mode

    from .conftest import require_backend

    require_backend("bwrap")
    if os.geteuid() != 0:
        unavailable("cgroup limits need root")
    assert cgroup_mode() in ("v1", "v2")
    assert state_root().is_absolute()


async def test_bwrap_rlimit_fallback_still_limits(monkeypatch):
    """Without writable cgroups (non-root hosts) bwrap falls back to prlimit: RLIMIT_AS stops a memory hog and
    RLIMIT_NPROC (per uid; each sandbox gets its own uid when the driver is root) stops a fork bomb."""
    from agentrl.sandboxes import cgroups

    from .conftest import BASE, require_backend

    require_backend("bwrap", BASE)
    monkeypatch.setattr(cgroups, "_CGROUP_MODE", "none")
    spec = SandboxSpec(backend="bwrap", image=BASE, memory_mb=256, pids=32, ttl_s=120)
    async with create_sandbox(spec) as sb:
        assert sb.limits.startswith("rlimit") and sb.cgroup is None
        hog = await sb.exec("python3 -c \"b = b'x' * (1 << 30); print('survived')\"", timeout=60)
        assert "survived" not in hog.output and "MemoryError" in hog.output, hog
        bomb = await sb.exec("b() { b | b & }; b; exec sleep 5", timeout=3)
        assert "fork" in bomb.output.lower(), bomb.output[:300]
        assert (await sb.exec("echo usable", timeout=10)).output == "usable\n"


async def test_bwrap_on_host_root(tmp_path):
    """With no cached rootfs (or root='/'), bwrap binds the host's system dirs read-only, nothing else of the host."""
    from .conftest import require_backend

    require_backend("bwrap")
    spec = SandboxSpec(backend="bwrap", root="/", ttl_s=60)
    async with create_sandbox(spec) as sb:
        res = await sb.exec("ls /; id -u; test -e /root || test -e /home || echo no-host-homes", timeout=20)
        assert res.ok, res
        assert "no-host-homes" in res.output and "usr" in res.output.split()
        assert (await sb.exec("touch /usr/x", timeout=10)).exit_code != 0
