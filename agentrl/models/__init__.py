"""agentrl.models: the tiny Qwen2-architecture model (with its tokenizer and chat template) built offline for CPU
tests, benchmarks and demos. Real checkpoints (e.g. Qwen2.5/Qwen3 instruct) need nothing from here: they load by path.
"""

from agentrl.models.chat_template import CHAT_TEMPLATE
from agentrl.models.tiny import (
    ADDED_TOKENS,
    BUILDER_VERSION,
    SPECIAL_TOKENS,
    VARIANTS,
    ModelVariant,
    TinyModelSpec,
    build_tiny_model,
    default_model_dir,
    ensure_tiny_model,
    read_marker,
    train_tokenizer,
)

__all__ = [
    "ADDED_TOKENS", "BUILDER_VERSION", "CHAT_TEMPLATE", "SPECIAL_TOKENS", "ModelVariant", "TinyModelSpec", "VARIANTS", "build_tiny_model",
    "default_model_dir", "ensure_tiny_model", "read_marker", "train_tokenizer",
]
