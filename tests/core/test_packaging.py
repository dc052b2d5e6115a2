"""The package list in pyproject.toml is explicit (envs/ and sandboxes/ install under agentrl.*); a package directory
missing from it would be silently left out of wheels."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"agentrl": ROOT / "agentrl", "agentrl.envs": ROOT / "envs", "agentrl.sandboxes": ROOT / "sandboxes"}


def test_every_package_dir_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for name, base in ROOTS.items():
        # A package is a directory with __init__.py whose parents up to the root are packages too; Python
        # files deeper down (e.g. repositories shipped as data) are not packages.
        stack = [base]
        while stack:
            d = stack.pop()
            found.add(".".join([name, *d.relative_to(base).parts]))
            stack += [c for c in d.iterdir() if c.is_dir() and (c / "__init__.py").exists()]
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "listed packages with no directory"


def test_version_flag():
    import agentrl

    p = subprocess.run([sys.executable, "-m", "agentrl.cli", "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == f"agentrl {agentrl.__version__}"
