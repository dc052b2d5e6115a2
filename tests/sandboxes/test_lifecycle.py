"""Lifecycle against the real backends: a SIGKILLed driver leaves nothing running after the TTL, SIGTERM and normal
exit clean up at once, sweep removes leftovers (and only orphans when no run is named)."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.sandboxes import SandboxSpec, create_sandbox, sweep
from agentrl.sandboxes.base import LABEL_RUN, state_root

from .conftest import BUSYBOX, require_backend

DRIVER = Path(__file__).with_name("sandbox_driver.py")
REPO = Path(__file__).resolve().parents[2]


def _start_driver(run: str, ttl: float, mode: str = "wait") -> tuple[subprocess.Popen, list[dict]]:
    require_backend("docker", BUSYBOX)
    require_backend("bwrap", BUSYBOX)
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), run, str(ttl), "docker,bwrap", mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise AssertionError(f"driver failed: {line!r} {proc.stderr.read()[-3000:]}")
    return proc, json.loads(line[6:])


def _containers(run: str, *, all_states: bool = True) -> list[dict]:
    from agentrl.sandboxes.docker import docker_client

    return docker_client().api.containers(all=all_states, filters={"label": f"{LABEL_RUN}={run}"})


def _bwrap_procs(run: str) -> list[str]:
    """Host processes in the run's cgroups (its bwrap sandboxes' processes)."""
    needle = f"/agentrl/{run}/"
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle not in (d / "cgroup").read_text():
                    continue
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            out.append(f"{d.name}: {cmd[:120]}")
    return out


def _wait_until(cond, timeout: float, step: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def test_sigkilled_driver_leaves_nothing_running_after_ttl():
    run = f"test-kill-{secrets.token_hex(3)}"
    ttl = 5.0
    proc, info = _start_driver(run, ttl)
    try:
        assert len(_containers(run, all_states=False)) == 2
        assert len(_bwrap_procs(run)) >= 2
        t_kill = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # bwrap: --die-with-parent takes every sandbox process down with the driver
        assert _wait_until(lambda: not _bwrap_procs(run), 5), _bwrap_procs(run)
        # docker: the in-container dead-man timer ends each container at its TTL, auto-remove deletes it
        assert _wait_until(lambda: not _containers(run), ttl + 15), _containers(run)
        assert time.monotonic() - t_kill < ttl + 15
        # what a killed driver cannot remove itself (bwrap state dirs, cgroups) goes with a sweep of the run
        assert (state_root() / run).exists()
        cli = subprocess.run(
            [str(REPO / ".venv/bin/agentrl"), "sandboxes", "sweep", "--run", run],
            capture_output=True, text=True, timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert "swept 0 containers, 2 bwrap sandboxes" in cli.stdout, cli.stdout
        assert not (state_root() / run).exists()
        for entry in info:
            if entry["backend"] == "bwrap":
                assert not Path(entry["state_dir"]).exists()
    finally:
        proc.kill()
        sweep(run)


@pytest.mark.parametrize("how", ["sigterm", "exit"])
def test_sigterm_and_normal_exit_clean_up_at_once(how):
    run = f"test-{how}-{secrets.token_hex(3)}"
    proc, _ = _start_driver(run, 600, mode="exit" if how == "exit" else "wait")
    try:
        t0 = time.monotonic()
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        try:
            # Bounded by the TTL's scale, not a quiet machine's: right after the daemon-restart tests, under CI's
            # load, docker's removals have taken over 30 s. A hang still fails, with the driver's stacks.
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # faulthandler in the driver: where it is stuck
            time.sleep(1)
            proc.kill()
            raise AssertionError(f"driver still running 120 s after {how}: {proc.communicate(timeout=30)[1][-4000:]}")
        assert _wait_until(lambda: not _containers(run) and not (state_root() / run).exists(), 5), (
            _containers(run), list((state_root() / run).glob("*")) if (state_root() / run).exists() else [],
        )
        assert not _bwrap_procs(run)
        assert time.monotonic() - t0 < 120  # far below the 600 s TTL
        if how == "sigterm":
            assert proc.returncode == -signal.SIGTERM  # the default action still happens after cleanup
    finally:
        proc.kill()
        sweep(run)


async def test_sweep_without_run_removes_only_orphans(monkeypatch):
    require_backend("docker", BUSYBOX)
    import importlib

    # the package exports a function named sweep, so take the module itself
    monkeypatch.setattr(importlib.import_module("agentrl.sandboxes.sweep"), "auto_sweep", lambda *a, **k: None)  # this test sweeps by hand
    run = f"test-orphan-{secrets.token_hex(3)}"
    proc, _ = _start_driver(run, 600)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    try:
        async with create_sandbox(SandboxSpec(backend="docker", image=BUSYBOX, ttl_s=120)) as mine, \
                create_sandbox(SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=120)) as mine_bw:
            assert _containers(run)  # the orphans are still there (TTL 600 s)
            report = sweep()  # no run: only sandboxes whose driver is gone or that expired
            assert sum(r.startswith(run) for r in report.containers) == 2, report
            assert sum(r.startswith(run) for r in report.bwrap) == 2, report
            assert not _containers(run) and not (state_root() / run).exists()
            # this process is alive: its sandboxes were left alone
            assert (await mine.exec("echo ok", timeout=10)).ok
            assert (await mine_bw.exec("echo ok", timeout=10)).ok
    finally:
        proc.kill()
        sweep(run)


async def test_a_docker_create_whose_answer_timed_out_after_the_engine_made_the_container_leaves_none(monkeypatch):
    """A loaded engine can make the container and answer after the client's timeout: the failed create must not
    leave it behind (seen at 1,024 docker sandboxes: "Created" containers of a live driver, kept until their TTL)."""
    require_backend("docker", BUSYBOX)
    import docker
    import requests

    from agentrl.sandboxes import SandboxError
    from agentrl.sandboxes.docker import docker_client

    real = docker.api.client.APIClient.create_container

    def late(self, *a, **k):
        real(self, *a, **k)
        raise requests.exceptions.ReadTimeout("read timed out (the engine made it; its answer came too late)")

    monkeypatch.setattr(docker.api.client.APIClient, "create_container", late)
    sb = create_sandbox(SandboxSpec(backend="docker", image=BUSYBOX, ttl_s=120))
    with pytest.raises(SandboxError, match="create failed") as e:
        await sb.start()
    assert e.value.transient  # the pool retries it, in a sandbox of its own
    assert docker_client().api.containers(all=True, filters={"name": sb.name}) == []


def test_sweep_removes_a_container_left_created_past_the_grace_even_of_a_live_driver(monkeypatch):
    """A live driver starts its container right after creating it: one still "created" long after was abandoned
    (its create's answer lost, or its start failed and so did the removal), and goes with the next sweep."""
    require_backend("docker", BUSYBOX)
    import importlib

    from agentrl.sandboxes.base import LABEL_DRIVER, LABEL_EXPIRES, LABEL_SANDBOX
    from agentrl.sandboxes.docker import docker_client
    from agentrl.sandboxes.lifecycle import driver_tag

    sweep_mod = importlib.import_module("agentrl.sandboxes.sweep")
    run = f"test-created-{secrets.token_hex(3)}"
    labels = {LABEL_RUN: run, LABEL_SANDBOX: "abandoned", LABEL_EXPIRES: str(int(time.time()) + 600),
              LABEL_DRIVER: driver_tag()}
    api = docker_client().api
    api.create_container(BUSYBOX, command=["sleep", "60"], labels=labels)
    try:
        sweep()
        assert [c["State"] for c in _containers(run)] == ["created"]  # within the grace: a create under way
        monkeypatch.setattr(sweep_mod, "CREATED_GRACE_S", 0.0)
        report = sweep()
        assert f"{run}/abandoned" in report.containers, report
        assert _containers(run) == []
    finally:
        sweep(run)


async def test_bwrap_create_survives_the_run_dir_vanishing_under_it(monkeypatch):
    """The run's state dir is removed whenever it is empty (the release of its last sandbox, or a sweep, in another
    thread or process): a sandbox being created at that moment makes it again instead of failing with ENOENT (seen
    in CI: a warm-reuse test's create failed while an automatic sweep ran)."""
    require_backend("bwrap", BUSYBOX)
    import os

    from agentrl.sandboxes import lifecycle

    monkeypatch.setattr(lifecycle, "_RUN_ID", f"test-vanish-{secrets.token_hex(3)}")
    run_dir = state_root() / lifecycle._RUN_ID
    real_mkdir, vanished = os.mkdir, []

    def mkdir(path, *a, **k):
        p = Path(path)
        if p.parent == run_dir and not vanished and run_dir.is_dir() and not any(run_dir.iterdir()):
            vanished.append(p)
            os.rmdir(run_dir)  # what the other thread's sweep does, between the two mkdirs
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", mkdir)
    async with create_sandbox(SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=60)) as sb:
        monkeypatch.setattr(os, "mkdir", real_mkdir)
        assert vanished and (await sb.exec("echo ok")).output.strip() == "ok"
    assert not run_dir.exists()


