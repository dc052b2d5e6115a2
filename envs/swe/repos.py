"""Local repositories for SWE instances: nothing is ever cloned from the network.

A :class:`RepoStore` maps an instance's ``repo`` (``"owner/name"``) to a source under its ``repos_dir`` and gives a
working copy at ``base_commit``. Candidates, first match wins, for ``owner/name``:
``owner__name``, ``owner/name``, ``name`` (SWE-bench's naming, a nested layout, the bare name), each as

- a git repository (a work tree with ``.git``, or a bare repository),
- a git bundle (the candidate path plus ``.bundle``), or
- a plain directory of files (no ``.git``): built into a git repository with one commit whose id depends only on
  the files' paths and bytes (:func:`build_git_repo`); this is how the shipped suite stores its repositories.

Working copies are built once per (source, commit) under ``cache_dir`` and are only ever read afterwards (they are
uploaded into sandboxes), so concurrent episodes share them. A copy from a git repository or bundle holds only the
base commit (a depth-1 fetch), so an upload costs one tree, not the project's history.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent / "suite"
SUITE_INSTANCES = SUITE_DIR / "instances.jsonl"
SUITE_REPOS = SUITE_DIR / "repos"

#: Identity and date of the one commit of a repository built from plain files (fixed: the commit id must not
#: depend on who builds it or when).
_FIXED_IDENTITY = {
    "GIT_AUTHOR_NAME": "agentrl suite",
    "GIT_AUTHOR_EMAIL": "suite@agentrl.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "agentrl suite",
    "GIT_COMMITTER_EMAIL": "suite@agentrl.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
}
_IGNORED_NAMES = {".git", "__pycache__", ".pytest_cache", ".mypy_cache"}
_IGNORED_SUFFIXES = (".pyc", ".pyo")
#: Written to .git/info/exclude of every working copy so that interpreter droppings never enter a diff.
EXCLUDES = "__pycache__/\n*.pyc\n*.pyo\n.pytest_cache/\n"


class RepoError(RuntimeError):
    """A repository that cannot be found or built; the message names the repo and what was tried."""


def _git_env() -> dict[str, str]:
    # Ignore the user's and the system's git config: hooks, signing or autocrlf must not change what we build.
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0")
    env.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"})
    return env


def git(*args: str, cwd: str | Path | None = None, input: bytes | None = None, env: dict[str, str] | None = None) -> str:
    """Runs ``git ARGS`` and returns stdout (text); raises :class:`RepoError` with git's stderr on failure."""
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env or _git_env())
    if proc.returncode != 0:
        raise RepoError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode(errors="replace")


def source_files(src_dir: Path) -> list[str]:
    """Returns the relative POSIX paths of the files a plain directory contributes to its repository, sorted."""
    out = []
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = sorted(d for d in dirs if d not in _IGNORED_NAMES)
        for name in files:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            out.append(Path(root, name).relative_to(src_dir).as_posix())
    return sorted(out)


