"""Naming the cause when a sandbox fails an episode, so that the env manager can count it and retry the episode in
a fresh sandbox (``failures/<cause>``, :data:`~.base.SANDBOX_FAILURE_CAUSES`).

An env that runs its steps in a sandbox calls :func:`check_limits` on each command's result (a command that hit
the sandbox's memory or disk limit is the sandbox's failure, not the step's outcome) and passes every
:class:`~.base.SandboxError` it catches through :func:`infra_error` before re-raising it. What cannot be named at
the raise site is found out here: a docker sandbox whose engine no longer answers lost it to the engine
(``sandbox_engine``: a daemon restart or crash); any other dead sandbox was lost (``sandbox_lost``). A refusal by
the host guard (:class:`~.guards.HostCapacityError`) and a read over its own ``max_bytes``
(:class:`~.base.FileTooLarge`) are not infrastructure failures: a fresh sandbox would meet them again.
"""

from __future__ import annotations

from .base import ExecResult, FileTooLarge, SandboxError, to_thread
from .guards import HostCapacityError


def check_limits(res: ExecResult, sandbox_id: str = "") -> ExecResult:
    """Returns ``res``; raises SandboxError (``sandbox_oom`` / ``sandbox_disk``) when the command hit the sandbox's
    memory or disk limit."""
    if res.oom_killed:
        raise SandboxError("a command hit the sandbox's memory limit (OOM kill)", sandbox_id=sandbox_id,
                           cause="sandbox_oom")
    if res.disk_full:
        raise SandboxError("a command filled the sandbox's work dir or /tmp (disk limit)", sandbox_id=sandbox_id,
                           cause="sandbox_disk")
    return res


async def infra_error(err: SandboxError, backend: str) -> SandboxError:
    """``err`` with its ``failure_cause`` set when it is an infrastructure failure (left None otherwise, see the
    module docstring); ``backend`` is the failed sandbox's ("docker" asks whether its engine still answers)."""
    if err.failure_cause is not None or isinstance(err, (HostCapacityError, FileTooLarge)):
        return err
    cause = "sandbox_lost"
    if backend == "docker":
        from .docker_engine import docker_available

        ok, _ = await to_thread(docker_available)
        if not ok:
            cause = "sandbox_engine"
    err.failure_cause = cause
    return err
