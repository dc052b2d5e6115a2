"""The docker backend: one long-lived container per sandbox, driven through docker-py's low-level API.

Container: ``docker-init -- sleep TTL`` as its main process (the dead-man timer: the container exits by itself when
the TTL runs out, and ``auto_remove`` deletes it, even if the driver was SIGKILLed), ``--network none``, memory
(no swap), CPU and pid limits, read-only root, tmpfs work dir and /tmp, all capabilities dropped,
``no-new-privileges``, the image's user (``agent``, uid 1000, for the images built here). Every container carries
the labels ``agentrl.run``, ``agentrl.sandbox``, ``agentrl.expires`` and ``agentrl.driver``.

Commands go through ``exec`` with the wrapper of base.py, which enforces the timeout inside the container. Files move
as tar/cat streams over an exec's stdin/stdout (``put_archive`` cannot write into a tmpfs of a read-only container).
docker-py blocks, so every engine call runs in the sandbox thread pool. ``DOCKER_HOST`` etc. are honoured
(``docker.from_env``).
"""

from __future__ import annotations

import io
import math
import os
import socket
import struct
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .base import (
    LABEL_DRIVER,
    LABEL_EXPIRES,
    LABEL_RUN,
    LABEL_SANDBOX,
    STATUS_DONE,
    STATUS_TIMEOUT,
    TIMEOUT_EXIT,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxError,
    SandboxSpec,
    driver_tag,
    new_marker,
    install_exit_hooks,
    register_live,
    to_thread,
    unregister_live,
    wrap_command,
)

_CLIENT = None
_CLIENT_LOCK = threading.Lock()
# Slack between the in-sandbox timeout and the driver giving up on the exec stream.
EXEC_GRACE_S = 15.0
_IMAGE_USERS: dict[str, str] = {}


def docker_client():
    """The process-wide docker-py client (``docker.from_env``, so DOCKER_HOST/DOCKER_TLS_VERIFY apply)."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None:
            import docker

            _CLIENT = docker.from_env(timeout=120, max_pool_size=int(os.environ.get("AGENTRL_DOCKER_POOL", "256")))
        return _CLIENT


def docker_available() -> tuple[bool, str]:
    """(True, version) when an engine answers, else (False, reason)."""
    try:
        return True, docker_client().version().get("Version", "?")
    except Exception as e:  # any failure means "not usable here"
        return False, f"{type(e).__name__}: {e}"


def _is_transient(e: Exception) -> bool:
    import docker
    import requests

    if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return True
    if isinstance(e, docker.errors.APIError) and not isinstance(e, docker.errors.NotFound):
        code = getattr(e.response, "status_code", None) or 0
        return code >= 500 or code == 429
    return False


class _Stream:
    """Reader of docker's multiplexed exec stream (8-byte frame headers: stream id, 3 zero bytes, size BE32)."""

    def __init__(self, sock: Any, deadline: float):
        # unix/tcp: a SocketIO around a socket; other transports (ssh) give a file-like object
        self.sock = getattr(sock, "_sock", sock)
        self._recv = getattr(self.sock, "recv", None) or self.sock.read
        self.deadline = deadline
        self.buf = bytearray()
        self.eof = False

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("exec stream did not finish in time")
            if hasattr(self.sock, "settimeout"):
                self.sock.settimeout(min(left, 5.0))
            try:
                chunk = self._recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                self.eof = True
                return False
            self.buf += chunk
        return True

    def frames(self):
        while True:
            if not self._fill(8):
                return
            stream_id = self.buf[0]
            (size,) = struct.unpack(">I", bytes(self.buf[4:8]))
            del self.buf[:8]
            if not self._fill(size):
                return
            data = bytes(self.buf[:size])
            del self.buf[:size]
            yield stream_id, data

    def close(self) -> None:
        # The socket docker-py hands out still has SocketIO references held by its HTTP response, so close()
        # only marks it closed and the fd stays open until garbage collection (a ResourceWarning per exec).
        # Detaching and closing the fd releases it now.
        sock = self.sock
        if isinstance(sock, socket.socket):
            try:
                if sock.fileno() != -1:
                    os.close(sock.detach())
            except OSError:
                pass
        else:
            try:
                sock.close()
            except OSError:
                pass


