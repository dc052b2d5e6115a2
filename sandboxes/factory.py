"""The sandbox for a spec: the one place that maps ``SandboxSpec.backend`` to its class."""

from __future__ import annotations

from .base import Sandbox, SandboxSpec
from .bwrap import BwrapSandbox
from .docker import DockerSandbox


def create_sandbox(spec: SandboxSpec, *, run: str | None = None) -> Sandbox:
    """The sandbox for ``spec.backend`` (not started yet). ``run`` overrides this process's run label."""
    if spec.backend == "docker":
        return DockerSandbox(spec, run=run)
    if spec.backend == "bwrap":
        return BwrapSandbox(spec, run=run)
    raise ValueError(f"SandboxSpec.backend must be 'docker' or 'bwrap', got {spec.backend!r}")