async def test_bwrap_create_survives_the_run_cgroup_vanishing_under_it(monkeypatch):
    """The run's cgroup dir is removed by the release of its last sandbox (in another thread), which can fall
    between a new sandbox's making that dir and making its own under it: the new sandbox makes both again instead of
    failing with ENOENT (seen in a run of ``tests/sandboxes``: ``test_pool_rate_limits_creation[bwrap]``'s create
    failed on ``/sys/fs/cgroup/memory/agentrl/<run>/<sandbox>``)."""
    require_backend("bwrap", BUSYBOX)
    import os

    from agentrl.sandboxes import cgroups, lifecycle
    from agentrl.sandboxes.bwrap_state import safe_name

    from .conftest import unavailable

    if cgroups.cgroup_mode() == "none":
        unavailable("no writable cgroup hierarchy: bwrap sandboxes use rlimits here, no cgroup dir to race")
    monkeypatch.setattr(lifecycle, "_RUN_ID", f"test-cg-vanish-{secrets.token_hex(3)}")
    real_mkdir, vanished = os.mkdir, []

    def mkdir(path, *a, **k):
        p = Path(path)
        run_dir = p.parent
        if (not vanished and run_dir.parent.name == "agentrl" and run_dir.name == safe_name(lifecycle._RUN_ID)
                and p.name.startswith("bwrap-") and run_dir.is_dir()
                and not any(x.is_dir() for x in run_dir.iterdir())):
            vanished.append(p)
            os.rmdir(run_dir)  # the release of the run's last other sandbox, between the two mkdirs
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", mkdir)
    async with create_sandbox(SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=60)) as sb:
        monkeypatch.setattr(os, "mkdir", real_mkdir)
        assert vanished and sb.cgroup is not None and all(d.is_dir() for d in sb.cgroup.dirs)
        assert (await sb.exec("echo ok")).output.strip() == "ok"
    assert not any(d.exists() for d in sb.cgroup.dirs)


