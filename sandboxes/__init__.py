"""Sandboxes for envs that run commands: a Docker backend and a bubblewrap backend behind one async API.

Quick use (the SWE-env pattern: a fresh sandbox per episode, a repo in the work dir, shell commands, a diff)::

    from agentrl.sandboxes import SandboxSpec, SandboxPool, create_sandbox

    spec = SandboxSpec(backend="docker", image="agentrl-base:latest")   # or backend="bwrap": same image name
    async with create_sandbox(spec) as sb:                              # start() ... stop()
        await sb.upload("/path/to/repo", "/workspace")                  # host dir -> sandbox dir
        res = await sb.exec("python3 -m pytest -q", timeout=60)         # ExecResult
        res.output, res.exit_code, res.timed_out, res.truncated, res.duration
        await sb.write_file("src/x.py", "print(1)\\n")                   # relative paths: under spec.workdir
        data: bytes = await sb.read_file("src/x.py", max_bytes=1 << 20)  # FileTooLarge beyond
        diff = (await sb.exec("git diff", timeout=30)).output
        await sb.download("/workspace/out", "/host/dir")                # streamed, max_bytes=1 GiB
        await sb.download_file("/workspace/big.bin", "/host/big.bin")   # one file, streamed

    pool = SandboxPool(max_alive=64, create_rate=20)                     # bounded, rate-limited, retrying
    async with pool.acquire(spec) as sb: ...                             # reuse=True: warm sandbox, reset on release
    await pool.close()

Public API
- ``SandboxSpec(backend="docker"|"bwrap", image="agentrl-base:latest", root=None, workdir="/workspace",
  memory_mb=512, cpus=1.0, pids=256, network=False, ttl_s=3600, workdir_size_mb=1024, tmp_size_mb=256,
  user=None, env={}, mounts=(Mount(source, target, read_only=True),), labels={}, output_limit=1 MiB)``:
  frozen; ``validate()`` raises ValueError naming the bad field.
- ``create_sandbox(spec, run=None) -> Sandbox`` (not started; use ``async with`` or ``await sb.start()``).
- ``Sandbox``: ``start()``, ``stop()`` (idempotent), ``exec(cmd, *, timeout=60, cwd=None, env=None,
  output_limit=None) -> ExecResult`` (``cmd``: shell string run by ``sh -c``, or an argv list), ``write_file(path,
  data, mode=0o644)``, ``read_file(path, *, max_bytes=64 MiB) -> bytes``, ``download_file(remote_path, local_path,
  *, max_bytes=1 GiB) -> int``, ``upload(local_dir, remote_dir=None)``, ``download(remote_dir, local_dir, *,
  max_bytes=1 GiB)``, ``reset()``; attributes ``id``, ``run_id``, ``spec``, ``running``, ``expires_at``; docker:
  ``reaper`` ("host-cgroup" or the weaker "in-sandbox"); bwrap: ``limits`` ("cgroup-v1+tmpfs", ...),
  ``isolation`` ("seccomp+no-userns").
- ``ExecResult(output: str, exit_code: int, timed_out: bool, truncated: bool, duration: float, oom_killed: bool,
  disk_full: bool)``, ``.ok``; ``oom_killed``: the sandbox hit its memory limit during the command (its memory
  cgroup's OOM kills); ``disk_full``: its work dir or /tmp had no free block left when the command ended.
  ``output`` is stdout+stderr interleaved, UTF-8 decoded with replacement; over the cap, head and tail are kept
  around a ``[... N bytes of output truncated ...]`` line. A timed-out command has ``exit_code == 124``.
- ``SandboxError(message, sandbox_id=, transient=)``: the sandbox is not running (not started, stopped, expired,
  container/process died), or an engine call failed. Never a hang: every call ends within its timeout + grace.
  ``FileTooLarge(SandboxError)``: a read or download over its ``max_bytes``; ``.path``, ``.size`` (None when
  unknown, e.g. /dev/zero), ``.max_bytes``; nothing is kept. ``.failure_cause``: one of ``SANDBOX_FAILURE_CAUSES``
  (``sandbox_lost``, ``sandbox_engine``, ``sandbox_oom``, ``sandbox_disk``) or None; an env names it with
  ``infra_error(err, backend)`` and ``check_limits(result)`` (:mod:`.faults`), and the env manager retries such an
  episode in a fresh sandbox (``ManagerConfig.infra_retries``).
- ``SandboxPool(max_alive=64, create_rate=20.0, create_burst=4, retries=3, backoff_s=0.5, max_warm=8,
  guard=HostGuard(overcommit=4.0))``: ``acquire(spec, reuse=False)`` (async context manager), ``prewarm(spec, n)``,
  ``keep_warm(spec, n, wait=False)`` (a warm pool of fresh sandboxes, refilled in the background), ``close()``,
  ``stats``, ``swept()`` (the orphan sweeps it started, see Lifecycle).
- ``take_snapshot(sb, max_bytes=64 MiB) -> Snapshot`` (a prepared work dir, captured once);
  ``restore_snapshot(sb, snap)``: reset, then the work dir holds exactly the snapshot again (per episode, instead of
  a rebuild); the pool's ``keep_warm(..., snapshot=)`` and ``acquire(..., reuse=True, snapshot=)`` use it.
- ``BadCommand(ValueError)``: an exec's input that no sandbox can run, the same from every backend: a NUL byte or a
  lone surrogate in the command, an env value, the cwd or a file operation's path; a command over ``MAX_COMMAND_BYTES`` (131,071: the
  kernel's limit on one argument); an env name that is not a variable name; an ``output_limit`` below 1. Raised
  before anything runs; the sandbox stays usable. Envs answer it as the action's error, not as an infra failure.
- ``HostCapacityError(SandboxError)``: the host cannot hold one more sandbox (``.limit``: "memory", "pids" or
  "fds"; ``.need``, ``.have``); raised before anything is created.
- ``sweep(run=None, everything=False) -> SweepReport``; ``build_image("base"|"busybox")``; ``rootfs_path(image)``;
  ``run_id()`` (this process's run label, ``$AGENTRL_RUN_ID`` if set); ``docker_available()``,
  ``bwrap_available()``.

Guarantees (each tested against the real backend, both backends; tests/sandboxes/test_hostile.py plants the escapes)
- Defaults: no network, memory/CPU/pid limits, read-only root with writable work dir and /tmp (sized tmpfs), no new
  privileges, all capabilities dropped, uid 1000:1000 whatever the image's USER (``user="0:0"`` asks for root).
- The host ends commands: each exec runs in a group the sandbox user cannot leave (docker: a cgroup of its own under
  the container's; bwrap: a PID namespace of its own). When the command returns, or its timeout passes on the
  driver's clock, the whole group is killed: ``setsid``/``env -i`` children and killing the wrapper escape nothing.
  ``timed_out`` is set, the sandbox stays usable.
- Lifecycle: a run label and a TTL on every sandbox (docker: the container's main process is ``sleep TTL``, run as a
  uid no command has, with ``auto_remove``; bwrap: ``--die-with-parent``, so nothing runs once the driver is gone).
  Normal exit and SIGTERM stop this process's sandboxes at once. What a SIGKILLed driver leaves (containers, bwrap
  state dirs, tmpfs mounts, cgroups) is swept when a pool starts, when a sandbox finds itself expired, and at most
  every 5 minutes as sandboxes are created; ``agentrl sandboxes sweep [--run ID]`` does it by hand.
- Warm reuse (``reset``) kills the previous episode's processes and empties the work dir, /tmp, /dev/shm,
  /dev/mqueue and SysV IPC (docker; bwrap has a fresh /dev and IPC namespace per exec).
- bwrap: seccomp filter, no nested user namespaces, bwrap's options (env values included) passed through a file
  descriptor, an empty environment for its init (no host PATH or driver cwd in the sandbox's /proc/1/environ).

Backends: ``docker`` (docker-py, ``DOCKER_HOST`` honoured; images from ``agentrl sandboxes build-image``) and
``bwrap`` (one bwrap per exec over a persistent work dir, a per-sandbox cgroup for limits; it runs on the rootfs
cached by ``build-image`` for ``spec.image`` when present, else on the host's /usr). See docker.py and bwrap.py.
Host-side enforcement (exec cgroups, tmpfs mounts, cgroup limits) needs the driver to run as root on the host that
runs the sandboxes; elsewhere each backend falls back to weaker means and says so (``reaper``, ``limits``).
"""

