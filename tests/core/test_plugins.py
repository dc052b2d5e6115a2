"""Third-party envs arrive through the `agentrl.envs` entry-point group, with no code in agentrl naming them."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).parent / "plugin_pkg"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """Installs the demo plugin package (a real pip install, with its entry-point metadata) into a fresh dir."""
    target = tmp_path_factory.mktemp("site")
    src = tmp_path_factory.mktemp("src") / "plugin_pkg"
    shutil.copytree(PLUGIN, src)  # setuptools builds in the source tree: keep the checkout clean
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(src)],
        check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert list(target.glob("agentrl_demo_plugin-*.dist-info/entry_points.txt"))
    return target


def run_py(code: str, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_installed_plugin_registers_on_import(plugin_site):
    code = (
        "import agentrl, gymnasium\n"
        "assert 'demo/Echo-v0' in agentrl.registered_ids(), agentrl.registered_ids()\n"
        "env = agentrl.make('demo/Echo-v0')\n"
        "obs, _ = env.reset(seed=1)\n"
        "word = obs[0]['content'].split()[1].rstrip('.')\n"
        "_, r, term, trunc, _ = env.step(word)\n"
        "assert (r, term) == (1.0, True)\n"
        "assert gymnasium.make('demo/Echo-v0') is not None\n"
        "print('ok')\n"
    )
    p = run_py(code, plugin_site)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"


def test_plugin_absent_without_install():
    p = run_py("import agentrl; print('demo/Echo-v0' in agentrl.registered_ids())", Path("/nonexistent"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_broken_plugin_warns_but_agentrl_imports(tmp_path):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentrl.envs]\nbroken = no_such_module_xyz:register\n")
    p = run_py("import warnings\nwarnings.simplefilter('always')\nimport agentrl\nprint('imported')", tmp_path)
    assert p.returncode == 0, p.stderr
    assert "imported" in p.stdout
    assert "broken" in p.stderr and "failed to load" in p.stderr
