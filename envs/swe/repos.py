"""Local repositories for SWE instances, exported as single-commit repositories: nothing is cloned from the network
and no history after ``base_commit`` (the gold fix, in real upstream histories) ever reaches a sandbox.

A :class:`RepoStore` maps an instance's ``repo`` (``"owner/name"``) to a source under its ``repos_dir``. Candidates,
first match wins: ``owner__name`` (SWE-bench's naming), ``owner/name`` (nested), then the bare ``name`` (only while
no other ``owner/name`` of this store claimed it: ``owner1/utils`` and ``owner2/utils`` must not share ``utils``).
Each candidate path is tried as

- a git repository: a clone (work tree with ``.git``) or a bare repository, with any history;
- ``PATH.bundle``: a git bundle;
- ``PATH.tar``, ``PATH.tar.gz``, ``PATH.tgz``: a tarball of a git repository or of plain files (a single top
  directory is descended into);
- a plain directory of files (no ``.git``): built into a one-commit repository whose id depends only on the files'
  paths and bytes (:func:`build_git_repo`); this is how the shipped suite stores its repositories.

:meth:`RepoStore.export` resolves ``base_commit`` (abbreviated ids too) in the source and writes a *fresh* repository
that holds exactly the objects of that commit: the commit object itself (so its id is ``base_commit``), its trees
and blobs; ``.git/shallow`` marks it as the boundary. No refs but ``main``, no reflog, no packed refs, no remote, no
hooks, no other objects: ``git log --all``, ``git reflog``, ``git fsck --lost-found`` and a scan of ``.git/objects``
find nothing after ``base_commit``. Exports are built once per (source, commit) under ``cache_dir`` (atomically) and
only read afterwards (the image builder copies them), so concurrent users share them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent / "suite"
SUITE_INSTANCES = SUITE_DIR / "instances.jsonl"
SUITE_REPOS = SUITE_DIR / "repos"

#: Identity and date of the one commit of a repository built from plain files (fixed: the commit id must not
#: depend on who builds it or when).
FIXED_IDENTITY = {
    "GIT_AUTHOR_NAME": "agentrl suite",
    "GIT_AUTHOR_EMAIL": "suite@agentrl.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "agentrl suite",
    "GIT_COMMITTER_EMAIL": "suite@agentrl.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
}
_IGNORED_NAMES = {".git", "__pycache__", ".pytest_cache", ".mypy_cache"}
_IGNORED_SUFFIXES = (".pyc", ".pyo")
#: Written to .git/info/exclude of every export so that interpreter droppings never enter a diff.
EXCLUDES = "__pycache__/\n*.pyc\n*.pyo\n.pytest_cache/\n"
TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar")
#: Bumped when the export layout changes, so that old cache entries are not reused.
EXPORT_VERSION = "2"


class RepoError(RuntimeError):
    """A repository that cannot be found or built; the message names the repo and what was tried."""


def git_env() -> dict[str, str]:
    """The environment of every git call: the user's and the system's config ignored (hooks, signing or autocrlf
    must not change what we build), every directory trusted, no prompts."""
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0")
    env.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"})
    return env


def git(*args: str, cwd: str | Path | None = None, input: bytes | None = None, env: dict[str, str] | None = None) -> str:
    """Runs ``git ARGS`` and returns stdout (text); raises :class:`RepoError` with git's stderr on failure."""
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env or git_env())
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


