"""Offline image builds, the `agentrl sandboxes` command, and DOCKER_HOST."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentrl.sandboxes import SandboxSpec, build_image, create_sandbox
from agentrl.sandboxes.build import RECIPES, docker_image_exists, rootfs_path

from .conftest import BASE, BUSYBOX, TEST_RUN, require_backend, unavailable

REPO = Path(__file__).resolve().parents[2]
AGENTRL = str(REPO / ".venv/bin/agentrl")


async def test_build_busybox_image_from_scratch(tmp_path, monkeypatch):
    """The busybox recipe builds and imports offline, and both backends run the result."""
    require_backend("docker")
    require_backend("bwrap")
    if os.geteuid() != 0:
        unavailable("image builds need root")
    # bwrap runs as an unprivileged uid, so the cache must be traversable (pytest's tmp_path is mode 700)
    cache = tempfile.mkdtemp(prefix="agentrl-cache-test-", dir="/var/tmp")
    os.chmod(cache, 0o755)
    monkeypatch.setenv("AGENTRL_SANDBOX_CACHE", cache)
    tag = f"agentrl-busybox-test-{os.getpid()}:ci"
    from agentrl.sandboxes.docker import docker_client

    try:
        assert build_image("busybox", tag=tag, log=lambda *_: None) == tag
        assert docker_image_exists(tag)
        assert (rootfs_path(tag) / "bin" / "busybox").is_file()
        assert docker_client().api.inspect_image(tag)["Config"]["User"] == "1000:1000"
        for backend in ("docker", "bwrap"):
            async with create_sandbox(SandboxSpec(backend=backend, image=tag, ttl_s=60)) as sb:
                res = await sb.exec("busybox | head -1; id -u", timeout=20)
                assert res.ok and "BusyBox" in res.output and res.output.split()[-1] == "1000", res
        # a second build is a no-op
        logs: list[str] = []
        build_image("busybox", tag=tag, log=logs.append)
        assert logs == [f"{tag}: already built"]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        try:
            docker_client().api.remove_image(tag, force=True)
        except Exception:
            pass


def test_cli_build_image_skips_existing_and_lists():
    require_backend("docker", BUSYBOX)
    require_backend("docker", BASE)
    out = subprocess.run([AGENTRL, "sandboxes", "build-image", "--all"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok agentrl-busybox:latest" in out.stdout and "ok agentrl-base:latest" in out.stdout
    assert "already built" in out.stdout
    assert set(RECIPES) == {"base", "busybox"}


async def test_cli_list_and_sweep_named_run(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        out = subprocess.run([AGENTRL, "sandboxes", "list", "--run", TEST_RUN], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and sb.id in out.stdout, out
        swept = subprocess.run([AGENTRL, "sandboxes", "sweep", "--run", TEST_RUN, "--backend", sb.backend],
                               capture_output=True, text=True, timeout=60)
        assert swept.returncode == 0 and "swept" in swept.stdout
        with pytest.raises(Exception):
            await sb.exec("true", timeout=5)


def test_docker_host_is_honoured(tmp_path):
    """docker.from_env(): a DOCKER_HOST pointing nowhere fails clearly (transient, so the pool would retry);
    pointing at the real engine's socket works."""
    require_backend("docker", BUSYBOX)
    script = (
        "import asyncio\n"
        "from agentrl.sandboxes import SandboxSpec, SandboxError, create_sandbox, docker_available\n"
        "print('available', docker_available()[0])\n"
        "async def main():\n"
        "    try:\n"
        "        async with create_sandbox(SandboxSpec(image='agentrl-busybox:latest', ttl_s=30)) as sb:\n"
        "            print('exec', (await sb.exec('echo hi', timeout=10)).output.strip())\n"
        "    except SandboxError as e:\n"
        "        print('error transient=%s' % e.transient)\n"
        "asyncio.run(main())\n"
    )
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/nope.sock")
    bad = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "available False" in bad.stdout and "error transient=True" in bad.stdout, (bad.stdout, bad.stderr)
    env["DOCKER_HOST"] = "unix:///var/run/docker.sock"
    good = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "available True" in good.stdout and "exec hi" in good.stdout, (good.stdout, good.stderr)
