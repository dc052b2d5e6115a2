"""Session fixtures for the rollout tests: the tiny model (built once into a cache directory) and ONE real vLLM
engine shared by every test in the session (starting one costs 20-40 s on the CPU).

- ``tiny_model_dir``: ``$AGENTRL_TINY_MODEL`` or ``~/.cache/agentrl/tiny-model``; built if missing or stale.
- ``engine``: a :class:`agentrl.inference.vllm_engine.VLLMEngine` on that model (max_model_len 2048, pause mode
  "abort"). It runs on its own event-loop thread, so any test's event loop can use it. Tests that change its
  weights must restore them (see test_weight_sync.py) and must use versions above ``engine.version``.
"""

from __future__ import annotations

import os
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

    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=2048, pause_mode="abort", seed=0))
    try:
        yield eng
    finally:
        eng.close_sync()