def test_bench_exec_mounts_runs_and_unmounts_what_it_mounted():
    """``benchmarks/bench_exec_mounts.py`` at a tiny size: a row per point, and none of its mounts left."""
    require_backend("bwrap", BUSYBOX)
    import os

    from .conftest import unavailable

    if os.geteuid() != 0:
        unavailable("the benchmark mounts tmpfs on the host: root only")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_exec_mounts.py"), "--points", "0", "8",
                          "--execs", "3", "--image", BUSYBOX], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [x for x in out.stdout.splitlines() if x.startswith("| ") and x[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["0", "8"], out.stdout
    assert "agentrl-bench-mounts-" not in Path("/proc/self/mounts").read_text()


def test_make_under_run_dir_retries_a_vanished_parent_and_gives_up_after_its_attempts():
    from agentrl.sandboxes.lifecycle import make_under_run_dir

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise FileNotFoundError("the run's dir went")

    make_under_run_dir(flaky)
    assert len(calls) == 3
    calls.clear()

    def gone():
        calls.append(1)
        raise FileNotFoundError("the run's dir went")

    with pytest.raises(FileNotFoundError):
        make_under_run_dir(gone, attempts=4)
    assert len(calls) == 4


def test_docker_sweep_reports_an_engine_that_does_not_answer_instead_of_raising(monkeypatch):
    """A daemon overloaded by 1,500 containers timed out a removal (requests' ReadTimeout, after 120 s) and the
    sweep CLI died with a traceback, leaving the rest. Each failure is now one error in the report; the sweep goes
    on, and an engine that cannot even list gives one error naming it."""
    import requests

    from agentrl.sandboxes import docker_engine
    from agentrl.sandboxes.sweep import sweep_docker

    removed = []

    class Api:
        def __init__(self, list_fails=False):
            self.list_fails = list_fails

        def containers(self, **_):
            if self.list_fails:
                raise requests.exceptions.ConnectionError("connection refused")
            return [{"Id": f"{i:064x}", "State": "running", "Labels": {"agentrl.run": "r", "agentrl.sandbox": f"s{i}"}}
                    for i in range(3)]

        def remove_container(self, cid, force):
            if cid.endswith("1"):
                raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=120)")
            removed.append(cid)

    class Client:
        def __init__(self, api):
            self.api = api

    monkeypatch.setattr(docker_engine, "docker_client", lambda: Client(Api()))
    report = sweep_docker("r")
    assert len(removed) == 2 and report.containers == ["r/s0", "r/s2"]
    assert len(report.errors) == 1 and "ReadTimeout" in report.errors[0] and "read timeout=120" in report.errors[0]
    monkeypatch.setattr(docker_engine, "docker_client", lambda: Client(Api(list_fails=True)))
    report = sweep_docker("r")
    assert report.containers == [] and len(report.errors) == 1 and "docker engine" in report.errors[0]