class DockerSandbox(Sandbox):
    """A sandbox backed by one Docker container. See the module docstring for the container's settings."""

    backend = "docker"

    def __init__(self, spec: SandboxSpec, *, run: str | None = None):
        super().__init__(spec, run=run)
        self.container_id: str | None = None
        self.name = f"agentrl-{self.id}"

    # lifecycle ------------------------------------------------------------------------------------------------
    async def start(self) -> "DockerSandbox":
        if self.started_at is not None:
            return self
        install_exit_hooks()
        await to_thread(self._create)
        return self

    def _create(self) -> None:
        import docker

        spec = self.spec
        try:
            client = docker_client()
        except Exception as e:  # docker.errors.DockerException: no engine at DOCKER_HOST (yet)
            raise SandboxError(f"docker engine unreachable: {e}", sandbox_id=self.id, transient=True) from e
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
        tmpfs_opts = "rw,exec,nosuid,nodev,mode=1777"
        owner = self._owner(client)
        if owner:  # tools like git refuse a work dir owned by another user
            tmpfs_opts += f",uid={owner[0]},gid={owner[1]}"
        volumes = {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts}
        try:
            container = client.containers.run(
                spec.image,
                command=["sleep", str(ttl)],
                name=self.name,
                detach=True,
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
                user=spec.user or "",
                working_dir=spec.workdir,
                environment={"HOME": "/tmp", **spec.env},
                labels=labels,
                volumes=volumes or None,
                stdin_open=False,
            )
        except docker.errors.ImageNotFound as e:
            raise SandboxError(
                f"image {spec.image!r} not found ({e.explanation}); build it with "
                "`agentrl sandboxes build-image --all` (no registry is reachable here)",
                sandbox_id=self.id,
            ) from e
        except Exception as e:
            raise SandboxError(f"container create failed: {e}", sandbox_id=self.id, transient=_is_transient(e)) from e
        self.container_id = container.id
        self.started_at = time.time()
        self.expires_at = now + ttl
        register_live(self)

    def _ensure_image(self, client) -> None:
        """The image must be local; else one explicit pull (machines with a registry), else a non-transient error
        (containers.run would otherwise try to pull on every create, and a failed pull looks like a 500)."""
        import docker

        image = self.spec.image
        if image in _IMAGE_USERS:
            return
        try:
            client.api.inspect_image(image)
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

    def _owner(self, client) -> tuple[int, int] | None:
        """Numeric uid/gid commands run as: spec.user, else the image's USER when numeric; None if unknown."""
        if self.spec.user:
            return self.spec.uid_gid()
        user = _IMAGE_USERS.get(self.spec.image)
        if user is None:
            try:
                user = client.api.inspect_image(self.spec.image)["Config"].get("User") or ""
            except Exception:
                return None  # the create call reports a missing image
            _IMAGE_USERS[self.spec.image] = user
        uid, _, gid = user.partition(":")
        if uid.isdigit() and (not gid or gid.isdigit()):
            return int(uid), int(gid or uid)
        return None

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

        try:
            docker_client().api.remove_container(self.container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            # auto_remove may already be removing it ("removal ... already in progress").
            if getattr(e.response, "status_code", 0) != 409:
                raise SandboxError(f"remove failed: {e}", sandbox_id=self.id) from e

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

    def _exec_raw(
        self,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        out: OutputCap,
        wait_s: float,
    ) -> tuple[int | None, bytes]:
        """Run argv; stdout into ``out``, stderr returned (the wrapper's status channel, or an error text).

        Returns (exit code or None if unknown, stderr). Raises SandboxError when the container is dead.
        """
        import docker

        self._check_alive()
        api = docker_client().api
        try:
            eid = api.exec_create(
                self.container_id,
                argv,
                stdout=True,
                stderr=True,
                stdin=stdin is not None,
                tty=False,
                environment=dict(env) if env else None,
                workdir=cwd or self.spec.workdir,
            )["Id"]
            sock = api.exec_start(eid, socket=True)
        except docker.errors.APIError as e:
            reason = self._dead_reason()
            if reason:
                raise SandboxError(reason, sandbox_id=self.id) from e
            raise SandboxError(f"exec failed: {e}", sandbox_id=self.id, transient=_is_transient(e)) from e
        stream = _Stream(sock, time.monotonic() + wait_s)
        err = bytearray()
        try:
            if stdin is not None:
                stream.sock.sendall(stdin)
                stream.sock.shutdown(socket.SHUT_WR)  # EOF for the command's stdin
            for stream_id, data in stream.frames():
                if stream_id == 2:
                    if len(err) < 65536:
                        err += data
                else:
                    out.feed(data)
        except TimeoutError:
            reason = self._dead_reason()
            raise SandboxError(
                reason or f"exec stream still open {wait_s:.0f}s after start (a process escaped the reaper?)",
                sandbox_id=self.id,
            ) from None
        except OSError as e:
            reason = self._dead_reason()
            raise SandboxError(reason or f"exec stream broke: {e}", sandbox_id=self.id) from e
        finally:
            stream.close()
        code = None
        for _ in range(50):
            try:
                info = api.exec_inspect(eid)
            except docker.errors.NotFound:
                break
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = int(info["ExitCode"])
                break
            time.sleep(0.02)
        return code, bytes(err)

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
        argv = wrap_command(cmd, timeout, new_marker())
        return await to_thread(self._exec_sync, argv, timeout, cwd, env, output_limit or self.spec.output_limit)

    def _exec_sync(self, argv, timeout, cwd, env, limit) -> ExecResult:
        t0 = time.monotonic()
        out = OutputCap(limit)
        code, status = self._exec_raw(
            argv, cwd=self._abs(cwd) if cwd else None, env=env, out=out, wait_s=timeout + EXEC_GRACE_S
        )
        timed_out = STATUS_TIMEOUT in status
        if code is None or (STATUS_DONE not in status and not timed_out):
            # The wrapper itself ended abnormally; most often because the container died under it (the engine
            # may take a moment to show a killed container as not running).
            reason = self._dead_reason()
            for _ in range(20):
                if reason:
                    break
                time.sleep(0.1)
                reason = self._dead_reason()
            if reason:
                raise SandboxError(f"{reason} (during exec)", sandbox_id=self.id)
        if code is None:
            raise SandboxError("exec finished without an exit code", sandbox_id=self.id)
        return ExecResult(
            output=out.text(),
            exit_code=TIMEOUT_EXIT if timed_out else code,
            timed_out=timed_out,
            truncated=out.truncated,
            duration=time.monotonic() - t0,
        )

    def _plain(self, argv: list[str], *, stdin: bytes | None = None, limit: int = 1 << 34, what: str) -> bytes:
        out = OutputCap(limit)
        code, err = self._exec_raw(argv, stdin=stdin, out=out, wait_s=600.0)
        if code != 0:
            reason = self._dead_reason()
            if reason:
                raise SandboxError(reason, sandbox_id=self.id)
            text = err.decode("utf-8", errors="replace").strip()
            raise SandboxError(f"{what} failed (exit {code}): {text}", sandbox_id=self.id)
        return bytes(out.head) + bytes(out.tail)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        self._check_alive()
        if isinstance(data, str):
            data = data.encode()
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
        await to_thread(
            self._plain, ["sh", "-c", script, "sh", self._abs(path), f"{mode:o}"], stdin=data,
            what=f"write_file({path!r})",
        )

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        return await to_thread(self._plain, ["cat", "--", self._abs(path)], what=f"read_file({path!r})")

    async def upload(self, local_dir: str | os.PathLike, remote_dir: str | None = None) -> None:
        self._check_alive()
        local = Path(local_dir)
        if not local.is_dir():
            raise SandboxError(f"upload: {local} is not a directory", sandbox_id=self.id)
        data = await to_thread(_tar_dir, local)
        target = self._abs(remote_dir or self.spec.workdir)
        await to_thread(
            self._plain, ["sh", "-c", 'mkdir -p "$1" && tar -C "$1" -xof -', "sh", target], stdin=data,
            what=f"upload to {target}",
        )

    async def download(self, remote_dir: str, local_dir: str | os.PathLike) -> None:
        self._check_alive()
        source = self._abs(remote_dir)
        data = await to_thread(self._plain, ["tar", "-C", source, "-cf", "-", "."], what=f"download of {source}")
        await to_thread(_untar, data, Path(local_dir))

    async def reset(self) -> None:
        """Kill every process but the container's init and TTL sleep, then empty the work dir and /tmp."""
        self._check_alive()
        # The TTL sleep is init's first child; everything else (but this shell) goes.
        kill_stray = (
            'ttl=$(cut -d" " -f1 /proc/1/task/1/children); for d in /proc/[0-9]*; do p=${d#/proc/}; '
            'case "$p" in 1|$$|"$ttl") continue;; esac; kill -KILL "$p" 2>/dev/null; done; true'
        )
        await to_thread(self._plain, ["sh", "-c", kill_stray], what="reset (kill)")
        await super().reset()


def _tar_dir(local: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(local.iterdir()):
            tar.add(str(child), arcname=child.name)
    return buf.getvalue()


def _untar(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python without extraction filters
            tar.extractall(dest)
