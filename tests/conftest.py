"""Session fixtures shared across the suite: the tiny model (built once into a cache directory) and ONE real vLLM
engine shared by every test in the session (starting one costs 20-40 s on the CPU); and two for the child-watcher
tests (``default_watcher``, ``started_threads``).

- ``tiny_model_dir``: ``$AGENTRL_TINY_MODEL`` or ``~/.cache/agentrl/tiny-model``; built if missing or stale.
- ``engine``: a :class:`agentrl.inference.vllm_engine.VLLMEngine` on that model (max_model_len 2048, pause mode
  "abort", executor "in_core": it starts ~25 s sooner). It runs on its own event-loop thread, so any test's event loop can use it. Tests that change its
  weights must restore them (see test_weight_sync.py) and must use versions above ``engine.version``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from agentrl.models import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path):
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.vllm_engine import VLLMEngine

    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=2048, pause_mode="abort", seed=0,
                                   executor="in_core"))
    try:
        yield eng
    finally:
        eng.close_sync()


# --- SWE fixtures (tests/envs/swe and tests/eval): real upstream instances and the sandbox engines ---

@pytest.fixture(scope="session")
def upstream() -> Path:
    """``instances.jsonl``, ``env_specs.yaml`` and ``repos/`` of the shipped upstream recipes (jinja2 3.1.3->3.1.4,
    more-itertools 10.3.0->10.4.0), as a user would bring SWE-bench instances."""
    from agentrl.envs.swe.repos import default_cache_dir
    from agentrl.envs.swe.upstream import build

    return build(default_cache_dir() / "upstream")


@pytest.fixture(scope="session")
def docker_ready() -> None:
    from agentrl.sandboxes.docker import docker_available, docker_client

    ok, why = docker_available()
    assert ok, f"docker is required for the SWE tests: {why}"
    try:
        docker_client().images.get("agentrl-base:latest")
    except Exception as e:
        pytest.fail(f"image agentrl-base:latest missing (run `agentrl sandboxes build-image`): {e}")


@pytest.fixture(scope="session")
def bwrap_ready() -> None:
    from agentrl.sandboxes import bwrap_available, rootfs_path

    ok, why = bwrap_available()
    assert ok, f"bubblewrap is required: {why}"
    assert rootfs_path("agentrl-base:latest").is_dir(), "run `agentrl sandboxes build-image base` (the bwrap rootfs)"


# Runs swebench's own loaders on our files, in a subprocess: swebench.harness imports its harness's dependencies
# (datasets, modal, dotenv...), which agentrl does not install, so they are stubbed there, in that process only;
# the functions called never use them for local .jsonl files.
_SWEBENCH_CHECK = r'''
import importlib.abc, importlib.machinery, json, sys, types
from unittest import mock

class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return mock.MagicMock(name=f"{self.__name__}.{name}")

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    roots = {"datasets", "dotenv", "modal", "tenacity", "ghapi", "git", "bs4"}
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = _Stub(spec.name)
        m.__path__ = []
        return m
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _Finder())
from swebench.harness.run_evaluation import get_dataset_from_preds
from swebench.harness.utils import get_predictions_from_file, load_swebench_dataset
from swebench.types import SWEbenchInstance

# the prediction keys swebench's harness reads (grading.get_eval_report, run_evaluation)
KEY_INSTANCE_ID, KEY_MODEL, KEY_PREDICTION = "instance_id", "model_name_or_path", "model_patch"

preds_path, dataset_path = sys.argv[1:3]
preds = get_predictions_from_file(preds_path, dataset_path, "test")
dataset = load_swebench_dataset(dataset_path, "test")
by_id = {p[KEY_INSTANCE_ID]: p for p in preds}
to_run = get_dataset_from_preds(dataset_path, "test", None, by_id, "agentrl-check", False, exclude_completed=False)
missing = sorted({k for d in dataset for k in SWEbenchInstance.__annotations__ if k not in d})
print(json.dumps({"preds": preds, "keys": [KEY_INSTANCE_ID, KEY_MODEL, KEY_PREDICTION], "missing_fields": missing,
                  "dataset": [d["instance_id"] for d in dataset], "to_run": [d["instance_id"] for d in to_run]}))
'''


@pytest.fixture(scope="session")
def swebench_check():
    """``check(predictions_path, dataset_path) -> dict``: loads predictions.jsonl and the instances with the official
    swebench loaders (``get_predictions_from_file``, ``load_swebench_dataset``, ``get_dataset_from_preds``, which
    raises for predictions of unknown instances) and checks each prediction has exactly swebench's three keys."""
    import json
    import subprocess
    import sys

    def check(preds_path, dataset_path) -> dict:
        r = subprocess.run([sys.executable, "-c", _SWEBENCH_CHECK, str(preds_path), str(dataset_path)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        for p in out["preds"]:
            assert sorted(p) == sorted(out["keys"]), p
            assert isinstance(p[out["keys"][2]], str)
        return out

    return check


@pytest.fixture
def default_watcher(monkeypatch):
    """The process as Python 3.11 starts it: asyncio's default (threaded) child watcher, agentrl.childwatch not yet
    installed; put back afterwards."""
    from agentrl import childwatch

    policy = asyncio.get_event_loop_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        monkeypatch.setattr(policy, "_watcher", asyncio.ThreadedChildWatcher())
    monkeypatch.setattr(childwatch, "_done", False)
    return policy


@pytest.fixture
def started_threads(monkeypatch) -> list[str]:
    """The names of the threads started during the test."""
    names: list[str] = []
    start = threading.Thread.start

    def recording(self, *a, **kw):
        names.append(self.name)
        return start(self, *a, **kw)

    monkeypatch.setattr(threading.Thread, "start", recording)
    return names
