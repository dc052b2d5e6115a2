"""Build steps of the SWE images: the Python base root filesystems (3.11 is the sandbox base image; 3.9 and 3.13
are debootstrapped Debian suites) and running one step as root over such a root filesystem (in bwrap when it works
here, else in a docker container of the base image), with the network only when asked (the wheel download).

Shared by :mod:`agentrl.envs.swe.images`, which layers the per-instance images on top. Every step is idempotent
and atomic (temp dir + rename) under a file lock, so concurrent processes build each thing once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .envspec import DEFAULT_PYTHON, PYTHON_SUITES, EnvSpecError

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Log = Callable[[str], None]


class ImageError(RuntimeError):
    """An image layer that cannot be built; the message says which step failed, with its output's tail."""


def image_cache_dir() -> Path:
    """``$AGENTRL_SWE_IMAGE_CACHE``, else ``swe/`` under the sandbox image cache (traversable by sandbox uids)."""
    if os.environ.get("AGENTRL_SWE_IMAGE_CACHE"):
        return Path(os.environ["AGENTRL_SWE_IMAGE_CACHE"])
    from agentrl.sandboxes.build import cache_dir

    return cache_dir() / "swe"


def mkdirs(path: Path) -> None:
    """Creates ``path`` with world-traversable parents (bwrap binds run as unprivileged uids)."""
    path.mkdir(parents=True, exist_ok=True)
    for p in [path, *path.parents]:
        if p == image_cache_dir().parent:
            break
        try:
            os.chmod(p, 0o755)
        except OSError:
            break


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """An exclusive lock across threads and processes (``flock`` on a file per name)."""
    locks = image_cache_dir() / "locks"
    mkdirs(locks)
    with open(locks / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


# ---------------------------------------------------------------------------------------------------- Python base
@dataclass(frozen=True)
class PythonBase:
    """A root filesystem with ``python3`` and git: its docker ``tag`` and its ``rootfs`` directory (bwrap)."""

    version: str
    suite: str
    tag: str

    @property
    def rootfs(self) -> Path:
        from agentrl.sandboxes.build import rootfs_path

        return rootfs_path(self.tag)

    @property
    def built_here(self) -> bool:
        """True for the versions this module builds (3.9, 3.13); 3.11 is the sandbox base image."""
        return self.tag.startswith("agentrl-swe-py")


def python_base(version: str, base_image: str = "agentrl-base:latest") -> PythonBase:
    """Returns the base of ``version``: ``base_image`` for 3.11 (Debian bookworm's Python), else the Debian suite
    that ships it. Raises :class:`EnvSpecError` for a version no Debian suite here provides."""
    if version not in PYTHON_SUITES:
        known = ", ".join(f"{v} (Debian {s})" for v, s in PYTHON_SUITES.items())
        raise EnvSpecError(f"python {version!r} cannot be built: the versions available are {known}")
    if version == DEFAULT_PYTHON:
        return PythonBase(version, PYTHON_SUITES[version], base_image)
    return PythonBase(version, PYTHON_SUITES[version], f"agentrl-swe-py{version}:latest")


# A root filesystem for another Debian suite; the same shape as the sandbox base image (python3, git, procps, CA
# certificates; user `agent`, uid 1000; a world-writable /workspace).
_DEBOOTSTRAP = r"""
set -eu
rootfs=$1; suite=$2; mirror=$3; extra=$4
debootstrap --variant=minbase --include=python3,git,procps,ca-certificates$extra "$suite" "$rootfs" "$mirror"
grep -q '^agent:' "$rootfs/etc/passwd" || {
    echo 'agent:x:1000:1000:agentrl sandbox user:/tmp:/bin/sh' >>"$rootfs/etc/passwd"
    echo 'agent:x:1000:' >>"$rootfs/etc/group"
}
mkdir -p "$rootfs/workspace"; chmod 1777 "$rootfs/workspace"
rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"* "$rootfs/usr/share/doc" \
    "$rootfs/usr/share/man" "$rootfs/usr/share/locale"
"""


def ensure_python_base(base: PythonBase, *, docker: bool, log: Log = print) -> None:
    """Makes sure ``base`` exists: its docker image with ``docker``, else its root filesystem (what bwrap runs on;
    build steps use either). The sandbox base image is never built here (``agentrl sandboxes build-image``); another
    suite is debootstrapped (about 1-3 minutes) and, for docker, imported. Raises :class:`ImageError`."""
    from agentrl.sandboxes.build import docker_image_exists, import_rootfs

    if not base.built_here:
        if docker and not docker_image_exists(base.tag):
            raise ImageError(f"the docker image {base.tag} is missing; build it with `agentrl sandboxes build-image base`")
        if not docker and not base.rootfs.is_dir():
            raise ImageError(f"the root filesystem of {base.tag} is missing ({base.rootfs}); build it with "
                             "`agentrl sandboxes build-image base`")
        return
    with locked(f"python-{base.version}"):
        if not base.rootfs.is_dir():
            if os.geteuid() != 0 or not shutil.which("debootstrap"):
                raise ImageError(f"building the Python {base.version} image ({base.suite}) needs root and debootstrap")
            from agentrl.sandboxes.build import _debian_mirror

            mkdirs(base.rootfs.parent)
            tmp = Path(tempfile.mkdtemp(prefix=f".{base.rootfs.name}-", dir=base.rootfs.parent))
            t0 = time.monotonic()
            log(f"building the Python {base.version} root filesystem (Debian {base.suite}, debootstrap)")
            # pip needs distutils before Python 3.10, and Debian ships it apart from python3 (bullseye)
            extra = ",python3-distutils" if base.version in ("3.9",) else ""
            proc = subprocess.run(["sh", "-c", _DEBOOTSTRAP, "sh", str(tmp / "rootfs"), base.suite, _debian_mirror(), extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
            if proc.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                raise ImageError(f"debootstrap of {base.suite} failed (exit {proc.returncode}):\n{tail(proc.stdout)}")
            os.replace(tmp / "rootfs", base.rootfs)
            shutil.rmtree(tmp, ignore_errors=True)
            log(f"Python {base.version} root filesystem ready in {time.monotonic() - t0:.0f}s")
        if docker and not docker_image_exists(base.tag):
            import_rootfs(base.rootfs, base.tag, log=log)


def _docker_ok() -> bool:
    try:
        from agentrl.sandboxes.docker import docker_available

        return docker_available()[0]
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------------- build steps
_BWRAP_OK: bool | None = None


def _bwrap_ok() -> bool:
    global _BWRAP_OK
    if _BWRAP_OK is None:
        from agentrl.sandboxes.bwrap import bwrap_available

        _BWRAP_OK = bwrap_available()[0]
    return _BWRAP_OK


def _host_ca_bundle() -> str | None:
    for cand in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return cand
    return None


def run_build_step(base: PythonBase, script: str, *, binds: list[tuple[str, str, bool]], network: bool = False,
                   env: dict[str, str] | None = None, timeout: float = 1800.0, what: str = "build step") -> str:
    """Runs ``script`` (sh) as root over ``base``'s root filesystem, with ``binds`` (host, target, writable) and,
    only with ``network``, the host's network and CA bundle. In bwrap when it works here, else in a docker container
    of ``base.tag``. Returns the output; raises :class:`ImageError` with its tail on a non-zero exit."""
    full_env = {"PATH": BASE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", **(env or {})}
    ca = _host_ca_bundle() if network else None
    if network:
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
            if os.environ.get(k):
                full_env[k] = os.environ[k]
        for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):  # a mirror; local file:// indexes do not exist inside
            urls = [u for u in os.environ.get(k, "").split() if u.startswith(("http://", "https://"))]
            if urls:
                full_env[k] = " ".join(urls)
        if ca:
            full_env["PIP_CERT"] = "/agentrl-host-ca.crt"
    if base.rootfs.is_dir() and _bwrap_ok():
        argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        if network:
            argv.append("--share-net")
        argv += ["--tmpfs", "/"]
        from agentrl.sandboxes.bwrap import ROOTFS_SKIP

        root = base.rootfs
        for name in sorted(os.listdir(root)):
            if name in ROOTFS_SKIP or name in ("workspace", "agentrl"):
                continue
            p = root / name
            if p.is_symlink():
                argv += ["--symlink", os.readlink(p), f"/{name}"]
            elif p.exists():
                argv += ["--ro-bind", str(p), f"/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/workspace"]
        if ca:
            argv += ["--ro-bind", ca, "/agentrl-host-ca.crt"]
        for host, target, writable in binds:
            argv += ["--bind" if writable else "--ro-bind", host, target]
        argv += ["--remount-ro", "/", "--chdir", "/workspace", "--clearenv"]
        for k, v in full_env.items():
            argv += ["--setenv", k, v]
        argv += ["--cap-drop", "ALL", "--", "sh", "-c", script]
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                  timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ImageError(f"{what} timed out after {timeout:g}s") from e
        if proc.returncode != 0:
            raise ImageError(f"{what} failed (exit {proc.returncode}):\n{tail(proc.stdout)}")
        return proc.stdout
    if not _docker_ok():
        raise ImageError(f"{what}: neither bwrap (with the root filesystem of {base.tag}) nor docker is available")
    return _docker_step(base, script, binds, network, full_env, ca, timeout, what)


def _docker_step(base, script, binds, network, env, ca, timeout, what) -> str:
    from agentrl.sandboxes.docker import docker_client

    volumes = {host: {"bind": target, "mode": "rw" if writable else "ro"} for host, target, writable in binds}
    if ca:
        volumes[ca] = {"bind": "/agentrl-host-ca.crt", "mode": "ro"}
    client = docker_client()
    container = client.containers.run(base.tag, ["sh", "-c", script], user="0:0", working_dir="/workspace",
                                      network_mode="bridge" if network else "none", environment=env,
                                      volumes=volumes, detach=True)
    try:
        res = container.wait(timeout=timeout)
        out = container.logs().decode(errors="replace")
    except Exception as e:
        raise ImageError(f"{what} failed in docker: {e}") from e
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)
    if res.get("StatusCode") != 0:
        raise ImageError(f"{what} failed (exit {res.get('StatusCode')}):\n{tail(out)}")
    return out
