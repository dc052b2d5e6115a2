"""GEM (``gem-llm``) envs as agentrl envs, run in GEM's own venv: ``agentrl.make("gem/game:GuessTheNumber-v0-easy")``.

gem-llm pins an older reasoning-gym and Python <= 3.12, which cannot share agentrl's venv. So GEM runs out of
process (:mod:`agentrl.envs.bridges.outproc_env`): :func:`setup_gem_venv` makes a venv of its own under
``~/.cache/agentrl/venvs/gem`` (``$AGENTRL_GEM_VENV`` overrides) with ``gem-llm`` installed from the package index,
once; each env is a host process there running ``gem.make(<id>)`` unchanged. GEM's observations are strings (one
user message each) and its actions are the model's text (``\\boxed{...}`` for its games).

Setup: ``python -m agentrl.envs.bridges.gem_env setup`` (or :func:`setup_gem_venv`); until then, making a ``gem/``
env fails with an error that says so. GEM's games and procedural tasks run offline; its dataset envs (``math:``,
``qa:``, ``code:``) download at reset and fail here with the host's error.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrl.envs.bridges.outproc_env import HostedEnv

GEM_REQUIREMENT = "gem-llm==0.1.0"


def venv_dir() -> Path:
    return Path(os.environ.get("AGENTRL_GEM_VENV") or Path.home() / ".cache" / "agentrl" / "venvs" / "gem")


def gem_python() -> Path:
    """The GEM venv's interpreter; raises ImportError (with the setup command) when the venv is not ready."""
    python = venv_dir() / "bin" / "python"
    if not (venv_dir() / "agentrl-ready").exists() or not python.exists():
        raise ImportError(f"GEM's venv is not set up at {venv_dir()}: run `python -m agentrl.envs.bridges.gem_env "
                          "setup` (it installs gem-llm there from the package index)")
    return python


def setup_gem_venv(base_python: str = "python3.11", quiet: bool = True) -> Path:
    """Creates GEM's venv (``base_python -m venv``) and installs :data:`GEM_REQUIREMENT` in it, then checks that
    ``gem`` imports; does nothing when it is ready already. Returns the venv's interpreter."""
    root = venv_dir()
    ready = root / "agentrl-ready"
    if ready.exists() and ready.read_text().strip() == GEM_REQUIREMENT:
        return root / "bin" / "python"
    ready.unlink(missing_ok=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([base_python, "-m", "venv", str(root)], check=True)
    python = root / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", *(["-q"] if quiet else []), GEM_REQUIREMENT], check=True)
    subprocess.run([str(python), "-c", "import gem"], check=True)
    ready.write_text(GEM_REQUIREMENT + "\n")
    return python


@functools.lru_cache(maxsize=1)
def env_names() -> list[str]:
    """GEM's registered env ids (asked of the GEM venv once per process): the ``gem/<id>`` names."""
    python = gem_python()
    code = "import json, gem.envs.registration as r; print(json.dumps(sorted(r.ENV_REGISTRY)))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise ImportError(f"GEM's venv at {venv_dir()} cannot list its envs: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class GEMEnv(HostedEnv):
    """One GEM env in GEM's venv (see the module docstring). kwargs: ``env`` (GEM's id, set by the agentrl id),
    ``python`` (another interpreter with gem installed; default: the set-up venv's), ``launcher`` and the host's
    timeouts (see :class:`HostedEnv`), and GEM's
    own kwargs (passed to ``gem.make``)."""

    description = "GEM env, run unchanged in GEM's own venv (out of process)"

    def __init__(self, env: str, python: str | None = None, launcher: list[str] | None = None,
                 start_timeout_s: float = 120.0, call_timeout_s: float = 60.0, **gem_kwargs: Any):
        super().__init__(python=str(python or gem_python()), factory="gem:make",
                         kwargs={"env_id": env, **gem_kwargs}, launcher=launcher,
                         start_timeout_s=start_timeout_s, call_timeout_s=call_timeout_s)
        self.gem_id = env

    def sample_random_action(self) -> str:
        """GEM's own random action for the current state (its ``sample_random_action``)."""
        return str(self.call("sample_random_action"))


if __name__ == "__main__":
    if sys.argv[1:] != ["setup"]:
        sys.exit("usage: python -m agentrl.envs.bridges.gem_env setup")
    print(setup_gem_venv(quiet=False))
