"""The docker backend: one long-lived container per sandbox, driven through docker-py's low-level API.

Container: ``docker-init -- sleep TTL`` as its main process, run as :data:`~.base.TTL_UID`, a uid no command has:
the dead-man timer (the container exits when the TTL runs out, and ``auto_remove`` deletes it, even if the driver
was SIGKILLed) that no command can signal or trace (no capability, another uid). ``--network none``, memory (no
swap), CPU and pid limits, read-only root, tmpfs work dir and /tmp owned by the exec user, all capabilities
dropped, ``no-new-privileges``. Every container carries the labels ``agentrl.run``, ``agentrl.sandbox``,
``agentrl.expires`` and ``agentrl.driver``.

Commands run through ``exec`` as ``spec.user`` (default 1000:1000, whatever the image's USER) under the wrapper of
base.py. With the driver on the engine's host as root (``reaper == "host-cgroup"``): the wrapper waits on stdin
until the driver found its pid (by a marker on its command line, in the container's cgroup) and moved it into a
cgroup of its own under the container's; when the command reports its exit status, or its timeout passes on the
driver's clock, the driver kills that cgroup: the command's whole tree, from outside the container. Otherwise
(``reaper == "in-sandbox"``: a remote ``DOCKER_HOST``, a non-root driver) an in-container watchdog enforces the
timeout, which the sandbox user could kill; a warning says so once.

Files move as tar/cat streams over an exec's stdin/stdout (``put_archive`` cannot write into a tmpfs of a read-only
container). docker-py blocks, so every engine call runs in the sandbox thread pool. ``DOCKER_HOST`` etc. are honoured
(``docker.from_env``; the client and the exec stream reader live in docker_engine.py).
"""

from __future__ import annotations

import logging
import math
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .base import (
    LABEL_DRIVER,
    LABEL_EXPIRES,
    LABEL_RUN,
    LABEL_SANDBOX,
    PLAIN_TIMEOUT_S,
    TTL_UID,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxError,
    SandboxSpec,
    driver_tag,
    full_dirs,
    install_exit_hooks,
    new_marker,
    register_live,
    to_thread,
    unregister_live,
)
from .cgroups import ContainerGroups, memory_cgroup_of, oom_kills
from .docker_engine import _is_transient, _Stream, docker_available, docker_client  # noqa: F401 (re-exported)
from .wrappers import STATUS_TIMEOUT, TIMEOUT_EXIT, check_exec, done_code, watchdog_command, wrap_command

log = logging.getLogger("agentrl.sandboxes")

# Slack after a timeout (or the command's end) for the exec's stream to close once its group was killed.
EXEC_GRACE_S = 15.0
# How long a new exec may take to show up in the container (runc exec on a loaded engine).
EXEC_START_S = 60.0
REMOVE_WAIT_S = 30.0  # a removal the engine already started (auto_remove of a killed container)
_IMAGES_SEEN: set[str] = set()
_WARNED_FALLBACK = False