def build_git_repo(src_dir: str | Path, dest: str | Path, message: str = "base") -> str:
    """Copies the files of ``src_dir`` into a new git repository at ``dest`` (which must not exist), commits them
    as one commit on ``main`` with a fixed identity and date, and returns the commit id.

    The id depends only on the files' paths and bytes and on ``message``: every file is stored with mode 100644,
    whatever its mode on disk, and ``__pycache__``/``*.pyc`` are left out.
    """
    src_dir, dest = Path(src_dir), Path(dest)
    if not src_dir.is_dir():
        raise RepoError(f"{src_dir}: not a directory")
    files = source_files(src_dir)
    if not files:
        raise RepoError(f"{src_dir}: no files to commit")
    dest.mkdir(parents=True)
    git("init", "-q", cwd=dest)
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=dest)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src_dir / rel, dest / rel)
    shas = git("hash-object", "-w", "--no-filters", "--stdin-paths", cwd=dest, input="\n".join(files).encode() + b"\n").split()
    index_info = "".join(f"100644 {sha}\t{rel}\n" for sha, rel in zip(shas, files))
    git("update-index", "--add", "--index-info", cwd=dest, input=index_info.encode())
    tree = git("write-tree", cwd=dest).strip()
    env = dict(_git_env(), **_FIXED_IDENTITY)
    commit = git("commit-tree", tree, "-m", message, cwd=dest, env=env).strip()
    git("update-ref", "refs/heads/main", commit, cwd=dest)
    git("reset", "-q", "--hard", "main", cwd=dest)
    (dest / ".git" / "info").mkdir(exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text(EXCLUDES)
    return commit


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE_DIR/swe``, else ``$XDG_CACHE_HOME/agentrl/swe``, else ``~/.cache/agentrl/swe``."""
    if os.environ.get("AGENTRL_CACHE_DIR"):
        return Path(os.environ["AGENTRL_CACHE_DIR"]) / "swe"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrl" / "swe"


class RepoStore:
    """Finds repositories under ``repos_dir`` and hands out working copies at a commit (see the module doc).

    Thread-safe: :meth:`checkout` may be called from many threads; each (source, commit) is built once.
    """

    def __init__(self, repos_dir: str | Path | None = None, cache_dir: str | Path | None = None):
        self.repos_dir = Path(repos_dir) if repos_dir is not None else SUITE_REPOS
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def candidates(self, repo: str) -> list[Path]:
        """Returns the paths tried for ``repo``, in order (each also tried with a ``.bundle`` suffix)."""
        parts = [p for p in repo.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise RepoError(f"invalid repo name {repo!r}")
        names = ["__".join(parts), "/".join(parts), parts[-1]]
        return [self.repos_dir / n for n in dict.fromkeys(names)]

    def source(self, repo: str) -> tuple[str, Path]:
        """Returns ``(kind, path)`` with kind ``"git"``, ``"bundle"`` or ``"files"``; raises :class:`RepoError`."""
        for cand in self.candidates(repo):
            if (cand / ".git").exists() or ((cand / "HEAD").is_file() and (cand / "objects").is_dir()):
                return "git", cand
            bundle = cand.with_name(cand.name + ".bundle")
            if bundle.is_file():
                return "bundle", bundle
            if cand.is_dir():
                return "files", cand
        tried = ", ".join(str(c) for c in self.candidates(repo))
        raise RepoError(f"repo {repo!r} not found under {self.repos_dir} (tried {tried}, each also as .bundle)")

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def checkout(self, repo: str, commit: str) -> Path:
        """Returns a working copy of ``repo`` with HEAD detached at ``commit`` and a clean tree.

        The directory is shared and must not be modified. Raises :class:`RepoError` if the repo is missing or
        ``commit`` is not in it (for plain files: if the files no longer build ``commit``).
        """
        kind, src = self.source(repo)
        key = hashlib.sha1(f"{kind}:{src.resolve()}:{commit}".encode()).hexdigest()[:16]
        dest = self.cache_dir / f"{src.name.replace('.bundle', '')}-{key}"
        with self._lock(key):
            if (dest / ".git").is_dir():
                return dest
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=self.cache_dir))
            try:
                work = tmp / "repo"
                if kind == "files":
                    built = build_git_repo(src, work)
                    if not built.startswith(commit):
                        raise RepoError(
                            f"repo {repo!r}: the files in {src} build commit {built}, not base_commit {commit} "
                            "(were the files edited after the instance was written?)"
                        )
                else:
                    _shallow_checkout(src, commit, work, repo)
                    (work / ".git" / "info").mkdir(exist_ok=True)
                    (work / ".git" / "info" / "exclude").write_text(EXCLUDES)
                try:
                    os.rename(work, dest)
                except OSError:  # another process built it first
                    if not (dest / ".git").is_dir():
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return dest


def _shallow_checkout(src: Path, commit: str, work: Path, repo: str) -> None:
    """A working copy of ``src`` at ``commit`` holding only that commit (depth 1): what gets uploaded into every
    sandbox stays the size of one tree, not of the project's history. Falls back to a full clone when the commit
    cannot be fetched by id (an abbreviated id, say)."""
    work.mkdir(parents=True)
    git("init", "-q", cwd=work)
    upload_pack = "git -c uploadpack.allowAnySHA1InWant=true upload-pack"
    try:
        git("fetch", "-q", "--depth", "1", f"--upload-pack={upload_pack}", f"file://{src.resolve()}", commit, cwd=work)
        git("-c", "advice.detachedHead=false", "checkout", "-q", "--detach", "FETCH_HEAD", cwd=work)
        if not git("rev-parse", "HEAD", cwd=work).strip().startswith(commit):
            raise RepoError("fetched the wrong commit")
    except RepoError:
        shutil.rmtree(work)
        git("clone", "-q", "--no-checkout", "--no-hardlinks", str(src), str(work))
        try:
            git("-c", "advice.detachedHead=false", "checkout", "-q", "--detach", commit, cwd=work)
        except RepoError as e:
            raise RepoError(f"repo {repo!r}: base_commit {commit} cannot be checked out from {src}: {e}") from None
        git("remote", "remove", "origin", cwd=work)


def patch_paths(patch: str) -> list[str]:
    """Returns the paths a unified git diff touches (both sides of renames), in order of appearance."""
    out: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            rest = line[len("diff --git "):]
            # "a/X b/X": paths with spaces are rare in test patches; split on the " b/" that starts the new path.
            if rest.startswith("a/") and " b/" in rest:
                a, b = rest[2:].split(" b/", 1)
                for p in (a, b):
                    if p not in out:
                        out.append(p)
    return out
