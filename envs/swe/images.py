"""Per-instance images: the repository at ``base_commit`` and its test environment, built once and cached, offline at
episode time.

Layers, each built once, atomically (a temp dir renamed) and under a file lock (concurrent processes build once);
the Python bases and the step runner live in :mod:`agentrl.envs.swe.buildsteps`:

1. **Python base**: a root filesystem with ``python3`` and git. 3.11 is the sandbox base image
   (``agentrl-base:latest``, Debian bookworm, ``agentrl sandboxes build-image``); 3.9 and 3.13 are Debian bullseye and
   trixie built here with debootstrap (``agentrl-swe-py3.9:latest`` ...). Other versions are refused.
2. **Wheels** (per :meth:`EnvSpec.env_key`): ``pip wheel`` of the spec's requirements, run *on the host* by the
   target's own interpreter (the base root filesystem with the host's network, so environment markers and platform
   tags are the target's), into a host directory. The only step that uses the network.
3. **Environment** (same key): ``/agentrl/venv``, a venv (``--without-pip``, then pip from its wheel) with the
   wheels installed, offline.
4. **Instance** (key: environment, repository full name, full ``base_commit``, install command): ``/agentrl/repo``,
   the single-commit export of :class:`~agentrl.envs.swe.repos.RepoStore` (no later history), plus a copy of the
   venv; the spec's ``install`` command runs in it offline (files it leaves untracked are added to
   ``.git/info/exclude``; changing tracked files is an error).

Backends: bwrap runs the Python base's root filesystem with the instance layer bind-mounted read-only at
``/agentrl``; docker runs the image ``agentrl-swe:<key>-<base id>`` (``FROM`` the Python base, ``COPY`` of the instance
layer), built with the engine's builder, network off. Build steps run in bwrap over the base root filesystem when
bwrap works here, else in a docker container of the base image. Episodes copy ``/agentrl/repo`` into the writable
work dir inside the sandbox (:func:`materialize`): nothing is uploaded from the driver per sandbox.

Layers live under ``$AGENTRL_SWE_IMAGE_CACHE``, else ``swe/`` in the sandbox image cache (a directory the
unprivileged sandbox uids can traverse, which bwrap needs for its bind mounts).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from .buildsteps import (BASE_PATH, ImageError, Log, PythonBase, ensure_python_base, image_cache_dir, locked,
                         mkdirs, python_base, run_build_step, tail)
from .envspec import EnvSpec, EnvSpecError, runner_for
from .repos import Export, RepoStore, git

#: Inside every instance image.
LAYER_DIR = "/agentrl"
REPO_DIR = f"{LAYER_DIR}/repo"
VENV_DIR = f"{LAYER_DIR}/venv"
#: Where the wheels are bound while building (not part of any image).
WHEELS_DIR = "/agentrl-wheels"
#: The pip that bootstraps every venv (runs from its wheel; supports Python 3.8-3.13).
BOOTSTRAP_PIP = "pip==24.3.1"
#: Bumped when a layer's layout changes, so that stale cache entries are not reused.
LAYOUT_VERSION = "1"
DOCKER_REPO = "agentrl-swe"

def _arch() -> str:
    return platform.machine() or "unknown"


def _fix_modes(path: Path) -> None:
    """Everything readable (and directories traversable) by the unprivileged sandbox users."""
    subprocess.run(["chmod", "-R", "a+rX", str(path)], check=False)


def _atomic_dir(dest: Path, build: Callable[[Path], None]) -> Path:
    """Builds into a temp dir beside ``dest`` and renames it into place; a no-op when ``dest`` exists."""
    if dest.is_dir():
        return dest
    mkdirs(dest.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        build(tmp)
        _fix_modes(tmp)
        os.chmod(tmp, 0o755)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


# ---------------------------------------------------------------------------------------------------- env layers
def fetch_wheels(spec: EnvSpec, base: PythonBase, log: Log = print) -> Path:
    """Downloads (or builds, for sdist-only packages) the wheels of ``spec.pip`` and their dependencies for the
    target interpreter; returns the host directory. Cached by :meth:`EnvSpec.env_key`."""
    key = spec.env_key(_arch())
    dest = image_cache_dir() / "wheels" / key

    def build(tmp: Path) -> None:
        t0 = time.monotonic()
        boot = subprocess.run([os.environ.get("AGENTRL_HOST_PYTHON", "python3"), "-m", "pip", "download", "-q",
                               "--no-deps", "--only-binary", ":all:", "-d", str(tmp), BOOTSTRAP_PIP],
                              capture_output=True, text=True)
        pips = list(tmp.glob("pip-*.whl"))
        if boot.returncode != 0 or not pips:
            raise ImageError(f"cannot download {BOOTSTRAP_PIP} on the host: {tail(boot.stderr or boot.stdout)}")
        (tmp / "requirements.txt").write_text("\n".join([BOOTSTRAP_PIP, *spec.pip]) + "\n")
        script = (f"python3 {WHEELS_DIR}/{pips[0].name}/pip wheel --no-cache-dir --progress-bar off "
                  f"--wheel-dir {WHEELS_DIR} -r {WHEELS_DIR}/requirements.txt")
        run_build_step(base, script, binds=[(str(tmp), WHEELS_DIR, True)], network=True,
                       what=f"pip wheel for python {spec.python} ({', '.join(spec.pip)})")
        log(f"wheels for {spec.pip} (python {spec.python}) fetched in {time.monotonic() - t0:.1f}s")

    with locked(f"wheels-{key}"):
        return _atomic_dir(dest, build)


def build_env_layer(spec: EnvSpec, base: PythonBase, log: Log = print) -> Path | None:
    """Returns the host directory holding ``venv/`` (the spec's requirements installed, offline), or None when the
    spec installs nothing (the tests use the base image's ``python3``). Cached by :meth:`EnvSpec.env_key`."""
    if not spec.has_venv:
        return None
    key = spec.env_key(_arch())
    dest = image_cache_dir() / "envs" / key
    wheels = fetch_wheels(spec, base, log)

    def build(tmp: Path) -> None:
        t0 = time.monotonic()
        pip_whl = next(wheels.glob("pip-*.whl")).name
        script = (f"python3 -m venv --without-pip {VENV_DIR} && "
                  f"{VENV_DIR}/bin/python {WHEELS_DIR}/{pip_whl}/pip install --no-index --find-links {WHEELS_DIR} "
                  f"--progress-bar off -r {WHEELS_DIR}/requirements.txt")
        run_build_step(base, script, binds=[(str(tmp), LAYER_DIR, True), (str(wheels), WHEELS_DIR, False)],
                       what=f"venv for python {spec.python}")
        log(f"environment {key} (python {spec.python}, {len(spec.pip)} requirements) built in {time.monotonic() - t0:.1f}s")

    with locked(f"env-{key}"):
        return _atomic_dir(dest, build)


# ----------------------------------------------------------------------------------------------- instance layers
@dataclass(frozen=True)
class Runtime:
    """Everything an episode or a grade needs to run an instance: the sandbox spec (image or mounts), the env spec,
    the runner, the interpreter, the environment of commands, and the full ``base_commit``."""

    sandbox: Any  # agentrl.sandboxes.SandboxSpec
    env_spec: EnvSpec
    runner: str
    python: str
    env: dict[str, str]
    base_commit: str
    key: str
    build_s: float = 0.0
    log: list[str] = field(default_factory=list, compare=False)


def instance_key(instance: Any, export: Export, spec: EnvSpec) -> str:
    blob = json.dumps({"v": LAYOUT_VERSION, "env": spec.env_key(_arch()) if spec.has_venv else None,
                       "python": spec.python, "repo": instance.repo, "commit": export.commit,
                       "install": spec.install}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_instance_layer(instance: Any, export: Export, spec: EnvSpec, base: PythonBase, key: str,
                         log: Log = print) -> Path:
    """Returns the host directory that becomes ``/agentrl`` (``repo/``, and ``venv/`` when the spec has one)."""
    env_dir = build_env_layer(spec, base, log)
    dest = image_cache_dir() / "instances" / key

    def build(tmp: Path) -> None:
        t0 = time.monotonic()
        subprocess.run(["cp", "-a", str(export.path), str(tmp / "repo")], check=True)
        if env_dir is not None:
            subprocess.run(["cp", "-a", str(env_dir / "venv"), str(tmp / "venv")], check=True)
        if spec.install.strip():
            env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELS_DIR, **spec.env}
            path = f"{VENV_DIR}/bin:{BASE_PATH}" if env_dir is not None else BASE_PATH
            env["PATH"] = path
            binds = [(str(tmp), LAYER_DIR, True), (str(tmp / "repo"), "/workspace", True)]
            if spec.has_venv:
                binds.append((str(fetch_wheels(spec, base, log)), WHEELS_DIR, False))
            out = run_build_step(base, f"cd /workspace && {spec.install}", binds=binds, env=env,
                                 what=f"install command of {instance.instance_id} ({spec.install!r})")
            changed = git("status", "--porcelain", "--untracked-files=no", cwd=tmp / "repo").strip()
            if changed:
                raise ImageError(f"the install command of {instance.instance_id} modified tracked files (they would "
                                 f"enter every diff):\n{changed[:1000]}")
            untracked = git("ls-files", "--others", "--exclude-standard", "--directory", cwd=tmp / "repo").split("\n")
            with open(tmp / "repo" / ".git" / "info" / "exclude", "a") as f:
                for u in filter(None, untracked):
                    f.write("/" + u + "\n")
            log(f"install of {instance.instance_id}: {tail(out, 300).strip().splitlines()[-1:] or ['ok']}")
        log(f"instance layer {key} for {instance.instance_id} built in {time.monotonic() - t0:.1f}s")

    with locked(f"inst-{key}"):
        return _atomic_dir(dest, build)


def ensure_docker_image(layer: Path, base: PythonBase, key: str, log: Log = print) -> str:
    """Returns the tag of the docker image of an instance layer (``FROM`` the base, the layer at ``/agentrl``),
    building it with the engine's builder (network off) unless it exists. The tag names the base image's id too,
    so a rebuilt base image gets new instance images."""
    from agentrl.sandboxes.build import docker_image_exists
    from agentrl.sandboxes.docker import docker_client

    base_id = docker_client().api.inspect_image(base.tag)["Id"].split(":")[-1]
    tag = f"{DOCKER_REPO}:{key}-{base_id[:12]}"
    with locked(f"docker-{key}"):
        if docker_image_exists(tag):
            return tag
        t0 = time.monotonic()
        buf = io.BytesIO()
        dockerfile = f"FROM {base.tag}\nCOPY agentrl {LAYER_DIR}\nLABEL agentrl.swe.layer={key}\n".encode()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile)
            tar.addfile(info, io.BytesIO(dockerfile))
            tar.add(str(layer), arcname="agentrl")
        buf.seek(0)
        out: list[str] = []
        try:
            for chunk in docker_client().api.build(fileobj=buf, custom_context=True, tag=tag, rm=True, forcerm=True,
                                                   network_mode="none", pull=False, decode=True):
                if "error" in chunk:
                    raise ImageError(f"docker build of {tag} failed: {chunk['error']}\n{tail(''.join(out))}")
                out.append(str(chunk.get("stream", "")))
        except ImageError:
            raise
        except Exception as e:
            raise ImageError(f"docker build of {tag} failed: {e}") from e
        log(f"docker image {tag} built in {time.monotonic() - t0:.1f}s")
    return tag


class ImageBuilder:
    """Prepares the :class:`Runtime` of instances (building what is missing, once), for one base ``SandboxSpec``.

    ``prepare(instance)`` is blocking and thread-safe; results are memoised per instance id.
    """

    def __init__(self, sandbox: Any, repo_store: RepoStore, env_specs: Any = None, log: Log | None = None):
        from .envspec import EnvSpecs

        self.sandbox = sandbox
        self.repo_store = repo_store
        self.env_specs = env_specs if env_specs is not None else EnvSpecs()
        self.log = log or (lambda msg: None)
        self._cache: dict[str, Runtime] = {}
        self._guard = threading.Lock()

    def env_spec(self, instance: Any) -> EnvSpec:
        spec = self.env_specs.for_instance(instance)
        try:
            spec.validate()
        except ValueError as e:
            raise EnvSpecError(f"instance {instance.instance_id}: env spec: {e}") from None
        return spec

    def prepare(self, instance: Any) -> Runtime:
        """Returns the instance's Runtime, building its layers (and docker image) when missing. Raises
        :class:`EnvSpecError`, :class:`~agentrl.envs.swe.repos.RepoError` or :class:`ImageError`."""
        with self._guard:
            if instance.instance_id in self._cache:
                return self._cache[instance.instance_id]
        t0 = time.monotonic()
        logs: list[str] = []

        def log(msg: str) -> None:
            logs.append(msg)
            self.log(msg)

        spec = self.env_spec(instance)
        runner = runner_for(spec, list(instance.FAIL_TO_PASS) + list(instance.PASS_TO_PASS), f"instance {instance.instance_id}")
        base = python_base(spec.python, self.sandbox.image)
        docker = self.sandbox.backend == "docker"
        ensure_python_base(base, docker=docker, log=log)
        export = self.repo_store.export(instance.repo, instance.base_commit)
        key = instance_key(instance, export, spec)
        layer = build_instance_layer(instance, export, spec, base, key, log)
        if docker:
            sandbox = replace(self.sandbox, image=ensure_docker_image(layer, base, key, log))
        else:
            from agentrl.sandboxes.base import Mount

            sandbox = replace(self.sandbox, image=base.tag, mounts=(*self.sandbox.mounts, Mount(str(layer), LAYER_DIR, True)))
        python = f"{VENV_DIR}/bin/python" if spec.has_venv else "python3"
        path = f"{VENV_DIR}/bin:{BASE_PATH}" if spec.has_venv else BASE_PATH
        env = {"PATH": path, **spec.env}
        rt = Runtime(sandbox, spec, runner, python, env, export.commit, key, time.monotonic() - t0, logs)
        with self._guard:
            self._cache[instance.instance_id] = rt
        return rt


async def materialize(sb: Any, runtime: Runtime, *, timeout: float = 300.0) -> None:
    """Copies the instance's repository from the image into the sandbox's work dir (inside the sandbox: nothing
    is uploaded from the driver). Raises ``SandboxError`` when the copy fails."""
    from agentrl.sandboxes.base import SandboxError

    workdir = shlex.quote(runtime.sandbox.workdir)
    res = await sb.exec(f"cp -a --no-preserve=ownership {REPO_DIR}/. {workdir}/", timeout=timeout, env={"PATH": BASE_PATH})
    if not res.ok:
        raise SandboxError(f"copying the repository into {runtime.sandbox.workdir} failed: {res.output[-500:]}",
                           sandbox_id=getattr(sb, "id", ""))