def commit_tree(dest: Path, message: str = "base", parent: str | None = None) -> str:
    """Commits the files of the work tree at ``dest`` (an initialised repository) with the fixed identity and date,
    every file as mode 100644 (whatever its mode on disk) and ``__pycache__``/``*.pyc`` left out; moves ``main`` to
    the new commit and returns its id (which depends only on the paths, the bytes, ``message`` and ``parent``)."""
    files = source_files(dest)
    if not files:
        raise RepoError(f"{dest}: no files to commit")
    git("read-tree", "--empty", cwd=dest)
    shas = git("hash-object", "-w", "--no-filters", "--stdin-paths", cwd=dest, input="\n".join(files).encode() + b"\n").split()
    index_info = "".join(f"100644 {sha}\t{rel}\n" for sha, rel in zip(shas, files))
    git("update-index", "--add", "--index-info", cwd=dest, input=index_info.encode())
    tree = git("write-tree", cwd=dest).strip()
    env = dict(git_env(), **FIXED_IDENTITY)
    commit = git("commit-tree", tree, "-m", message, *(["-p", parent] if parent else []), cwd=dest, env=env).strip()
    git("update-ref", "refs/heads/main", commit, cwd=dest)
    git("reset", "-q", "--hard", "main", cwd=dest)
    return commit


