"""Faults at CI scale: sandboxes of a pool killed from outside while a command runs in them (bwrap: every process of
the sandbox's cgroup, as the OOM killer or an operator would; docker: ``docker kill``). The killed ones' commands
fail with a SandboxError that names the cause, within seconds, never a hang; the others finish untouched; after
release nothing of any of them is left (no state dir, no cgroup, no container)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from agentrl.sandboxes import SandboxError, SandboxPool

from .conftest import until_running

COUNT = {"bwrap": 16, "docker": 4}


def kill_from_outside(sb) -> None:
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        docker_client().api.kill(sb.container_id)
        return
    pids = sb.cgroup.pids() if sb.cgroup is not None else [p.pid for p in sb._procs]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def leftovers(sb) -> list[str]:
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        return [c["Id"][:12] for c in docker_client().api.containers(all=True, filters={"id": sb.container_id})]
    left = [str(sb.state_dir)] if sb.state_dir.exists() else []
    if sb.cgroup is not None:
        left += [str(d) for d in sb.cgroup.dirs if d.exists()]
    return left


async def test_sandboxes_killed_mid_command_fail_with_cause_and_leave_nothing(busybox_spec):
    n = COUNT[busybox_spec.backend]
    victims = set(range(0, n, 4))  # a quarter of the fleet
    pool = SandboxPool(max_alive=n, create_rate=50, create_burst=n)
    await pool.keep_warm(busybox_spec, n, wait=True)
    await pool.keep_warm(busybox_spec, 0)
    held: dict[int, object] = {}
    all_running = asyncio.Event()
    kills_done = asyncio.Event()
    results: dict[int, object] = {}
    ready = 0

    async def episode(i: int) -> None:
        nonlocal ready
        async with pool.acquire(busybox_spec) as sb:
            held[i] = sb
            task = asyncio.create_task(sb.exec(f"sleep 300 # ep{i}" if i in victims else f"echo ep{i}-ok",
                                               timeout=120))
            if i in victims:
                await until_running(sb, f"ep{i}")
            ready += 1
            if ready == n:  # every victim's command is running: the kills land mid-command
                all_running.set()
            await all_running.wait()
            await kills_done.wait()
            t0 = time.monotonic()
            try:
                results[i] = await asyncio.wait_for(task, 30)
            except SandboxError as e:
                results[i] = e
            results[(i, "s")] = time.monotonic() - t0

    eps = asyncio.gather(*(episode(i) for i in range(n)))
    await all_running.wait()
    for i in victims:
        kill_from_outside(held[i])
    kills_done.set()
    await asyncio.wait_for(eps, 120)
    for i in range(n):
        if i in victims:
            assert isinstance(results[i], SandboxError), results[i]
            assert results[i].sandbox_id == held[i].id
            assert "killed" in str(results[i]) or "not running" in str(results[i]) \
                or "no longer exists" in str(results[i]), results[i]
            assert results[(i, "s")] < 20
        else:
            assert results[i].ok and results[i].output.strip() == f"ep{i}-ok", results[i]
    await pool.close()
    assert pool.stats.stopped == pool.stats.created == n and pool.guard.count == 0
    assert [left for sb in held.values() for left in leftovers(sb)] == []


async def test_warm_pool_never_hands_out_a_sandbox_that_died_while_idle(busybox_spec):
    """Idle sandboxes of the warm pool lost from outside (docker: killed; bwrap: its state swept away) are found
    dead at acquire, stopped, and replaced: the episode gets a working one."""
    from agentrl.sandboxes.bwrap_state import release_state

    pool = SandboxPool(max_alive=4)
    await pool.keep_warm(busybox_spec, 3, wait=True)
    await pool.keep_warm(busybox_spec, 0)
    victims = list(pool._fresh[next(iter(pool._fresh))][:2])
    for sb in victims:
        if sb.backend == "docker":
            kill_from_outside(sb)
        else:
            release_state(sb.state_dir)
    async with pool.acquire(busybox_spec) as sb:
        assert sb not in victims
        assert (await sb.exec("echo alive", timeout=30)).output.strip() == "alive"
    assert pool.stats.dead_idle == 2 and pool.stats.warm_hits == 1
    await pool.close()
    assert [left for sb in victims for left in leftovers(sb)] == []
    assert pool.stats.stopped == pool.stats.created


async def test_sandbox_killed_while_idle_fails_its_next_command_and_leaves_nothing(busybox_spec):
    """A killed sandbox fails its first command with the cause, and its release still removes everything."""
    pool = SandboxPool(max_alive=2)
    await pool.keep_warm(busybox_spec, 1, wait=True)
    await pool.keep_warm(busybox_spec, 0)
    async with pool.acquire(busybox_spec) as sb:
        kill_from_outside(sb)  # no command running: bwrap has no process; docker's container dies
        if sb.backend == "docker":
            with pytest.raises(SandboxError, match="not running|no longer exists|killed"):
                await asyncio.wait_for(sb.exec("echo hi", timeout=10), 30)
        else:
            assert (await sb.exec("echo hi", timeout=10)).ok  # bwrap: nothing lives between commands
    await pool.close()
    assert leftovers(sb) == []


async def test_memory_limit_hit_is_named_as_the_cause(base_spec):
    """A command that outgrows the sandbox's memory limit is OOM-killed by the kernel; the result says so
    (``oom_killed``), so a caller can end the episode as an infrastructure failure with that cause. The sandbox
    stays usable and a later command is not blamed."""
    from dataclasses import replace

    from agentrl.sandboxes import create_sandbox

    async with create_sandbox(replace(base_spec, memory_mb=64)) as sb:
        ok = await sb.exec("echo fine", timeout=30)
        assert ok.ok and not ok.oom_killed
        hog = await sb.exec("python3 -c \"b = bytearray(256 << 20); print('survived')\"", timeout=60)
        assert "survived" not in hog.output and hog.exit_code != 0
        assert hog.oom_killed, hog
        after = await sb.exec("echo fine", timeout=30)
        assert after.ok and not after.oom_killed


async def test_disk_limit_hit_is_named_as_the_cause(busybox_spec):
    """A command that fills the sandbox's work dir (its size cap) fails with ENOSPC; the result says the disk limit
    was hit (``disk_full``); once the episode's files are gone, commands are not blamed."""
    from dataclasses import replace

    from agentrl.sandboxes import create_sandbox

    async with create_sandbox(replace(busybox_spec, workdir_size_mb=4)) as sb:
        ok = await sb.exec("echo fine > small", timeout=30)
        assert ok.ok and not ok.disk_full
        fill = await sb.exec("head -c 8000000 /dev/zero > big", timeout=60)
        assert fill.exit_code != 0, fill  # busybox says only "I/O error": the flag names the cause
        assert fill.disk_full, fill
        after = await sb.exec("rm -f big && echo fine", timeout=30)
        assert after.ok and not after.disk_full


