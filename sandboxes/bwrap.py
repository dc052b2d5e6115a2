"""The bwrap backend: bubblewrap, for hosts without Docker.

Design: one bwrap process per exec, all execs of a sandbox sharing its state: a host work dir bound at
``spec.workdir``, a host dir bound at /tmp, and one cgroup that holds every process of the sandbox. So a sandbox is
"alive" between execs without any process, and a command's process tree dies with its bwrap (``--unshare-pid``: when
the namespace's init goes, the kernel kills everything in it; ``--die-with-parent``: when bwrap goes, its sandbox
goes). The exec wrapper itself is the namespace's init (``--as-pid-1``): bwrap's own reaper init would be orphaned to
the host's PID 1 at every exec and, where that init reaps lazily, stay charged to the sandbox's pids cgroup. The
host enforces the timeout: at the deadline it kills bwrap, which takes the whole PID namespace with it;
nothing inside can stop that.

Isolation per exec: ``--unshare-all`` with a user namespace in which no further one can be made
(``--disable-userns``), no network unless ``spec.network``, ``--new-session``, a seccomp filter (seccomp.py), the
root a tmpfs remounted read-only holding read-only binds of the image's rootfs (``agentrl sandboxes build-image``)
or the host's /usr, /bin, /lib*, /sbin, /etc; a private /proc and /dev; uid/gid 1000 inside; no capabilities; no
new privileges. bwrap's options, environment values included, go through a file descriptor (``--args``), so no
secret shows on a command line (``ps``, or the sandbox's own /proc/1/cmdline), and bwrap starts with an empty
environment in /, so neither the host's PATH nor the driver's cwd shows in /proc/1/environ.

Limits: when the driver is root and cgroups are writable (v1 or v2), a per-sandbox cgroup caps memory (no swap),
pids and CPU, bwrap runs as a distinct unprivileged host uid per sandbox, and the work dir and /tmp are tmpfs
mounts of ``workdir_size_mb`` / ``tmp_size_mb`` in a mount namespace of the sandbox's own, which every exec enters
(``nsenter``) before bwrap makes its own: the host's mount table does not grow with the fleet, and the tmpfs goes
with the sandbox or the driver (:mod:`.bwrap_state`). That namespace is a private copy of the host's mounts when
the sandbox was made: a filesystem mounted on the host later does not show in it (a ``spec.mounts`` source on one
must be mounted first). Otherwise ``prlimit`` sets RLIMIT_AS (per process) and RLIMIT_NPROC (per uid, hence the
distinct uid), there is no CPU cap and no disk cap: weaker, and reported in ``BwrapSandbox.limits``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from agentrl import childwatch

from . import seccomp
from .base import (
    PLAIN_TIMEOUT_S,
    ExecResult,
    full_dirs,
    OutputCap,
    Sandbox,
    SandboxError,
    SandboxSpec,
    driver_tag,
    install_exit_hooks,
    new_marker,
    register_live,
    state_root,
    to_thread,
    unregister_live,
)
from .wrappers import TIMEOUT_EXIT, check_exec, done_code, wrap_command
from .bwrap_state import PrivateMounts, private_tmpfs, release_state, safe_name
from .cgroups import Cgroup, cgroup_mode, oom_kills
from .lifecycle import make_under_run_dir

# Slack after the command's end or its timeout for bwrap to exit and its pipes to close.
EXEC_GRACE_S = 10.0
HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
ROOTFS_SKIP = {"proc", "dev", "sys", "tmp", "run", "boot", "media", "mnt", "home", "root", "lost+found"}
UID_BASE = 300_000
UID_SPAN = 1 << 20


def bwrap_available() -> tuple[bool, str]:
    """(True, version) when bwrap runs a trivial sandbox here, else (False, reason)."""
    exe = shutil.which("bwrap")
    if not exe:
        return False, "bwrap not installed (apt-get install bubblewrap)"
    import subprocess

    try:
        p = subprocess.run(
            [exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
             "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
             "true"],
            capture_output=True, timeout=20,
        )
    except Exception as e:
        return False, f"bwrap failed: {e}"
    if p.returncode != 0:
        return False, f"bwrap failed: {p.stderr.decode(errors='replace').strip()}"
    v = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return True, v


# the sandbox -----------------------------------------------------------------------------------------------------
_BIN: dict[str, str] = {}


def _bin(name: str) -> str:
    """Absolute path of a host tool (bwrap starts with an empty environment, so no PATH lookup happens there)."""
    if name not in _BIN:
        path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin")
        if path is None:
            raise SandboxError(f"{name} not installed on this host (apt-get install "
                               f"{'bubblewrap' if name == 'bwrap' else 'util-linux'})")
        _BIN[name] = path
    return _BIN[name]


_USERNS_FLAGS: list[str] | None = None


def userns_flags() -> list[str]:
    """``--unshare-user --disable-userns`` when this host's bwrap supports them (0.8+, not setuid), probed once the
    way execs run; else [] (the seccomp filter still refuses new namespaces)."""
    global _USERNS_FLAGS
    if _USERNS_FLAGS is None:
        import subprocess

        flags = ["--unshare-user", "--disable-userns"]
        prefix = ([_bin("setpriv"), f"--reuid={UID_BASE}", f"--regid={UID_BASE}", "--clear-groups"]
                  if os.geteuid() == 0 else [])
        try:
            p = subprocess.run([*prefix, _bin("bwrap"), *flags, "--ro-bind", "/", "/", "true"], capture_output=True,
                               timeout=30, env={}, cwd="/")
            ok = p.returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        _USERNS_FLAGS = flags if ok else []
    return _USERNS_FLAGS


class BwrapSandbox(Sandbox):
    """A sandbox made of a host state dir (work dir + /tmp) and a cgroup; each exec is one bwrap process.

    One idea: the :class:`Sandbox` contract on bubblewrap. Creation, the exec argv and teardown share the state dir
    and cgroup's lifetime; the host mounts it needs live in :mod:`.bwrap_state`, limits in :mod:`.cgroups`.

    ``limits``: how limits are enforced, e.g. "cgroup-v1+tmpfs" (root) or "rlimit" (no cgroups, no disk cap).
    ``isolation``: the hardening in force beyond namespaces, e.g. "seccomp+no-userns" (each part is dropped, with a
    warning, where the host lacks it: libseccomp, a bwrap with ``--disable-userns``).
    """

    backend = "bwrap"

    def __init__(self, spec: SandboxSpec, *, run: str | None = None):
        super().__init__(spec, run=run)
        self.state_dir = state_root() / safe_name(self.run_id) / self.id
        self.cgroup: Cgroup | None = None
        self.limits = "none"
        self.isolation = ""
        self.host_uid: int | None = None
        self._mounts: PrivateMounts | None = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._dead: str | None = None
        self._root_args: list[str] = []
        self.root = Path("/")

    # lifecycle ------------------------------------------------------------------------------------------------
    async def start(self) -> "BwrapSandbox":
        if self.started_at is not None:
            return self
        try:
            _bin("bwrap")  # looked up once per process: a PATH walk cost ~0.6 ms of every create in a fleet
        except SandboxError as e:
            raise SandboxError(str(e), sandbox_id=self.id) from None
        install_exit_hooks()
        await to_thread(self._create)
        from .sweep import auto_sweep

        auto_sweep(self.backend)
        return self

    def _make_state_dir(self) -> None:
        """Makes the sandbox's state dir under the run's dir (which may vanish meanwhile: both made again)."""

        def make() -> None:
            self.state_dir.parent.mkdir(parents=True, exist_ok=True)
            self.state_dir.mkdir(exist_ok=False)

        make_under_run_dir(make)

    def _create(self) -> None:
        spec = self.spec
        self._root_args = self._root_binds()
        try:
            self._make_state_dir()
            for sub in ("work", "tmp"):
                (self.state_dir / sub).mkdir(exist_ok=False)
            now = time.time()
            (self.state_dir / "meta").write_text(
                f"run={self.run_id}\nsandbox={self.id}\nexpires={int(now + spec.ttl_s)}\ndriver={driver_tag()}\n"
            )
            disk = ""
            if os.geteuid() == 0:
                self.host_uid = UID_BASE + secrets.randbelow(UID_SPAN)
                try:
                    self._mounts = private_tmpfs([(self.state_dir / "work", spec.workdir_size_mb, 0o755),
                                                  (self.state_dir / "tmp", spec.tmp_size_mb, 0o1777)], self.host_uid)
                    disk = "+tmpfs"
                except OSError:  # no CAP_SYS_ADMIN (a root in a container): host dirs, no disk cap
                    pass
                for sub in ("work", "tmp"):
                    os.chown(self.state_dir / sub, self.host_uid, self.host_uid)
            os.chmod(self.state_dir / "tmp", 0o1777)
            mode = cgroup_mode()
            if mode != "none":
                self.cgroup = Cgroup(mode, safe_name(self.run_id), self.id)
                self.cgroup.create(spec.memory_mb << 20, spec.pids, spec.cpus)
                self.limits = f"cgroup-{mode}{disk}"
            else:
                self.limits = f"rlimit{disk}"
        except OSError as e:
            self._cleanup_host()
            raise SandboxError(f"create failed: {e}", sandbox_id=self.id, transient=False) from e
        parts = (["seccomp"] if seccomp.program() is not None else []) + (["no-userns"] if userns_flags() else [])
        self.isolation = "+".join(parts) or "namespaces-only"
        self.started_at = now
        self.expires_at = now + spec.ttl_s
        register_live(self)

    def _root_binds(self) -> list[str]:
        from .build import rootfs_path

        spec = self.spec
        if spec.root:
            root = Path(spec.root)
            if not root.is_dir():
                raise SandboxError(f"SandboxSpec.root {spec.root!r} is not a directory", sandbox_id=self.id)
        else:
            cached = rootfs_path(spec.image)
            root = cached if cached.is_dir() else Path("/")
        if root == Path("/"):
            names = [n for n in HOST_SYSTEM_DIRS if os.path.lexists(f"/{n}")]
        else:
            names = sorted(n for n in os.listdir(root) if n not in ROOTFS_SKIP)
        top = spec.workdir.strip("/").split("/")[0]
        args: list[str] = []
        for n in names:
            if n == top:
                continue
            p = root / n
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), f"/{n}"]
            elif p.is_dir():
                args += ["--ro-bind", str(p), f"/{n}"]
            elif p.is_file():
                args += ["--ro-bind", str(p), f"/{n}"]
        self.root = root
        return args

    def _cleanup_host(self) -> None:
        if self._mounts is not None:
            self._mounts.close()
        if self.cgroup is not None:
            try:
                self.cgroup.remove()
            except OSError:
                pass
        try:
            release_state(self.state_dir)
        except OSError:
            pass  # a mount that would not go: the sweep retries

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for p in list(self._procs):
            _kill(p)
        await to_thread(self.stop_sync)

    def stop_sync(self) -> None:
        self._stopped = True
        unregister_live(self)
        for p in list(self._procs):
            _kill(p)
        self._cleanup_host()

    def _check_alive(self) -> None:
        super()._check_alive()
        if self._dead:
            raise SandboxError(self._dead, sandbox_id=self.id)
        if not (self.state_dir / "work").is_dir():
            self._dead = "its state directory is gone (removed by a sweep?)"
            raise SandboxError(self._dead, sandbox_id=self.id)

    # running bwrap ----------------------------------------------------------------------------------------------
    def _options(self, cwd: str | None, env: Mapping[str, str] | None, seccomp_fd: int | None) -> list[str]:
        """bwrap's options (they travel through ``--args FD``, never on a command line)."""
        spec = self.spec
        uid, gid = spec.uid_gid()
        bw = ["--unshare-all", *userns_flags()]
        if spec.network:
            bw.append("--share-net")
        # --as-pid-1: no bwrap reaper as the namespace's init. That reaper outlives the outer bwrap by a moment and is
        # then reparented to the host's PID 1; where PID 1 reaps lazily (a container's init, a VM agent) it stays a
        # zombie charged to the sandbox's pids cgroup: one per exec, until a pid-limited sandbox cannot fork.
        bw += ["--die-with-parent", "--new-session", "--as-pid-1", "--uid", str(uid), "--gid", str(gid),
               "--hostname", "sandbox"]
        bw += self._root_args
        bw += ["--proc", "/proc", "--dev", "/dev"]
        bw += ["--bind", str(self.state_dir / "work"), spec.workdir, "--bind", str(self.state_dir / "tmp"), "/tmp"]
        for m in spec.mounts:
            bw += ["--ro-bind" if m.read_only else "--bind", m.source, m.target]
        bw += ["--remount-ro", "/", "--chdir", cwd or spec.workdir, "--clearenv"]
        full_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp",
                    "LANG": "C.UTF-8", **spec.env, **(env or {})}
        for k, v in full_env.items():
            bw += ["--setenv", k, v]
        bw += ["--cap-drop", "ALL"]
        if seccomp_fd is not None:
            bw += ["--seccomp", str(seccomp_fd)]
        return bw

    def _argv(self, inner: list[str], args_fd: int, ns_path: str | None) -> list[str]:
        spec = self.spec
        prefix: list[str] = []
        if ns_path is not None:  # the sandbox's mount namespace and its uid in one exec (-G drops the groups too)
            prefix = [_bin("nsenter"), f"--mount={ns_path}", f"--setuid={self.host_uid}",
                      f"--setgid={self.host_uid}", "--"]
        elif self.host_uid is not None:
            prefix = [_bin("setpriv"), f"--reuid={self.host_uid}", f"--regid={self.host_uid}", "--clear-groups"]
        if self.limits.startswith("rlimit"):
            prefix += [_bin("prlimit"), f"--as={spec.memory_mb << 20}", f"--nproc={spec.pids}", "--"]
        # Join the cgroup before exec'ing bwrap, as root, so that no process of the sandbox ever runs outside it.
        join = (
            'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || { echo "agentrl:cgroup-join-failed $1" >&2; '
            'exit 125; }; shift; n=$((n - 1)); done; unset PWD OLDPWD; exec "$@"'
        )
        procs = self.cgroup.procs_files if self.cgroup else []
        return [_bin("sh"), "-c", join, "sh", str(len(procs)), *procs, *prefix, _bin("bwrap"), "--args",
                str(args_fd), "--", *inner]

    async def _run(self, cmd: str, **kw) -> tuple[int, bytes, bool]:
        """:meth:`_spawn`, holding a descriptor of the sandbox's mount namespace for the exec's life. ``nsenter``
        opens it through ``/proc/<driver>/fd/``, so no descriptor of it is inherited into the sandbox, and a stop
        closing the sandbox's own meanwhile cannot hand its number to another's."""
        self._check_alive()
        if self._mounts is None:
            return await self._spawn(cmd, None, **kw)
        try:
            nfd = self._mounts.dup_ns()
        except OSError as e:
            raise SandboxError(f"stopped: {e}", sandbox_id=self.id) from None
        try:
            return await self._spawn(cmd, f"/proc/{os.getpid()}/fd/{nfd}", **kw)
        finally:
            os.close(nfd)

    async def _spawn(
        self,
        cmd: str,
        ns_path: str | None,
        *,
        plain: bool,
        timeout: float,
        sink: Callable[[bytes], None],
        stdin: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes, bool]:
        """Run ``cmd`` under the wrapper in a fresh bwrap (in the mount namespace at ``ns_path``, if any); stdout
        into ``sink``. At ``timeout`` the host kills bwrap and with it the command's PID namespace. Returns (exit
        code, stderr, timed out). What ``sink`` raises propagates once bwrap is dead."""
        childwatch.install()  # one bwrap per command: no waitpid thread for each (see agentrl.childwatch)
        program = seccomp.program()
        fds: list[int] = []
        try:
            sfd = seccomp.memfd(program, "agentrl-seccomp") if program is not None else None
            if sfd is not None:
                fds.append(sfd)
            options = self._options(cwd, env, sfd)
            afd = seccomp.memfd(b"".join(a.encode() + b"\0" for a in options), "agentrl-bwrap-args")
            fds.append(afd)
            argv = self._argv(wrap_command(cmd, new_marker(), "p" if plain else ""), afd, ns_path)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env={},
                    cwd="/",
                    pass_fds=fds,
                    start_new_session=True,
                )
            except OSError as e:
                raise SandboxError(f"cannot start bwrap: {e}", sandbox_id=self.id, transient=True) from e
        finally:
            for fd in fds:
                os.close(fd)
        self._procs.add(proc)
        err = bytearray()
        sink_error: list[BaseException] = []

        async def pump_out() -> None:
            while chunk := await proc.stdout.read(65536):
                if sink_error:
                    continue  # drain until bwrap is dead
                try:
                    sink(chunk)
                except Exception as e:
                    sink_error.append(e)
                    _kill(proc)

        async def pump_err() -> None:
            while chunk := await proc.stderr.read(65536):
                if len(err) < 65536:
                    err.extend(chunk)

        async def feed_in() -> None:
            if stdin is not None:
                try:
                    proc.stdin.write(stdin)
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    proc.stdin.close()

        timed_out = False
        io_done = asyncio.gather(feed_in(), pump_out(), pump_err(), proc.wait())
        # When our caller is cancelled, the gather ends cancelled with nobody left to look at it.
        io_done.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            try:
                await asyncio.wait_for(asyncio.shield(io_done), timeout)
            except asyncio.TimeoutError:
                timed_out = True
                _kill(proc)  # bwrap's death kills its sandbox (--die-with-parent), the PID namespace with it
                try:
                    await asyncio.wait_for(io_done, EXEC_GRACE_S)
                except asyncio.TimeoutError:
                    raise SandboxError(f"bwrap's pipes still open {EXEC_GRACE_S:.0f}s after it was killed",
                                       sandbox_id=self.id) from None
        except BaseException:  # cancelled: never leave the bwrap behind
            _kill(proc)
            io_done.cancel()
            raise
        finally:
            self._procs.discard(proc)
        if sink_error:
            raise sink_error[0]
        code = proc.returncode
        status = bytes(err)
        if timed_out:
            return TIMEOUT_EXIT, status, True
        reported = done_code(status)
        if reported is not None:
            return reported, status, False
        if code is not None and code < 0:
            if self._stopped:
                raise SandboxError("stopped during exec", sandbox_id=self.id)
            self._dead = f"its bwrap process was killed by signal {-code} from outside"
            raise SandboxError(self._dead, sandbox_id=self.id)
        if b"agentrl:cgroup-join-failed" in err or b"bwrap: " in err:
            text = err.decode("utf-8", errors="replace").strip()
            raise SandboxError(f"bwrap failed (exit {code}): {text[-2000:]}", sandbox_id=self.id)
        # The wrapper was killed by the command itself: report what bwrap saw.
        return int(code if code is not None else -1), status, False

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
        out = OutputCap(output_limit or self.spec.output_limit)
        memcg = self.cgroup.dirs[0] if self.cgroup is not None else None  # v1: memory is the first controller
        ooms = oom_kills(memcg)
        async with self._exec_slot():
            t0 = time.monotonic()
            code, _, timed_out = await self._run(text, plain=False, timeout=timeout, sink=out.feed,
                                                 cwd=self._abs(cwd) if cwd else None, env=env)
        after = oom_kills(memcg)
        return ExecResult(output=out.text(), exit_code=code, timed_out=timed_out, truncated=out.truncated,
                          duration=time.monotonic() - t0, oom_killed=ooms is not None and (after or 0) > ooms,
                          disk_full=self._disk_full())

    def _disk_full(self) -> bool:
        if self._mounts is not None:
            return any(blocks and free == 0 for blocks, free in self._mounts.free_blocks())
        return full_dirs([self.state_dir / "work", self.state_dir / "tmp"])

    async def _plain(self, cmd: str, *, stdin: bytes | None = None, sink: Callable[[bytes], None] | None = None,
                     timeout: float = PLAIN_TIMEOUT_S) -> tuple[int, bytes]:
        self._check_alive()
        code, err, timed_out = await self._run(cmd, plain=True, timeout=timeout, sink=sink or (lambda _: None),
                                               stdin=stdin)
        if timed_out:
            raise SandboxError(f"{cmd[:80]!r} did not finish within {timeout:.0f}s", sandbox_id=self.id)
        return code, err

    async def reset(self, *, restore: bytes | None = None) -> None:
        """No process outlives an exec here, and /dev, /dev/shm and IPC are new per exec, so a reset is: kill the
        cgroup's leftovers, empty work dir and /tmp."""
        self._check_alive()
        if self.cgroup is not None:
            await to_thread(self.cgroup.kill_all)
        await super().reset(restore=restore)

    def memory_bytes(self) -> int | None:
        """Memory charged to the sandbox's cgroup (page cache and tmpfs included), or None without a cgroup."""
        return self.cgroup.memory_bytes() if self.cgroup else None


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