def build_git_repo(src_dir: str | Path, dest: str | Path, message: str = "base") -> str:
    """Copies the files of ``src_dir`` into a new git repository at ``dest`` (which must not exist), commits them
    as one commit on ``main`` (see :func:`commit_tree`) and returns the commit id."""
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
    commit = commit_tree(dest, message)
    (dest / ".git" / "info").mkdir(exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text(EXCLUDES)
    return commit


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE_DIR/swe``, else ``$XDG_CACHE_HOME/agentrl/swe``, else ``~/.cache/agentrl/swe``."""
    if os.environ.get("AGENTRL_CACHE_DIR"):
        return Path(os.environ["AGENTRL_CACHE_DIR"]) / "swe"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrl" / "swe"


def _is_git_dir(path: Path) -> bool:
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def _identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


@dataclass(frozen=True)
class RepoSource:
    """Where a repository's objects come from: ``kind`` is ``git`` (clone or bare), ``bundle``, ``tarball`` or
    ``files``; ``path`` the candidate found under ``repos_dir``."""

    kind: str
    path: Path


@dataclass(frozen=True)
class Export:
    """A fresh single-commit repository: ``path`` (a work tree with ``.git``) holding exactly ``commit`` (full id)."""

    path: Path
    commit: str


class RepoStore:
    """Finds repositories under ``repos_dir`` and exports them at a commit (see the module doc).

    Thread-safe: :meth:`export` may be called from many threads; each (source, commit) is built once, and the
    build is atomic (a temp dir renamed), so concurrent processes never see half an export.
    """

    def __init__(self, repos_dir: str | Path | None = None, cache_dir: str | Path | None = None):
        self.repos_dir = Path(repos_dir) if repos_dir is not None else SUITE_REPOS
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._bare_claims: dict[Path, str] = {}  # bare-name candidate -> the full repo name that used it

    # ------------------------------------------------------------------------------------------------ lookup
    def candidates(self, repo: str) -> list[Path]:
        """Returns the paths tried for ``repo``, in order (each also tried with the bundle/tarball suffixes)."""
        parts = [p for p in repo.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise RepoError(f"invalid repo name {repo!r}: expected 'owner/name'")
        names = ["__".join(parts), "/".join(parts), parts[-1]]
        return [self.repos_dir / n for n in dict.fromkeys(names)]

    def source(self, repo: str) -> RepoSource:
        """Returns where ``repo`` comes from; raises :class:`RepoError` if nothing matches or if the match is a
        bare name another ``owner/name`` already resolved to."""
        cands = self.candidates(repo)
        for i, cand in enumerate(cands):
            found = self._probe(cand)
            if found is None:
                continue
            if len(cands) > 1 and i == len(cands) - 1:  # the bare name: shared by every owner
                with self._guard:
                    other = self._bare_claims.setdefault(cand, repo)
                if other != repo:
                    raise RepoError(
                        f"repo {repo!r}: {cand} is also used for {other!r}; repositories are keyed by their full name, "
                        f"so name them {self.repos_dir / repo.replace('/', '__')} and "
                        f"{self.repos_dir / other.replace('/', '__')}"
                    )
            return found
        tried = ", ".join(str(c) for c in cands)
        raise RepoError(
            f"repo {repo!r} not found under {self.repos_dir} (tried {tried}, each as a git repository, a directory of "
            f"files, and with the suffixes .bundle, {', '.join(TARBALL_SUFFIXES)})"
        )

    @staticmethod
    def _probe(cand: Path) -> RepoSource | None:
        if cand.is_dir() and _is_git_dir(cand):
            return RepoSource("git", cand)
        bundle = cand.with_name(cand.name + ".bundle")
        if bundle.is_file():
            return RepoSource("bundle", bundle)
        for suffix in TARBALL_SUFFIXES:
            tarball = cand.with_name(cand.name + suffix)
            if tarball.is_file():
                return RepoSource("tarball", tarball)
        if cand.is_dir():
            return RepoSource("files", cand)
        return None

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    # ---------------------------------------------------------------------------------------- object sources
    def _git_source(self, repo: str, src: RepoSource) -> Path:
        """Returns a git directory holding the source's objects: the repository itself, or an unpacked copy of a
        bundle or tarball (cached, keyed by the file's path, size and mtime)."""
        if src.kind == "git":
            return src.path
        if src.kind == "files":
            raise RepoError(f"repo {repo!r}: {src.path} holds plain files, not a git repository")
        key = hashlib.sha1(f"{src.kind}:{_identity(src.path)}".encode()).hexdigest()[:16]
        dest = self.cache_dir / "sources" / f"{repo.replace('/', '__')}-{key}"
        with self._lock("src:" + key):
            if dest.is_dir():
                return self._tarball_root(dest) if src.kind == "tarball" else dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
            try:
                if src.kind == "bundle":
                    git("init", "-q", "--bare", str(tmp), cwd=tmp.parent)
                    try:
                        git("bundle", "unbundle", str(src.path.resolve()), cwd=tmp)
                    except RepoError as e:
                        raise RepoError(f"repo {repo!r}: cannot unbundle {src.path}: {e}") from None
                else:
                    try:
                        with tarfile.open(src.path) as tar:
                            try:
                                tar.extractall(tmp, filter="data")
                            except TypeError:  # Python without extraction filters
                                tar.extractall(tmp)
                    except (tarfile.TarError, OSError) as e:
                        raise RepoError(f"repo {repo!r}: cannot extract {src.path}: {e}") from None
                os.rename(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return self._tarball_root(dest) if src.kind == "tarball" else dest

    @staticmethod
    def _tarball_root(extracted: Path) -> Path:
        entries = [p for p in extracted.iterdir()]
        if len(entries) == 1 and entries[0].is_dir() and not _is_git_dir(extracted):
            return entries[0]
        return extracted

    def resolve(self, repo: str, commit: str) -> str:
        """Returns the full id of ``commit`` (an abbreviated id is resolved, an ambiguous one is an error).
        For plain files, the id of their one-commit build, which must start with ``commit``."""
        return self.export(repo, commit).commit

    # ---------------------------------------------------------------------------------------------- exports
    def export(self, repo: str, commit: str) -> Export:
        """Returns the fresh single-commit repository of ``repo`` at ``commit`` (see the module doc); its directory
        is shared and must not be modified. Raises :class:`RepoError` when the repo is missing, ``commit`` is not
        in it (or is ambiguous), or plain files no longer build ``commit``."""
        src = self.source(repo)
        if not commit or any(c.isspace() for c in commit) or commit.startswith("-"):
            raise RepoError(f"repo {repo!r}: invalid base_commit {commit!r}")
        objects: Path | None = None
        if src.kind != "files":
            objects = self._git_source(repo, src)
            if src.kind == "tarball" and not _is_git_dir(objects):
                objects = None  # a tarball of plain files: built like a directory
            else:
                commit = _resolve(objects, commit, repo)  # the cache is keyed by the full id
        origin = _identity(src.path) if src.kind in ("bundle", "tarball") else str(src.path.resolve())
        key = hashlib.sha1(f"{EXPORT_VERSION}:{src.kind}:{origin}:{commit}".encode()).hexdigest()[:16]
        dest = self.cache_dir / "exports" / f"{repo.replace('/', '__')}-{key}"
        with self._lock("exp:" + key):
            if (dest / ".git").is_dir():
                return Export(dest, git("rev-parse", "HEAD", cwd=dest).strip())
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=dest.parent))
            try:
                work = tmp / "repo"
                if objects is None:
                    files_dir = self._git_source(repo, src) if src.kind == "tarball" else src.path
                    objects = self._build_files(repo, files_dir, commit, tmp)
                    commit = _resolve(objects, commit, repo)
                _export(objects, commit, work, repo)
                try:
                    os.rename(work, dest)
                except OSError:  # another process built it first
                    if not (dest / ".git").is_dir():
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return Export(dest, git("rev-parse", "HEAD", cwd=dest).strip())

    def checkout(self, repo: str, commit: str) -> Path:
        """The directory of :meth:`export` (a work tree at ``commit``, clean, holding no other commit)."""
        return self.export(repo, commit).path

    @staticmethod
    def _build_files(repo: str, files_dir: Path, commit: str, tmp: Path) -> Path:
        built_dir = tmp / "built"
        built = build_git_repo(files_dir, built_dir)
        if not built.startswith(commit):
            raise RepoError(
                f"repo {repo!r}: the files in {files_dir} build commit {built}, not base_commit {commit} "
                "(were the files edited after the instance was written?)"
            )
        return built_dir


def _resolve(objects: Path, commit: str, repo: str) -> str:
    try:
        return git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}^{{commit}}", cwd=objects).strip()
    except RepoError:
        pass
    # Say why: an ambiguous prefix, or no such commit.
    proc = subprocess.run(["git", "rev-parse", "--verify", "--end-of-options", f"{commit}^{{commit}}"], cwd=objects,
                          capture_output=True, env=git_env())
    why = proc.stderr.decode(errors="replace").strip().splitlines()
    raise RepoError(f"repo {repo!r}: base_commit {commit} is not a commit of {objects} ({'; '.join(why[:3]) or 'unknown'})")


