"""Real upstream SWE instances built from PyPI sdists, the way a user brings theirs (SWE-bench JSONL + a repos dir).

    python -m agentrl.envs.swe.upstream OUT_DIR [--recipes FILE] [--only ID ...]

The recipes (``upstream.json`` beside this module) hold no upstream code: each names a package, two consecutive
releases, which files (or which top-level functions/classes of a file) of the newer release form the fix and which
form its tests, the test ids, an env spec, and a problem statement in our words. Building one:

1. ``pip download --no-binary :all: --no-deps PACKAGE==VERSION`` of both releases (cached);
2. a git repository ``OUT_DIR/repos/owner__name`` with two commits, as an upstream clone would have: the base
   release (``base_commit``), then the whole newer release (a *later* commit that contains the fix: the env must
   never let an agent see it);
3. the gold ``patch`` (the fix selections applied to the base tree) and the ``test_patch`` (the test selections),
   both taken with ``git diff`` so they apply with ``git apply``;
4. ``OUT_DIR/instances.jsonl`` (SWE-bench format) and ``OUT_DIR/env_specs.yaml`` (repo -> version -> env spec).

Everything is deterministic (fixed commit identity and date), so ``base_commit`` only depends on the sdists' bytes.
A finished ``OUT_DIR`` carries a stamp of the recipes and is reused as is.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from .repos import commit_tree, default_cache_dir, git

RECIPES = Path(__file__).resolve().parent / "upstream.json"
#: Build outputs of the sdists that must not be part of the repository (an install rewrites them).
DROP = ["PKG-INFO", "*.egg-info", "*.egg-info/*", "*/*.egg-info", "*/*.egg-info/*", "setup.cfg.orig"]
STAMP = ".agentrl-upstream"


class RecipeError(RuntimeError):
    """A recipe that cannot be built; the message names the recipe and the step."""


def load_recipes(path: str | Path = RECIPES) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return list(data["recipes"])


def _sdist(package: str, version: str, cache: Path) -> Path:
    """The sdist of ``package==version`` (downloaded once into ``cache``)."""
    dest = cache / f"{package}-{version}"
    dest.mkdir(parents=True, exist_ok=True)
    found = [p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip"))]
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", "-d", str(dest),
           f"{package}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = [p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip"))]
    if proc.returncode != 0 or not found:
        raise RecipeError(f"pip download of {package}=={version} failed: {(proc.stderr or proc.stdout)[-1500:]}")
    return found[0]


def _unpack(archive: Path, dest: Path) -> Path:
    """Extracts an sdist and returns its single top directory."""
    dest.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
    else:
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(dest, filter="data")
            except TypeError:
                tar.extractall(dest)
    tops = list(dest.iterdir())
    return tops[0] if len(tops) == 1 and tops[0].is_dir() else dest


def _drop(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        rel = path.relative_to(root).as_posix()
        if any(fnmatch.fnmatch(rel, pat) for pat in DROP):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink()


def _def_span(source: str, name: str, where: str) -> tuple[int, int]:
    """1-based first and last line of the top-level function/class ``name`` (decorators included)."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return start, node.end_lineno or node.lineno
    raise RecipeError(f"{where}: no top-level definition {name!r}")


def apply_selection(work: Path, fixed: Path, selection: dict[str, Any], where: str) -> None:
    """Brings one selection of the newer release into ``work``: a whole file (``{"file": P}``), or the named
    top-level definitions of it (``{"file": P, "defs": [...]}``), each replacing the base's definition of that name
    (or appended when the base has none)."""
    rel = selection["file"]
    src, dst = fixed / rel, work / rel
    if not src.is_file():
        raise RecipeError(f"{where}: {rel} is not in the newer release")
    defs = selection.get("defs")
    if not defs:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        return
    new_text = src.read_text(encoding="utf-8")
    new_lines = new_text.splitlines(keepends=True)
    text = dst.read_text(encoding="utf-8")
    for name in defs:
        fs, fe = _def_span(new_text, name, f"{where}: {rel} (newer)")
        lines = text.splitlines(keepends=True)
        try:
            s, e = _def_span(text, name, f"{where}: {rel} (base)")
            lines[s - 1 : e] = new_lines[fs - 1 : fe]
        except RecipeError:
            lines += ["\n\n", *new_lines[fs - 1 : fe]]
        text = "".join(lines)
    dst.write_text(text, encoding="utf-8")