async def test_a_docker_engine_gone_mid_run_fails_commands_and_stops_as_sandbox_errors(monkeypatch):
    """The daemon restarted under a fleet of 256 (bench_fleet --restart-daemon): commands that asked the engine for
    their exec after it went away raised the client's own ConnectionError, so 252 episodes ended as env exceptions,
    never retried. Every engine call of a command or a stop now fails as a SandboxError, named by infra_error."""
    import requests
    from docker.api.client import APIClient

    from agentrl.sandboxes import SandboxSpec, create_sandbox, infra_error

    from .conftest import BUSYBOX, require_backend

    require_backend("docker", BUSYBOX)
    sb = await create_sandbox(SandboxSpec(backend="docker", image=BUSYBOX, ttl_s=120)).start()
    try:
        gone = requests.exceptions.ConnectionError("('Connection aborted.', FileNotFoundError(2, 'No such file'))")

        def refuse(self, *a, **k):
            raise gone

        for name in ("exec_create", "inspect_container", "exec_inspect", "remove_container"):
            monkeypatch.setattr(APIClient, name, refuse)
        with pytest.raises(SandboxError) as e:
            await sb.exec("echo up", timeout=10)
        assert (await infra_error(e.value, "docker")).failure_cause in ("sandbox_lost", "sandbox_engine")
        with pytest.raises(SandboxError, match="remove failed"):
            await sb.stop()
    finally:
        monkeypatch.undo()
        sb._stopped = False  # the refused stop marked it stopped: remove it for real
        await sb.stop()
