"""Fixtures for the sandbox tests: every test runs against the real backend (docker engine, bwrap).

A backend or image that is missing skips the test on a developer machine and FAILS it in CI (``CI=true``), so a CI
run can never pass by skipping the sandbox suite. All sandboxes of the session carry one run label, and the session
ends by checking that none of them is left.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

import pytest

from agentrl.sandboxes import SandboxSpec, bwrap_available, docker_available, rootfs_path
from agentrl.sandboxes import base as sb_base
from agentrl.sandboxes import lifecycle

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BUSYBOX = "agentrl-busybox:latest"
BASE = "agentrl-base:latest"
TEST_RUN = f"pytest-{os.getpid()}-{secrets.token_hex(3)}"
BACKENDS = ["docker", "bwrap"]


def unavailable(reason: str) -> None:
    """Skip locally, fail in CI."""
    if IN_CI:
        pytest.fail(f"sandbox backend unavailable in CI: {reason}")
    pytest.skip(reason)


_checked: dict[str, tuple[bool, str]] = {}


def require_backend(backend: str, image: str | None = None) -> None:
    if backend not in _checked:
        _checked[backend] = docker_available() if backend == "docker" else bwrap_available()
    ok, why = _checked[backend]
    if not ok:
        unavailable(f"{backend}: {why}")
    if image is None:
        return
    if backend == "docker":
        from agentrl.sandboxes.build import docker_image_exists

        if not docker_image_exists(image):
            unavailable(f"docker image {image} missing: run `agentrl sandboxes build-image --all`")
    elif not rootfs_path(image).is_dir():
        unavailable(f"rootfs for {image} missing: run `agentrl sandboxes build-image --all`")


@pytest.fixture(autouse=True, scope="session")
def _session_run_label():
    """Every sandbox created in-process carries TEST_RUN; nothing of it may outlive the session."""
    old = lifecycle._RUN_ID
    lifecycle._RUN_ID = TEST_RUN
    yield
    lifecycle._RUN_ID = old
    leftovers = []
    ok, _ = docker_available()
    if ok:
        from agentrl.sandboxes.docker import docker_client

        leftovers += [c["Id"][:12] for c in docker_client().api.containers(
            filters={"label": f"{sb_base.LABEL_RUN}={TEST_RUN}"})]
    state = sb_base.state_root() / TEST_RUN
    if state.exists():
        leftovers += [p.name for p in state.iterdir()]
    from agentrl.sandboxes import sweep

    sweep(TEST_RUN)
    assert not leftovers, f"sandboxes leaked by the test session: {leftovers}"


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def busybox_spec(backend) -> SandboxSpec:
    require_backend(backend, BUSYBOX)
    return SandboxSpec(backend=backend, image=BUSYBOX, ttl_s=300, memory_mb=256, pids=128)


@pytest.fixture
def base_spec(backend) -> SandboxSpec:
    require_backend(backend, BASE)
    return SandboxSpec(backend=backend, image=BASE, ttl_s=300, memory_mb=256, pids=128)


LIST_PROCS = (
    # Command lines of every process in the sandbox except this probe (works with busybox and procps-less images).
    'for d in /proc/[0-9]*; do [ "${d#/proc/}" = "$$" ] && continue; '
    'c=$(tr "\\0" " " < $d/cmdline 2>/dev/null); [ -n "$c" ] && echo "${d#/proc/}: $c"; done; true'
)


async def leftovers(sb, needle: str) -> list[str]:
    """Processes of the sandbox whose command line contains ``needle``: seen from inside for docker (one PID
    namespace per container), from the host through the sandbox's cgroup for bwrap (one PID namespace per exec)."""
    if sb.backend == "docker":
        out = (await sb.exec(LIST_PROCS, timeout=20)).output
        return [ln for ln in out.splitlines() if needle in ln]
    found = []
    for pid in sb.cgroup.pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            found.append(f"{pid}: {cmd}")
    return found


async def until_gone(sb, needle: str, timeout: float = 30.0) -> list[str]:
    """Waits until no process of the sandbox matches ``needle`` (killing a tree takes a moment, longer on a loaded
    machine); returns what is left after ``timeout`` seconds (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while (left := await leftovers(sb, needle)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


async def until_running(sb, needle: str, timeout: float = 60.0) -> None:
    """Waits until a process of the sandbox matches ``needle`` (a command that was started is running)."""
    deadline = time.monotonic() + timeout
    while not await leftovers(sb, needle):
        assert time.monotonic() < deadline, f"no process {needle!r} in the sandbox after {timeout} s"
        await asyncio.sleep(0.05)