class DockerSandbox(Sandbox):
    """A sandbox backed by one Docker container. See the module docstring for the container's settings.

    One idea: the :class:`Sandbox` contract on one container; creation, exec streams and the reaper act on the same
    container and its cgroup (the daemon client lives in :mod:`.docker_engine`, limits in :mod:`.cgroups`).

    ``reaper``: "host-cgroup" (the driver kills each exec's cgroup) or "in-sandbox" (the weaker fallback).
    """

    backend = "docker"

    def __init__(self, spec: SandboxSpec, *, run: str | None = None):
        super().__init__(spec, run=run)
        self.container_id: str | None = None
        self.name = f"agentrl-{self.id}"
        uid, gid = spec.uid_gid()
        self.exec_user = f"{uid}:{gid}"
        self.init_pid = 0
        self._memcg: Path | None = None  # the container's memory cgroup on this host (for ExecResult.oom_killed)
        self.groups: ContainerGroups | None = None
        self.reaper = "in-sandbox"

    # lifecycle ------------------------------------------------------------------------------------------------
    async def start(self) -> "DockerSandbox":
        if self.started_at is not None:
            return self
        install_exit_hooks()
        await to_thread(self._create)
        from .sweep import auto_sweep

        auto_sweep(self.backend)
        return self

    def _create(self) -> None:
        import docker

        spec = self.spec
        try:
            client = docker_client()
        except Exception as e:  # docker.errors.DockerException: no engine at DOCKER_HOST (yet)
            raise SandboxError(f"docker engine unreachable: {e}", sandbox_id=self.id, transient=True,
                               cause="sandbox_engine") from e
        now = time.time()
        ttl = max(1, math.ceil(spec.ttl_s))
        labels = {
            **spec.labels,
            LABEL_RUN: self.run_id,
            LABEL_SANDBOX: self.id,
            LABEL_EXPIRES: str(int(now + ttl)),
            LABEL_DRIVER: driver_tag(),
        }
        self._ensure_image(client)
        uid, gid = spec.uid_gid()
        # tools like git refuse a work dir owned by another user
        tmpfs_opts = f"rw,exec,nosuid,nodev,mode=1777,uid={uid},gid={gid}"
        binds = {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts}
        api = client.api
        # The low-level calls (create, start, inspect) rather than containers.run, which inspects before start too.
        try:
            host_config = api.create_host_config(
                init=True,
                auto_remove=True,
                network_mode="bridge" if spec.network else "none",
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                pids_limit=spec.pids,
                nano_cpus=int(spec.cpus * 1e9),
                read_only=True,
                tmpfs={
                    spec.workdir: f"{tmpfs_opts},size={spec.workdir_size_mb}m",
                    "/tmp": f"{tmpfs_opts},size={spec.tmp_size_mb}m",
                },
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                binds=binds or None,
            )
            cid = api.create_container(
                spec.image,
                command=["sleep", str(ttl)],
                entrypoint=[""],  # reset the image's entrypoint: it must not wrap the TTL process
                name=self.name,
                detach=True,
                user=f"{TTL_UID}:{TTL_UID}",
                working_dir=spec.workdir,
                environment={"HOME": "/tmp", **spec.env},
                labels=labels,
                volumes=[m.target for m in spec.mounts] or None,
                host_config=host_config,
            )["Id"]
        except docker.errors.ImageNotFound as e:
            raise SandboxError(
                f"image {spec.image!r} not found ({e.explanation}); build it with "
                "`agentrl sandboxes build-image --all` (no registry is reachable here)",
                sandbox_id=self.id,
            ) from e
        except Exception as e:
            _remove_quietly(api, self.name)  # the engine may have made it and its answer come too late
            raise SandboxError(f"container create failed: {e}", sandbox_id=self.id, transient=_is_transient(e)) from e
        try:
            api.start(cid)
            self.init_pid = int(api.inspect_container(cid)["State"].get("Pid") or 0)
        except Exception as e:
            _remove_quietly(api, cid)  # auto_remove only removes a container that ran
            raise SandboxError(f"container start failed: {e}", sandbox_id=self.id, transient=_is_transient(e)) from e
        self.container_id = cid
        self.started_at = time.time()
        self.expires_at = now + ttl
        register_live(self)
        self.groups = ContainerGroups.find(self.init_pid, cid)
        self.reaper = "host-cgroup" if self.groups is not None else "in-sandbox"
        if self.groups is None:
            _warn_fallback()

    def _ensure_image(self, client) -> None:
        """The image must be local; else one explicit pull (machines with a registry), else a non-transient error
        (containers.run would otherwise try to pull on every create, and a failed pull looks like a 500)."""
        import docker

        image = self.spec.image
        if image in _IMAGES_SEEN:
            return
        try:
            client.api.inspect_image(image)
            _IMAGES_SEEN.add(image)
            return
        except docker.errors.ImageNotFound:
            pass
        except Exception as e:
            raise SandboxError(f"engine unreachable: {e}", sandbox_id=self.id, transient=_is_transient(e)) from e
        try:
            client.images.pull(image)
        except Exception as e:
            raise SandboxError(
                f"image {image!r} not found locally and cannot be pulled ({e}); build the agentrl images with "
                "`agentrl sandboxes build-image --all` (no registry is needed)",
                sandbox_id=self.id,
            ) from e

    async def stop(self) -> None:
        if self._stopped or self.container_id is None:
            self._stopped = True
            return
        await to_thread(self.stop_sync)

    def stop_sync(self) -> None:
        self._stopped = True
        unregister_live(self)
        if self.container_id is None:
            return
        import docker

        api = docker_client().api
        try:
            api.remove_container(self.container_id, force=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as e:
            # auto_remove may already be removing it ("removal ... already in progress"): a container killed from
            # outside. Wait for that removal, so that a stopped sandbox is gone when stop returns.
            if getattr(e.response, "status_code", 0) != 409:
                raise SandboxError(f"remove failed: {e}", sandbox_id=self.id) from e
        except Exception as e:  # the engine went away (a daemon restart): it removes its dead containers on return
            raise SandboxError(f"remove failed: {type(e).__name__}: {e}", sandbox_id=self.id) from e
        deadline = time.monotonic() + REMOVE_WAIT_S
        while time.monotonic() < deadline:
            try:
                api.inspect_container(self.container_id)
            except docker.errors.NotFound:
                return
            except Exception as e:
                raise SandboxError(f"remove failed: {type(e).__name__}: {e}", sandbox_id=self.id) from e
            time.sleep(0.05)
        raise SandboxError(f"container still present {REMOVE_WAIT_S:.0f}s after its removal began (the sweep "
                           "removes it)", sandbox_id=self.id)

    # the raw exec primitive -------------------------------------------------------------------------------------
    def _dead_reason(self) -> str | None:
        """None when the container is running, else why it is not."""
        import docker

        try:
            state = docker_client().api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            return "its container no longer exists (exited at its TTL, killed or removed)"
        except Exception as e:
            return f"its container cannot be inspected ({e})"
        if state.get("Running"):
            return None
        return f"its container is not running (status {state.get('Status')}, exit code {state.get('ExitCode')})"

    async def dead_reason(self) -> str | None:
        """Also asks the engine: a container killed or lost (daemon restart) while idle shows only there."""
        return await super().dead_reason() or await to_thread(self._dead_reason)

    def _dead_soon(self) -> str | None:
        """Like _dead_reason, giving the engine a moment to show a container killed under us as not running."""
        reason = self._dead_reason()
        for _ in range(20):
            if reason:
                break
            time.sleep(0.1)
            reason = self._dead_reason()
        return reason

    def _run(
        self,
        cmd: str,
        *,
        plain: bool,
        timeout: float,
        sink: Callable[[bytes], None],
        stdin: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes, bool]:
        """Run ``cmd`` under the wrapper; stdout into ``sink``. Returns (exit code, stderr, timed out).

        Raises SandboxError when the container is dead; what ``sink`` raises propagates once the exec's tree is dead.
        """
        self._check_alive()
        api = docker_client().api
        marker = new_marker()
        groups = self.groups
        if groups is not None:
            argv = wrap_command(cmd, marker, "gp" if plain else "g")
        elif plain:
            argv = ["sh", "-c", cmd]
        else:
            argv = watchdog_command(cmd, timeout, marker)
        try:
            eid = api.exec_create(
                self.container_id,
                argv,
                stdout=True,
                stderr=True,
                stdin=groups is not None or stdin is not None,
                tty=False,
                user=self.exec_user,
                environment=dict(env) if env else None,
                workdir=cwd or self.spec.workdir,
            )["Id"]
            sock = api.exec_start(eid, socket=True)
        except Exception as e:  # the engine's refusal, or no engine at all (a daemon restarting)
            reason = self._dead_reason()
            if reason:
                raise SandboxError(reason, sandbox_id=self.id) from e
            raise SandboxError(f"exec failed: {e}", sandbox_id=self.id, transient=_is_transient(e)) from e
        stream = _Stream(sock)
        group: Path | None = None
        pid = 0
        err = bytearray()
        timed_out = False
        code: int | None = None
        t0 = time.monotonic()
        # The fallback's own watchdog ends the command; the driver waits a grace period longer.
        deadline = t0 + timeout + (EXEC_GRACE_S if groups is None else 0.0)
        try:
            if groups is not None:
                # The wrapper says nothing before "go": anything on the stream means the exec failed to start
                # (a missing cwd, an unknown user), and the engine's message is the command's output.
                pid = groups.find_pid(marker, t0 + EXEC_START_S, stop=stream.ready)
                if pid is None and stream.ready():
                    return self._failed_start(eid, stream, sink)
                if pid is None:
                    reason = self._dead_soon()
                    raise SandboxError(reason or f"exec did not start within {EXEC_START_S:.0f}s", sandbox_id=self.id)
                try:
                    group = groups.new_group(pid)
                except OSError as e:
                    reason = self._dead_soon()
                    raise SandboxError(reason or f"cannot make the exec's cgroup: {e}", sandbox_id=self.id) from e
                deadline = time.monotonic() + timeout
            payload = (b"go\n" if groups is not None else b"") + (stdin or b"")
            if groups is not None or stdin is not None:
                if payload:
                    stream.sock.sendall(payload)
                stream.sock.shutdown(socket.SHUT_WR)  # EOF for the command's stdin
            # kill_at: when the driver kills the exec's group: at the timeout, or once the command reported its end
            # (at once when something it started is still there, else only if the wrapper has not exited by then).
            kill_at, killed_at = deadline, None
            while not stream.eof:
                now = time.monotonic()
                if killed_at is None and now >= kill_at:
                    if group is None:  # the fallback: its watchdog did not end the command
                        reason = self._dead_reason()
                        raise SandboxError(reason or f"exec stream still open {now - t0:.0f}s after start",
                                           sandbox_id=self.id)
                    groups.kill(group)  # type: ignore[union-attr]
                    killed_at = now
                    timed_out = code is None
                if killed_at is not None and now >= killed_at + EXEC_GRACE_S:
                    raise SandboxError(f"exec stream still open {EXEC_GRACE_S:.0f}s after its group was killed",
                                       sandbox_id=self.id)
                stream.read(kill_at if killed_at is None else killed_at + EXEC_GRACE_S)
                for stream_id, data in stream.frames():
                    if stream_id == 2:
                        if len(err) < 65536:
                            err += data
                        if code is None:
                            code = done_code(bytes(err))
                            if code is not None and group is not None and killed_at is None:
                                others = [p for p in groups.procs(group) if p != pid]  # type: ignore[union-attr]
                                kill_at = time.monotonic() + (0.0 if others else 1.0)
                    else:
                        sink(data)
        except OSError as e:
            reason = self._dead_reason()
            raise SandboxError(reason or f"exec stream broke: {e}", sandbox_id=self.id) from e
        finally:
            stream.close()
            if group is not None:
                groups.remove(group)  # type: ignore[union-attr]
        if STATUS_TIMEOUT in err:  # the fallback's watchdog fired
            timed_out = True
        if code is None and not timed_out:
            # No status reported: a plain command of the fallback (none is expected), a wrapper killed by the command
            # itself, or a container that died under us (its init is gone at once; the engine may take a moment).
            if groups is None and plain:
                code = self._exit_code(eid)
            elif groups is not None and self._init_alive():
                code = self._exit_code(eid)
            if code is None:
                reason = self._dead_soon()
                if reason or (groups is not None and not self._init_alive()):
                    reason = reason or "its container's init died"
                    raise SandboxError(f"{reason} (during exec)", sandbox_id=self.id)
                code = self._exit_code(eid)
            if code is None:
                raise SandboxError("exec finished without an exit code", sandbox_id=self.id)
        return (TIMEOUT_EXIT if timed_out else int(code)), bytes(err), timed_out  # type: ignore[arg-type]

    def _failed_start(self, eid: str, stream: _Stream, sink: Callable[[bytes], None]) -> tuple[int, bytes, bool]:
        err = bytearray()
        end = time.monotonic() + EXEC_GRACE_S
        while not stream.eof and time.monotonic() < end:
            stream.read(end)
        for stream_id, data in stream.frames():
            if stream_id == 2:
                err += data
            else:
                sink(data)
        code = self._exit_code(eid)
        if code is None or not self._init_alive():  # a container going away
            reason = self._dead_soon()
            raise SandboxError(reason or f"exec failed to start: {bytes(err)[-500:]!r}", sandbox_id=self.id)
        return code, bytes(err), False

    def _init_alive(self) -> bool:
        """Whether the container's init (seen from the host) runs and is not exiting: the first sign of a killed
        container, before the engine shows it (host-cgroup mode only)."""
        try:
            stat = Path(f"/proc/{self.init_pid}/stat").read_text()
        except OSError:
            return False
        fields = stat[stat.rindex(")") + 2:].split()
        state, flags = fields[0], int(fields[6])
        return state not in ("Z", "X", "x") and not flags & 0x4  # PF_EXITING

    def _exit_code(self, eid: str) -> int | None:
        for _ in range(50):
            try:
                info = docker_client().api.exec_inspect(eid)
            except Exception:  # not found, or the engine gone: no code to read (the caller asks why)
                return None
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        return None

    # commands and files ---------------------------------------------------------------------------------------
    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        self._check_alive()
        text = check_exec(cmd, timeout, cwd, env, output_limit)
        async with self._exec_slot():
            return await to_thread(self._exec_sync, text, timeout, cwd, env, output_limit or self.spec.output_limit)

    def _exec_sync(self, cmd, timeout, cwd, env, limit) -> ExecResult:
        t0 = time.monotonic()
        out = OutputCap(limit)
        if self._memcg is None and self.init_pid:
            self._memcg = memory_cgroup_of(self.init_pid)
        ooms = oom_kills(self._memcg)
        code, _, timed_out = self._run(cmd, plain=False, timeout=timeout, sink=out.feed,
                                       cwd=self._abs(cwd) if cwd else None, env=env)
        after = oom_kills(self._memcg)
        return ExecResult(output=out.text(), exit_code=code, timed_out=timed_out, truncated=out.truncated,
                          duration=time.monotonic() - t0, oom_killed=ooms is not None and (after or 0) > ooms,
                          # the container's tmpfs mounts, seen through its init's root (root on the engine's host)
                          disk_full=bool(self.init_pid) and full_dirs(
                              [f"/proc/{self.init_pid}/root{d}" for d in (self.spec.workdir, "/tmp")]))

    async def _plain(self, cmd: str, *, stdin: bytes | None = None, sink: Callable[[bytes], None] | None = None,
                     timeout: float = PLAIN_TIMEOUT_S) -> tuple[int, bytes]:
        self._check_alive()
        code, err, timed_out = await to_thread(self._run, cmd, plain=True, timeout=timeout,
                                               sink=sink or (lambda _: None), stdin=stdin)
        if timed_out:
            raise SandboxError(f"{cmd[:80]!r} did not finish within {timeout:.0f}s", sandbox_id=self.id)
        return code, err

    def _wipe_dirs(self) -> list[str]:
        return [self.spec.workdir, "/tmp", "/dev/shm", "/dev/mqueue"]

    async def reset(self, *, restore: bytes | None = None) -> None:
        """Kill every process of the previous episode (all but the container's init and TTL process), remove its
        SysV IPC objects, then empty the work dir, /tmp, /dev/shm and /dev/mqueue (POSIX shm and queues)."""
        self._check_alive()
        await to_thread(self._reset_processes_and_ipc)
        await super().reset(restore=restore)

    def _reset_processes_and_ipc(self) -> None:
        if self.groups is not None:
            self.groups.kill_all_but(TTL_UID)
            # SysV objects live in the container's IPC namespace: the host's ipcrm, entered into it, removes them.
            p = subprocess.run(["nsenter", "-t", str(self.init_pid), "--ipc", "ipcrm", "--all"],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                raise SandboxError(f"reset: ipcrm failed: {p.stderr.strip()[-500:]}", sandbox_id=self.id)
            return
        # Fallback: as the sandbox user, kill every process it may signal (init and TTL have another uid).
        self._run("kill -KILL -1 2>/dev/null; command -v ipcrm >/dev/null && ipcrm --all 2>/dev/null; true",
                  plain=True, timeout=60, sink=lambda _: None)


def _remove_quietly(api: Any, ref: str) -> None:
    """Removes container ``ref`` (id or name) if it exists; what fails here (an engine down or slow, a create that
    lands after this) the sweep's grace for "created" containers removes later (:data:`.sweep.CREATED_GRACE_S`)."""
    try:
        api.remove_container(ref, force=True)
    except Exception:
        pass


def _warn_fallback() -> None:
    global _WARNED_FALLBACK
    if not _WARNED_FALLBACK:
        _WARNED_FALLBACK = True
        log.warning(
            "docker sandboxes: this driver cannot reach the containers' cgroups (a remote engine, or not root), so "
            "exec timeouts are enforced by a watchdog inside each container, which a hostile command can kill. Run "
            "the driver as root on the engine's host for host-enforced timeouts."
        )
