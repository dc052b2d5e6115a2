"""Builds the tiny Qwen2-architecture models the CPU tests, benchmarks and demos run on, from nothing and offline.

The result is an ordinary Hugging Face model directory (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``, ``generation_config.json``) that vLLM,
``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` and the trainer load by path. Weights are a seeded random
init, so the same arguments give the same files on the same library versions.

Named variants (:data:`VARIANTS`, the names ``engine.model`` accepts): ``tiny`` (the tests' and the quickstart's
model, ``~/.cache/agentrl/tiny-model``), ``tiny-tool`` (the tool-use demo's: wider and deeper, with a tokenizer
that also learned whole ``agentrl/ToolLookup-v0`` episodes; ``~/.cache/agentrl/tiny-tool-model``) and ``tiny-64k``
(tiny with 65,536 positions, for harness-sized prompts). Each variant has
its own directory, spec and corpus; building one never touches another's directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

# Bump when the builder's output changes; ensure_tiny_model rebuilds a directory built by another version.
BUILDER_VERSION = 1
MARKER = "agentrl_tiny.json"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added (non-special) tokens: single ids the model can emit, kept in decoded text (like Qwen2.5's).
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen2's pre-tokenizer split: single digits, letters with an optional leading non-letter, punctuation runs.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture and tokenizer size. head_dim = hidden_size / num_attention_heads must be 64 or more on vLLM's
    CPU attention (16 is rejected)."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    initializer_range: float = 0.05
    dtype: str = "float32"
    seed: int = 0

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}")
        if self.hidden_size // self.num_attention_heads < 64:
            raise ValueError("head_dim (hidden_size / num_attention_heads) must be >= 64 for vLLM's CPU attention")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS):
            raise ValueError(f"vocab_size must cover the 256 byte symbols and the special tokens, got {self.vocab_size}")


@dataclass(frozen=True)
class ModelVariant:
    """A named tiny model: its ``spec`` (the seed is the build's), its cache directory ``dir_name`` under
    ``~/.cache/agentrl`` (``$<env_var>`` overrides it), and its tokenizer corpus: the shared corpus without the reset
    observations of ``skip_envs``, plus ``episodes_per_env`` whole rendered episodes of each of ``episode_envs``."""

    spec: TinyModelSpec
    dir_name: str
    env_var: str
    skip_envs: tuple[str, ...] = ()
    episode_envs: tuple[str, ...] = ()
    episodes_per_env: int = 0


VARIANTS: dict[str, ModelVariant] = {
    # Its tokenizer was fixed before ToolLookup-v0 existed: that env's texts stay out, so fresh builds keep the
    # same merges (and the quickstart's figures stay comparable).
    "tiny": ModelVariant(TinyModelSpec(), "tiny-model", "AGENTRL_TINY_MODEL", skip_envs=("agentrl/ToolLookup-v0",)),
    # The tool-use demo's model (configs/tooluse.yaml): twice as wide as tiny (4 heads of 64: vLLM's CPU attention
    # needs head_dim >= 64), 2 layers (copying a name or a number from earlier turns needs an induction pair), 1.4M
    # parameters; the corpus holds whole ToolLookup episodes, so its words and tool-call JSON are fewer tokens.
    "tiny-tool": ModelVariant(
        TinyModelSpec(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2),
        "tiny-tool-model", "AGENTRL_TINY_TOOL_MODEL",
        episode_envs=("agentrl/ToolLookup-v0",), episodes_per_env=2000),
    # tiny with 64k positions, for harness-sized prompts (30-70k characters with 9-14 tool schemas): RoPE needs no
    # new weights, so only the declared range differs (engine.max_model_len up to 65,536).
    "tiny-64k": ModelVariant(TinyModelSpec(max_position_embeddings=65536), "tiny-64k-model", "AGENTRL_TINY_64K_MODEL",
                             skip_envs=("agentrl/ToolLookup-v0",)),
}


def _variant(name: str) -> ModelVariant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown tiny model variant {name!r}; choose one of {sorted(VARIANTS)}") from None


def default_model_dir(variant: str = "tiny") -> Path:
    """The variant's directory: ``$AGENTRL_TINY_MODEL`` (``$AGENTRL_TINY_TOOL_MODEL``, ...) if set, else
    ``~/.cache/agentrl/tiny-model`` (``tiny-tool-model``, ...)."""
    v = _variant(variant)
    env = os.environ.get(v.env_var)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agentrl" / v.dir_name


def train_tokenizer(texts: list[str], vocab_size: int):
    """Returns a ``transformers.PreTrainedTokenizerFast``: byte-level BPE (any text encodes), ``vocab_size`` ids in
    total, eos ``<|im_end|>``, pad ``<|endoftext|>``, no BOS, and the chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from agentrl.models.chat_template import CHAT_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_tiny_model(out_dir: str | os.PathLike | None = None, *, seed: int = 0, spec: TinyModelSpec | None = None,
                     include_envs: bool = True, variant: str = "tiny") -> Path:
    """Builds the model ``variant`` (its spec unless ``spec`` is given) into ``out_dir`` (default
    :func:`default_model_dir` of the variant), replacing what is there, and returns the directory. Writes into a
    temporary sibling first and renames, so readers never see a half-written model. ``include_envs=False`` leaves
    all env texts out of the tokenizer corpus."""
    v = _variant(variant)
    spec = spec or dataclasses.replace(v.spec, seed=seed)
    spec.validate()
    out = Path(out_dir).expanduser() if out_dir is not None else default_model_dir(variant)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    try:
        _build_into(tmp, spec, include_envs, variant)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build_into(path: Path, spec: TinyModelSpec, include_envs: bool, variant: str) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from agentrl.models.corpus import episode_texts, generate_corpus

    v = _variant(variant)
    texts = generate_corpus(seed=spec.seed, include_envs=include_envs, skip_envs=v.skip_envs)
    if include_envs:
        for env_id in v.episode_envs:
            texts.extend(episode_texts(env_id, v.episodes_per_env, seed=spec.seed))
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    if len(tokenizer) != spec.vocab_size:
        # BPE stops early when the corpus has no more pairs of min_frequency; the embedding still has vocab_size rows.
        assert len(tokenizer) <= spec.vocab_size, (len(tokenizer), spec.vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
    )
    torch.manual_seed(spec.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
    model = model.to(getattr(torch, spec.dtype))
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    n_params = sum(p.numel() for p in model.parameters())
    marker = {"builder_version": BUILDER_VERSION, "spec": asdict(spec), "parameters": n_params,
              "tokenizer_size": len(tokenizer), "corpus_texts": len(texts)}
    if variant != "tiny":  # the default's marker stays as it was
        marker["variant"] = variant
    (path / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    os.chmod(path, 0o755)  # mkdtemp makes it 0700; the cache is shared by processes of other users in CI images
    for f in path.iterdir():
        os.chmod(f, 0o644)


def read_marker(model_dir: str | os.PathLike) -> dict | None:
    """The builder's record in ``model_dir`` (version, spec, sizes), or None for a directory it did not build."""
    try:
        return json.loads((Path(model_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def ensure_tiny_model(out_dir: str | os.PathLike | None = None, *, seed: int = 0, variant: str = "tiny") -> Path:
    """Returns a directory holding the tiny model ``variant``, building it only if missing or built by another
    builder version, seed, spec or variant. Safe when several processes call it at once (an exclusive file lock
    next to the directory)."""
    v = _variant(variant)
    out = Path(out_dir).expanduser() if out_dir is not None else default_model_dir(variant)
    want = asdict(dataclasses.replace(v.spec, seed=seed))

    def fresh() -> bool:
        m = read_marker(out)
        return bool(m and m.get("builder_version") == BUILDER_VERSION and m.get("spec") == want
                    and m.get("variant", "tiny") == variant and (out / "config.json").exists())

    if fresh():
        return out
    with _file_lock(out.parent / f".{out.name}.lock"):
        if not fresh():
            build_tiny_model(out, seed=seed, variant=variant)
    return out