def build_recipe(recipe: dict[str, Any], repos_dir: Path, sdists: Path, scratch: Path) -> dict[str, Any]:
    """Builds one recipe's repository under ``repos_dir``; returns its SWE-bench instance."""
    iid = recipe["instance_id"]
    base_src = _unpack(_sdist(recipe["package"], recipe["base_version"], sdists), scratch / "base")
    fixed_src = _unpack(_sdist(recipe["package"], recipe["fixed_version"], sdists), scratch / "fixed")
    _drop(base_src)
    _drop(fixed_src)
    repo_dir = repos_dir / recipe["repo"].replace("/", "__")
    if repo_dir.exists():
        shutil.rmtree(repo_dir)
    repo_dir.mkdir(parents=True)
    git("init", "-q", cwd=repo_dir)
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=repo_dir)
    shutil.copytree(base_src, repo_dir, dirs_exist_ok=True)
    base = commit_tree(repo_dir, f"{recipe['package']} {recipe['base_version']}")
    # The patches: selections on top of the base, diffed by git (then the work tree goes back to base).
    for sel in recipe["fix"]:
        apply_selection(repo_dir, fixed_src, sel, iid)
    git("add", "-A", cwd=repo_dir)
    gold = git("diff", "--cached", base, cwd=repo_dir)
    git("reset", "-q", "--hard", base, cwd=repo_dir)
    for sel in recipe["test"]:
        apply_selection(repo_dir, fixed_src, sel, iid)
    git("add", "-A", cwd=repo_dir)
    test_patch = git("diff", "--cached", base, cwd=repo_dir)
    git("reset", "-q", "--hard", base, cwd=repo_dir)
    if not gold.strip() or not test_patch.strip():
        raise RecipeError(f"{iid}: the fix or the test selection changes nothing between the releases")
    # The later history: the whole newer release, as an upstream clone would have it after base_commit.
    for p in list(repo_dir.iterdir()):
        if p.name != ".git":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    shutil.copytree(fixed_src, repo_dir, dirs_exist_ok=True)
    commit_tree(repo_dir, f"{recipe['package']} {recipe['fixed_version']}", parent=base)
    return {
        "instance_id": iid,
        "repo": recipe["repo"],
        "base_commit": base,
        "patch": gold,
        "test_patch": test_patch,
        "problem_statement": recipe["problem_statement"],
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": recipe["version"],
        "environment_setup_commit": base,
        # SWE-bench stores the test lists as JSON strings; so do we, to exercise that form.
        "FAIL_TO_PASS": json.dumps(recipe["FAIL_TO_PASS"]),
        "PASS_TO_PASS": json.dumps(recipe["PASS_TO_PASS"]),
    }


def build(out_dir: str | Path, recipes: list[dict[str, Any]] | None = None, *, cache_dir: str | Path | None = None,
          only: list[str] | None = None) -> Path:
    """Builds the instances of ``recipes`` (default: the shipped ones) into ``out_dir`` and returns it:
    ``instances.jsonl``, ``env_specs.yaml`` and ``repos/``. Reused as is when its stamp matches the recipes."""
    import yaml

    recipes = load_recipes() if recipes is None else recipes
    if only:
        unknown = sorted(set(only) - {r["instance_id"] for r in recipes})
        if unknown:
            raise RecipeError(f"unknown recipe id(s): {unknown}")
        recipes = [r for r in recipes if r["instance_id"] in only]
    out = Path(out_dir)
    stamp = hashlib.sha256(json.dumps(recipes, sort_keys=True).encode()).hexdigest()
    if (out / STAMP).is_file() and (out / STAMP).read_text().strip() == stamp:
        return out
    sdists = Path(cache_dir) if cache_dir else default_cache_dir() / "sdists"
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)
    instances, specs = [], {}
    with tempfile.TemporaryDirectory(prefix="agentrl-upstream-") as tmp:
        for i, recipe in enumerate(recipes):
            instances.append(build_recipe(recipe, out / "repos", sdists, Path(tmp) / str(i)))
            specs.setdefault(recipe["repo"], {})[recipe["version"]] = recipe["env_spec"]
    (out / "instances.jsonl").write_text("".join(json.dumps(i) + "\n" for i in instances))
    (out / "env_specs.yaml").write_text(yaml.safe_dump(specs, sort_keys=True))
    (out / STAMP).write_text(stamp + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agentrl.envs.swe.upstream", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--recipes", default=str(RECIPES))
    ap.add_argument("--only", nargs="*", default=None, help="build only these instance ids")
    args = ap.parse_args(argv)
    try:
        out = build(args.out_dir, load_recipes(args.recipes), only=args.only)
    except (RecipeError, OSError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{out}/instances.jsonl, {out}/env_specs.yaml, {out}/repos")
    return 0


if __name__ == "__main__":
    sys.exit(main())
