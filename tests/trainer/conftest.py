"""Fixtures for the trainer tests: a tiny random Qwen2 causal LM saved with ``save_pretrained``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

VOCAB = 64


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True,
    )
    torch.manual_seed(1234)
    model = Qwen2ForCausalLM(cfg)
    d = tmp_path_factory.mktemp("tiny_qwen2")
    model.save_pretrained(str(d))
    # A stand-in tokenizer file: checkpoints must carry the source directory's non-weight files along.
    (d / "tokenizer_config.json").write_text(json.dumps({"marker": "tiny"}))
    return d
