"""Offline image builds: a recipe under ``sandboxes/images/`` fills a root filesystem directory, which is kept in
the cache (the bwrap backend runs on it directly) and imported into Docker with ``docker import`` semantics
(docker-py's ``import_image``; no registry involved).

Images:
- ``agentrl-base:latest``: Debian bookworm minbase + python3, git, procps; user ``agent`` (uid 1000). ~1 min.
- ``agentrl-busybox:latest``: a static busybox; user ``agent`` (uid 1000). < 1 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .base import SandboxError

IMAGES_DIR = Path(__file__).resolve().parent / "images"


@dataclass(frozen=True)
class ImageRecipe:
    """One buildable image: the recipe script (run as ``sh SCRIPT ROOTFS [ARGS...]``) and its docker tag."""

    key: str
    tag: str
    script: str
    description: str


RECIPES: dict[str, ImageRecipe] = {
    "base": ImageRecipe("base", "agentrl-base:latest", "base.sh", "Debian bookworm minbase with python3 and git"),
    "busybox": ImageRecipe("busybox", "agentrl-busybox:latest", "busybox.sh", "static busybox shell"),
}

# What `docker import --change` sets: the unprivileged user and work dir every sandbox uses by default.
IMPORT_CHANGES = [
    "USER 1000:1000",
    "WORKDIR /workspace",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV HOME=/tmp",
    'CMD ["/bin/sh"]',
]


def cache_dir() -> Path:
    """Where built root filesystems live: ``$AGENTRL_SANDBOX_CACHE``, else ``/var/cache/agentrl/sandboxes`` for
    root (bwrap sandboxes run as unprivileged uids, which cannot traverse /root), else ``~/.cache/agentrl/sandboxes``.
    """
    if os.environ.get("AGENTRL_SANDBOX_CACHE"):
        return Path(os.environ["AGENTRL_SANDBOX_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/agentrl/sandboxes")
    return Path.home() / ".cache" / "agentrl" / "sandboxes"


def _name_of(tag: str) -> str:
    return tag.split("/")[-1].replace(":", "_")


def rootfs_path(image: str) -> Path:
    """The cached root filesystem directory for ``image`` (e.g. ``agentrl-base:latest``); may not exist yet."""
    if ":" not in image.split("/")[-1]:
        image = image + ":latest"
    return cache_dir() / "rootfs" / _name_of(image)


def _debian_mirror() -> str:
    """The Debian mirror apt is configured with (so a machine with a local mirror/proxy keeps using it)."""
    if os.environ.get("AGENTRL_DEBIAN_MIRROR"):
        return os.environ["AGENTRL_DEBIAN_MIRROR"]
    candidates = [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if parts[:1] == ["URIs:"] and len(parts) > 1 and "security" not in parts[1]:
                return parts[1]
            if parts[:1] == ["deb"] and len(parts) > 2 and "security" not in line:
                uri = next((p for p in parts[1:] if "://" in p), None)
                if uri:
                    return uri
    return "http://deb.debian.org/debian"


def docker_image_exists(tag: str) -> bool:
    import docker

    try:
        docker.from_env().images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_rootfs(key: str, *, force: bool = False, tag: str | None = None, log=print) -> Path:
    """Run recipe ``key`` into the cache directory of ``tag`` (default: the recipe's), atomically (a temp dir
    renamed on success). Returns the root filesystem path. Skips the build when it exists and ``force`` is false.
    """
    recipe = RECIPES[key]
    if tag:
        recipe = ImageRecipe(recipe.key, tag, recipe.script, recipe.description)
    dest = rootfs_path(recipe.tag)
    if dest.exists() and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(dest.parent, 0o755)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    args = ["sh", str(IMAGES_DIR / recipe.script), str(tmp / "rootfs")]
    if key == "base":
        args.append(_debian_mirror())
    log(f"building rootfs {recipe.tag}: {' '.join(args)}")
    t0 = time.monotonic()
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SandboxError(f"image recipe {recipe.script} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp / "rootfs", dest)
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"rootfs {recipe.tag} ready at {dest} in {time.monotonic() - t0:.1f}s")
    return dest


def import_rootfs(rootfs: Path, tag: str, *, log=print) -> str:
    """``docker import`` of a directory: tar it to a temp file and stream it to the engine. Returns the image id."""
    import docker

    client = docker.from_env(timeout=600)
    repo, _, version = tag.rpartition(":")
    with tempfile.TemporaryDirectory(prefix="agentrl-import-") as td:
        tar_path = Path(td) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tar_path), "."], check=True)
        t0 = time.monotonic()
        client.api.import_image(src=str(tar_path), repository=repo, tag=version, changes=IMPORT_CHANGES)
    image = client.images.get(tag)
    log(f"imported {tag} ({image.short_id}) in {time.monotonic() - t0:.1f}s")
    return image.id


def build_image(
    key: str, *, force: bool = False, docker_import: bool = True, tag: str | None = None, log=print
) -> str:
    """Build image ``key`` ("base" or "busybox"): rootfs into the cache, then into Docker unless the tag exists.

    Returns the docker tag (``tag`` overrides the recipe's). ``docker_import=False`` only prepares the rootfs
    (enough for the bwrap backend).
    """
    if key not in RECIPES:
        raise SandboxError(f"unknown image {key!r}; known: {', '.join(RECIPES)}")
    recipe = RECIPES[key]
    if tag:
        recipe = ImageRecipe(recipe.key, tag, recipe.script, recipe.description)
    need_docker = docker_import and (force or not docker_image_exists(recipe.tag))
    if not need_docker and rootfs_path(recipe.tag).exists() and not force:
        log(f"{recipe.tag}: already built")
        return recipe.tag
    rootfs = build_rootfs(key, force=force, tag=recipe.tag, log=log)
    if need_docker:
        import_rootfs(rootfs, recipe.tag, log=log)
    return recipe.tag
