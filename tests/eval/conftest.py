"""Shared fixtures of the SWE tests: the real upstream instances (built once from PyPI sdists into the user cache,
reused across runs) and checks that the sandbox engines are there (a missing engine fails, never skips)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def upstream() -> Path:
    """``instances.jsonl``, ``env_specs.yaml`` and ``repos/`` of the shipped upstream recipes (jinja2 3.1.3->3.1.4,
    more-itertools 10.3.0->10.4.0), as a user would bring SWE-bench instances."""
    from agentrl.envs.swe.repos import default_cache_dir
    from agentrl.envs.swe.upstream import build

    return build(default_cache_dir() / "upstream")


@pytest.fixture(scope="session")
def docker_ready() -> None:
    from agentrl.sandboxes.docker import docker_available, docker_client

    ok, why = docker_available()
    assert ok, f"docker is required for the SWE tests: {why}"
    try:
        docker_client().images.get("agentrl-base:latest")
    except Exception as e:
        pytest.fail(f"image agentrl-base:latest missing (run `agentrl sandboxes build-image`): {e}")


@pytest.fixture(scope="session")
def bwrap_ready() -> None:
    from agentrl.sandboxes import bwrap_available, rootfs_path

    ok, why = bwrap_available()
    assert ok, f"bubblewrap is required: {why}"
    assert rootfs_path("agentrl-base:latest").is_dir(), "run `agentrl sandboxes build-image base` (the bwrap rootfs)"