from __future__ import annotations

from .base import (
    SANDBOX_FAILURE_CAUSES,
    ExecResult,
    FileTooLarge,
    Mount,
    OutputCap,
    Sandbox,
    SandboxError,
    SandboxSpec,
    cleanup_all,
    run_id,
)
from .build import build_image, rootfs_path
from .bwrap import BwrapSandbox, bwrap_available
from .docker import DockerSandbox, docker_available
from .factory import create_sandbox
from .faults import check_limits, infra_error
from .guards import HostCapacityError, HostGuard, HostLimits
from .pool import ExecGate, SandboxPool, TokenBucket
from .snapshot import Snapshot, restore_snapshot, take_snapshot
from .sweep import SweepReport, sweep
from .wrappers import MAX_COMMAND_BYTES, BadCommand

__all__ = [
    "MAX_COMMAND_BYTES",
    "SANDBOX_FAILURE_CAUSES",
    "BadCommand",
    "BwrapSandbox",
    "DockerSandbox",
    "ExecGate",
    "ExecResult",
    "FileTooLarge",
    "HostCapacityError",
    "HostGuard",
    "HostLimits",
    "Mount",
    "OutputCap",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxSpec",
    "Snapshot",
    "SweepReport",
    "TokenBucket",
    "build_image",
    "bwrap_available",
    "check_limits",
    "cleanup_all",
    "create_sandbox",
    "docker_available",
    "infra_error",
    "restore_snapshot",
    "rootfs_path",
    "run_id",
    "sweep",
    "take_snapshot",
]
