"""The bwrap backend: bubblewrap, for hosts without Docker.

Design: one bwrap process per exec, all execs of a sandbox sharing its state: a host work dir bound at
``spec.workdir``, a host dir bound at /tmp, and one cgroup that holds every process of the sandbox. So a sandbox is
"alive" between execs without any process, and a command's process tree dies with its bwrap (``--unshare-pid``: when
the namespace's init goes, the kernel kills everything in it; ``--die-with-parent``: when the driver goes, bwrap
goes). The wrapper of base.py still enforces the timeout inside, with the host killing bwrap as a backstop.

Isolation per exec: ``--unshare-all`` (no network unless ``spec.network``), ``--new-session``, the root is a tmpfs
remounted read-only holding read-only binds of the image's rootfs (``agentrl sandboxes build-image``) or the host's
/usr, /bin, /lib*, /sbin, /etc; a private /proc and /dev; uid/gid 1000 inside; no capabilities; no new privileges.

Limits: when the driver is root and cgroups are writable (v1 or v2), a per-sandbox cgroup caps memory (no swap),
pids and CPU, and bwrap runs as a distinct unprivileged host uid per sandbox. Otherwise ``prlimit`` sets
RLIMIT_AS (per process) and RLIMIT_NPROC (per uid, hence the distinct uid) and there is no CPU cap: weaker, and
reported in ``BwrapSandbox.limits``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Mapping, Sequence

from .base import (
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
    state_root,
    to_thread,
    unregister_live,
    wrap_command,
)

EXEC_GRACE_S = 10.0
CGROUP_ROOT = Path(os.environ.get("AGENTRL_CGROUP_ROOT", "/sys/fs/cgroup"))
V1_CONTROLLERS = ("memory", "pids", "cpu")
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


# cgroups ---------------------------------------------------------------------------------------------------------
_CGROUP_MODE: str | None = None


def cgroup_mode() -> str:
    """"v2", "v1" or "none": which cgroup hierarchy this process can create limited groups in.
    ``$AGENTRL_BWRAP_LIMITS=rlimit`` forces "none"."""
    global _CGROUP_MODE
    if _CGROUP_MODE is not None:
        return _CGROUP_MODE
    mode = "none"
    if os.environ.get("AGENTRL_BWRAP_LIMITS", "") != "rlimit" and os.geteuid() == 0:
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            try:
                probe = Cgroup("v2", f"probe-{os.getpid()}-{secrets.token_hex(3)}", "probe")
                probe.create(64 << 20, 16, 1.0)
                probe.remove()
                mode = "v2"
            except OSError:
                mode = "none"
        elif all((CGROUP_ROOT / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
            try:
                probe = Cgroup("v1", f"probe-{os.getpid()}-{secrets.token_hex(3)}", "probe")
                probe.create(64 << 20, 16, 1.0)
                probe.remove()
                mode = "v1"
            except OSError:
                mode = "none"
    _CGROUP_MODE = mode
    return mode


class Cgroup:
    """One sandbox's cgroup: ``agentrl/<run>/<sandbox>`` in each v1 controller, or in the v2 tree."""

    def __init__(self, mode: str, run: str, name: str):
        self.mode = mode
        if mode == "v2":
            self.dirs = [CGROUP_ROOT / "agentrl" / run / name]
        else:
            self.dirs = [CGROUP_ROOT / c / "agentrl" / run / name for c in V1_CONTROLLERS]

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def create(self, memory_bytes: int, pids: int, cpus: float) -> None:
        period = 100_000
        quota = max(1000, int(cpus * period))
        if self.mode == "v2":
            d = self.dirs[0]
            for parent in (CGROUP_ROOT, CGROUP_ROOT / "agentrl", d.parent):
                parent.mkdir(exist_ok=True)
                _write(parent / "cgroup.subtree_control", "+memory +pids +cpu")
            d.mkdir(exist_ok=True)
            _write(d / "memory.max", str(memory_bytes))
            _write(d / "memory.swap.max", "0", optional=True)
            _write(d / "pids.max", str(pids))
            _write(d / "cpu.max", f"{quota} {period}")
            return
        mem, pid, cpu = self.dirs
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        _write(mem / "memory.limit_in_bytes", str(memory_bytes))
        _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes), optional=True)
        _write(pid / "pids.max", str(pids))
        _write(cpu / "cpu.cfs_period_us", str(period))
        _write(cpu / "cpu.cfs_quota_us", str(quota))

    def pids(self) -> list[int]:
        out: list[int] = []
        for f in self.procs_files:
            try:
                out += [int(x) for x in Path(f).read_text().split()]
            except OSError:
                pass
        return sorted(set(out))

    def memory_bytes(self) -> int | None:
        name = "memory.current" if self.mode == "v2" else "memory.usage_in_bytes"
        try:
            return int((self.dirs[0] / name).read_text())
        except (OSError, ValueError):
            return None

    def kill_all(self) -> None:
        if self.mode == "v2":
            _write(self.dirs[0] / "cgroup.kill", "1", optional=True)
        for _ in range(50):
            left = self.pids()
            if not left:
                return
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy for a moment while killed processes exit
                    time.sleep(0.02)
            try:
                d.parent.rmdir()  # the run's dir, once its last sandbox is gone
            except OSError:
                pass