def _export(objects: Path, full: str, work: Path, repo: str) -> None:
    """Writes a new repository at ``work`` holding exactly ``full`` and its tree, checked out on ``main``."""
    listing = git("ls-tree", "-r", "-t", "-z", full, cwd=objects)
    wanted = [full, git("rev-parse", f"{full}^{{tree}}", cwd=objects).strip()]
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, _, _path = entry.partition("\t")
        _mode, kind, sha = meta.split()
        if kind in ("blob", "tree"):  # gitlinks (submodules) name commits of other repositories: not ours
            wanted.append(sha)
    wanted = list(dict.fromkeys(wanted))
    pack = subprocess.run(["git", "pack-objects", "--stdout", "-q"], cwd=objects, input=("\n".join(wanted) + "\n").encode(),
                          capture_output=True, env=git_env())
    if pack.returncode != 0:
        raise RepoError(f"repo {repo!r}: cannot pack {full}: {pack.stderr.decode(errors='replace').strip()}")
    work.mkdir(parents=True)
    git("init", "-q", "--template=", cwd=work)  # no hooks, no description, no sample files
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=work)
    git("index-pack", "--stdin", cwd=work, input=pack.stdout)
    (work / ".git" / "shallow").write_text(full + "\n")
    no_log = ("-c", "core.logAllRefUpdates=false")
    git(*no_log, "update-ref", "refs/heads/main", full, cwd=work)
    git(*no_log, "read-tree", "-u", "--reset", "HEAD", cwd=work)
    (work / ".git" / "info").mkdir(exist_ok=True)
    (work / ".git" / "info" / "exclude").write_text(EXCLUDES)
    shutil.rmtree(work / ".git" / "logs", ignore_errors=True)
    got = git("rev-list", "--all", "--count", cwd=work).strip()
    if got != "1":
        raise RepoError(f"repo {repo!r}: the export of {full} holds {got} commits, expected 1")


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