def _write(path: Path, value: str, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except OSError:
        if not optional:
            raise


# the sandbox -----------------------------------------------------------------------------------------------------
class BwrapSandbox(Sandbox):
    """A sandbox made of a host state dir (work dir + /tmp) and a cgroup; each exec is one bwrap process."""

    backend = "bwrap"

    def __init__(self, spec: SandboxSpec, *, run: str | None = None):
        super().__init__(spec, run=run)
        self.state_dir = state_root() / _safe(self.run_id) / self.id
        self.cgroup: Cgroup | None = None
        self.limits = "none"
        self.host_uid: int | None = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._dead: str | None = None
        self._root_args: list[str] = []
        self.root = Path("/")

    # lifecycle ------------------------------------------------------------------------------------------------
    async def start(self) -> "BwrapSandbox":
        if self.started_at is not None:
            return self
        if not shutil.which("bwrap"):
            raise SandboxError("bwrap not installed (apt-get install bubblewrap)", sandbox_id=self.id)
        install_exit_hooks()
        await to_thread(self._create)
        return self

    def _create(self) -> None:
        spec = self.spec
        self._root_args = self._root_binds()
        try:
            for sub in ("work", "tmp"):
                (self.state_dir / sub).mkdir(parents=True, exist_ok=False)
            now = time.time()
            (self.state_dir / "meta").write_text(
                f"run={self.run_id}\nsandbox={self.id}\nexpires={int(now + spec.ttl_s)}\ndriver={driver_tag()}\n"
            )
            if os.geteuid() == 0:
                self.host_uid = UID_BASE + secrets.randbelow(UID_SPAN)
                for sub in ("work", "tmp"):
                    os.chown(self.state_dir / sub, self.host_uid, self.host_uid)
            os.chmod(self.state_dir / "tmp", 0o1777)
            mode = cgroup_mode()
            if mode != "none":
                self.cgroup = Cgroup(mode, _safe(self.run_id), self.id)
                self.cgroup.create(spec.memory_mb << 20, spec.pids, spec.cpus)
                self.limits = f"cgroup-{mode}"
            else:
                self.limits = "rlimit"
        except OSError as e:
            self._cleanup_host()
            raise SandboxError(f"create failed: {e}", sandbox_id=self.id, transient=False) from e
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
        if self.cgroup is not None:
            try:
                self.cgroup.remove()
            except OSError:
                pass
        shutil.rmtree(self.state_dir, ignore_errors=True)
        try:
            self.state_dir.parent.rmdir()
        except OSError:
            pass

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
    def _argv(self, inner: list[str], cwd: str | None, env: Mapping[str, str] | None) -> list[str]:
        spec = self.spec
        uid, gid = spec.uid_gid()
        bw = ["bwrap", "--unshare-all"]
        if spec.network:
            bw.append("--share-net")
        bw += ["--die-with-parent", "--new-session", "--uid", str(uid), "--gid", str(gid), "--hostname", "sandbox"]
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
        bw += ["--cap-drop", "ALL", "--", *inner]
        prefix: list[str] = []
        if self.host_uid is not None:
            prefix = ["setpriv", f"--reuid={self.host_uid}", f"--regid={self.host_uid}", "--clear-groups"]
        if self.limits == "rlimit":
            prefix += ["prlimit", f"--as={spec.memory_mb << 20}", f"--nproc={spec.pids}", "--"]
        # Join the cgroup before exec'ing bwrap, as root, so that no process of the sandbox ever runs outside it.
        join = (
            'for f in $AGENTRL_CGROUP_PROCS; do echo $$ > "$f" || { echo "agentrl:cgroup-join-failed $f" >&2; '
            'exit 125; }; done; exec "$@"'
        )
        return ["sh", "-c", join, "sh", *prefix, *bw]

    async def _run(
        self,
        inner: list[str],
        *,
        stdin: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        out: OutputCap,
        wait_s: float,
    ) -> tuple[int, bytes, bool]:
        """Run ``inner`` in a fresh bwrap. Returns (exit code, stderr, killed by the host backstop)."""
        self._check_alive()
        host_env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                    "AGENTRL_CGROUP_PROCS": " ".join(self.cgroup.procs_files) if self.cgroup else ""}
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(inner, cwd, env),
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=host_env,
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxError(f"cannot start bwrap: {e}", sandbox_id=self.id, transient=True) from e
        self._procs.add(proc)
        err = bytearray()

        async def pump_out() -> None:
            while chunk := await proc.stdout.read(65536):
                out.feed(chunk)

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

        killed = False
        io_done = asyncio.gather(feed_in(), pump_out(), pump_err(), proc.wait())
        # When our caller is cancelled, the gather ends cancelled with nobody left to look at it.
        io_done.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait_for(io_done, wait_s)
        except asyncio.TimeoutError:
            killed = True
            _kill(proc)
            await proc.wait()
        except BaseException:  # cancelled: never leave the bwrap behind
            _kill(proc)
            raise
        finally:
            self._procs.discard(proc)
        code = proc.returncode
        if code is not None and code < 0 and not killed:
            if self._stopped:
                raise SandboxError("stopped during exec", sandbox_id=self.id)
            self._dead = f"its bwrap process was killed by signal {-code} from outside"
            raise SandboxError(self._dead, sandbox_id=self.id)
        if b"agentrl:cgroup-join-failed" in err:
            text = err.decode("utf-8", errors="replace").strip()
            raise SandboxError(f"could not join the sandbox cgroup: {text[-500:]}", sandbox_id=self.id)
        return int(code if code is not None else -1), bytes(err), killed

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
        t0 = time.monotonic()
        out = OutputCap(output_limit or self.spec.output_limit)
        code, status, killed = await self._run(
            wrap_command(cmd, timeout, new_marker()), cwd=self._abs(cwd) if cwd else None, env=env, out=out,
            wait_s=timeout + EXEC_GRACE_S,
        )
        timed_out = killed or STATUS_TIMEOUT in status
        if not timed_out and STATUS_DONE not in status:
            text = status.decode("utf-8", errors="replace").strip()
            raise SandboxError(f"bwrap failed (exit {code}): {text[-2000:]}", sandbox_id=self.id)
        return ExecResult(
            output=out.text(),
            exit_code=TIMEOUT_EXIT if timed_out else code,
            timed_out=timed_out,
            truncated=out.truncated,
            duration=time.monotonic() - t0,
        )

    async def _plain(self, argv: list[str], *, stdin: bytes | None = None, what: str) -> bytes:
        out = OutputCap(1 << 34)
        code, err, killed = await self._run(argv, stdin=stdin, out=out, wait_s=600.0)
        if code != 0 or killed:
            text = err.decode("utf-8", errors="replace").strip()
            raise SandboxError(f"{what} failed (exit {code}): {text[-2000:]}", sandbox_id=self.id)
        return bytes(out.head) + bytes(out.tail)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        self._check_alive()
        if isinstance(data, str):
            data = data.encode()
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
        await self._plain(["sh", "-c", script, "sh", self._abs(path), f"{mode:o}"], stdin=data,
                          what=f"write_file({path!r})")

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        return await self._plain(["cat", "--", self._abs(path)], what=f"read_file({path!r})")

    async def upload(self, local_dir: str | os.PathLike, remote_dir: str | None = None) -> None:
        self._check_alive()
        from .docker import _tar_dir

        local = Path(local_dir)
        if not local.is_dir():
            raise SandboxError(f"upload: {local} is not a directory", sandbox_id=self.id)
        data = await to_thread(_tar_dir, local)
        target = self._abs(remote_dir or self.spec.workdir)
        await self._plain(["sh", "-c", 'mkdir -p "$1" && tar -C "$1" -xof -', "sh", target], stdin=data,
                          what=f"upload to {target}")

    async def download(self, remote_dir: str, local_dir: str | os.PathLike) -> None:
        self._check_alive()
        from .docker import _untar

        source = self._abs(remote_dir)
        data = await self._plain(["tar", "-C", source, "-cf", "-", "."], what=f"download of {source}")
        await to_thread(_untar, data, Path(local_dir))

    async def reset(self) -> None:
        """No process outlives an exec here, so a reset is: kill the cgroup's leftovers, empty work dir and /tmp."""
        self._check_alive()
        if self.cgroup is not None:
            await to_thread(self.cgroup.kill_all)
        await super().reset()

    def memory_bytes(self) -> int | None:
        """Memory charged to the sandbox's cgroup (page cache and tmpfs included), or None without a cgroup."""
        return self.cgroup.memory_bytes() if self.cgroup else None


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

