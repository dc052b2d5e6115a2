"""The tiny model builder: deterministic files, a byte-level tokenizer with the chat markup as single tokens, a
prefix-stable Qwen2.5-style chat template, loading by path with transformers, and safe concurrent building."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.cli import main as cli_main
from agentrl.models import (
    BUILDER_VERSION,
    build_tiny_model,
    ensure_tiny_model,
    read_marker,
)
from agentrl.tools import format_tool_call, parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluates arithmetic.",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]

CONVERSATION = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "Let me compute.",
     "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12 + 30"}}}]},
    {"role": "tool", "content": "42"},
    {"role": "tool", "content": "(cached)"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calculator", "arguments": '{"expression": "42 - 0"}'}}]},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "\\boxed{42}"},
    {"role": "user", "content": "Correct."},
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_build_is_deterministic_and_cli_builds(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=0, include_envs=False)
    assert cli_main(["models", "build", "--out", str(tmp_path / "b")]) == 0
    b = tmp_path / "b"
    # The CLI build includes env texts when envs are registered; the weights' shapes and init do not depend on it.
    wa = (a / "model.safetensors").read_bytes()
    c = build_tiny_model(tmp_path / "c", seed=0, include_envs=False)
    assert wa == (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (c / "tokenizer.json").read_text()
    d = build_tiny_model(tmp_path / "d", seed=1, include_envs=False)
    assert wa != (d / "model.safetensors").read_bytes()
    for p in (a, b):
        cfg = json.loads((p / "config.json").read_text())
        assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is True
        assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # vLLM CPU attention rejects 16
        assert read_marker(p)["builder_version"] == BUILDER_VERSION
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".") and not x.name.endswith(".lock")]  # no temp dirs


def test_tokenizer_special_tokens_and_byte_level(tok):
    assert len(tok) == 1024
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1, t
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)  # no BOS
    text = "Grid 3x3: ▲ ünïcødé 😀 \t\n  \\boxed{1234}"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert len(tok.encode("1234", add_special_tokens=False)) == 4  # digits split one by one, like Qwen2
    call = format_tool_call("calculator", {"expression": "3 * 4"})
    ids = tok.encode(call, add_special_tokens=False)
    # tool-call tags survive skip_special_tokens (they are added tokens, not special) and parse back
    assert parse_tool_calls(tok.decode(ids, skip_special_tokens=True)).calls[0].arguments == {"expression": "3 * 4"}


def test_chat_template_exact_rendering(tok):
    text = _render(tok, CONVERSATION[:4], tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou are an agent.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in text
    assert text.endswith(
        "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
        "<|im_start|>assistant\nLet me compute.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "12 + 30"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    )
    # The assistant tool-call rendering equals what agentrl.tools.format_tool_call writes (the env parses it).
    assert format_tool_call("calculator", {"expression": "12 + 30"}) in text
    plain = _render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # no default system prompt
    # String arguments (OpenAI style) are not double-encoded; content given as parts is joined.
    second = _render(tok, CONVERSATION[5:6])
    assert second == '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "42 - 0"}}\n</tool_call><|im_end|>\n'
    parts = _render(tok, [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert parts == "<|im_start|>user\nab<|im_end|>\n"


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_chat_template_is_prefix_stable(tok, tools):
    """render(messages[:k]) is a prefix of render(messages[:k+1]), as text and as token ids, and the generation
    prompt is exactly "<|im_start|>assistant\\n" appended -- the agent loop's diffs rely on both."""
    for k in range(1, len(CONVERSATION)):
        shorter, longer = _render(tok, CONVERSATION[:k], tools=tools), _render(tok, CONVERSATION[: k + 1], tools=tools)
        assert longer.startswith(shorter), k
        ids_s = tok.apply_chat_template(CONVERSATION[:k], tools=tools, tokenize=True, return_dict=False)
        ids_l = tok.apply_chat_template(CONVERSATION[: k + 1], tools=tools, tokenize=True, return_dict=False)
        assert ids_l[: len(ids_s)] == ids_s, k
        gen = _render(tok, CONVERSATION[:k], tools=tools, add_generation_prompt=True)
        assert gen == shorter + "<|im_start|>assistant\n"


def test_transformers_loads_and_runs(tiny_model_dir, tok):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert model.dtype == torch.float32
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    ids = torch.tensor([tok.apply_chat_template(CONVERSATION[:2], tokenize=True, return_dict=False)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 1024) and torch.isfinite(logits).all()


def _ensure(path: str, q) -> None:
    q.put(str(ensure_tiny_model(path)))


def test_ensure_is_safe_concurrently_and_rebuilds_stale(tmp_path):
    target = tmp_path / "m"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_ensure, args=(str(target), q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert {q.get(timeout=5), q.get(timeout=5)} == {str(target)}
    assert read_marker(target)["builder_version"] == BUILDER_VERSION
    assert sorted(x.name for x in tmp_path.iterdir()) == [".m.lock", "m"]
    first = (target / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(target) == target and (target / "model.safetensors").stat().st_mtime_ns == first
    marker = read_marker(target)
    marker["builder_version"] = -1
    (target / "agentrl_tiny.json").write_text(json.dumps(marker))
    ensure_tiny_model(target)
    assert read_marker(target)["builder_version"] == BUILDER_VERSION


def test_tool_variant_is_its_own_model_with_a_tokenizer_for_its_env(tmp_path, tok, monkeypatch):
    """The tool-use demo's variant: bigger, in its own directory, a tokenizer that learned ToolLookup episodes
    (its calls are a few tokens), never mistaken for the default model by ensure_tiny_model."""
    from agentrl.models import VARIANTS, default_model_dir
    from agentrl.models.corpus import generate_corpus

    path = ensure_tiny_model(variant="tiny-tool")  # the shared cache, as configs/tooluse.yaml builds it
    assert path == default_model_dir("tiny-tool") != default_model_dir("tiny")
    marker = read_marker(path)
    assert marker["variant"] == "tiny-tool" and marker["parameters"] > 2 * read_marker(ensure_tiny_model())["parameters"]
    cfg = json.loads((path / "config.json").read_text())
    spec = VARIANTS["tiny-tool"].spec
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (spec.hidden_size, spec.num_hidden_layers)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    tool_tok = AutoTokenizer.from_pretrained(str(path))
    call = format_tool_call("lookup", {"name": "Ann"})
    assert len(tool_tok.encode(call)) < len(tok.encode(call))
    # Same seed, other variant: the default directory's marker does not satisfy the variant (and vice versa).
    import agentrl.models.tiny as tiny

    built = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda out, seed, variant: built.append((Path(out).name, variant)))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "agentrl_tiny.json").write_text(json.dumps(read_marker(ensure_tiny_model())))
    (tmp_path / "m" / "config.json").write_text("{}")
    tiny.ensure_tiny_model(tmp_path / "m", variant="tiny-tool")
    tiny.ensure_tiny_model(tmp_path / "m")
    assert built == [("m", "tiny-tool")]
    with pytest.raises(ValueError, match="unknown tiny model variant 'huge'"):
        default_model_dir("huge")
    # The default model's corpus leaves ToolLookup out: its tokenizer (and the quickstart's figures) stay as before.
    assert not any("How old will" in t or "How old was" in t for t in generate_corpus(skip_envs=VARIANTS["tiny"].skip_envs))
    assert cli_main(["models", "build", "--variant", "huge"]) == 2


@pytest.mark.engine
async def test_the_64k_variant_serves_prompts_past_the_old_4096_positions(tok):
    """Harness-sized prompts on the CPU: tiny-64k declares 65,536 positions, and vLLM serves a prompt twice as long as
    the 4,096 tiny declares, every sampled token with a finite log-prob. Its tokenizer is tiny's."""
    import math

    from agentrl.inference import EngineConfig, SamplingParams
    from agentrl.inference.vllm_engine import VLLMEngine
    from agentrl.models import ensure_tiny_model, read_marker

    path = ensure_tiny_model(variant="tiny-64k")  # the shared cache, as the harness CLI tests use it
    assert read_marker(path)["spec"]["max_position_embeddings"] == 65536
    assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == 65536
    prompt = tok("lookup calculator answer " * 3000, add_special_tokens=False)["input_ids"][:8192]
    assert len(prompt) == 8192
    eng = await VLLMEngine.create(EngineConfig(model=str(path), max_model_len=16384, seed=0, executor="in_core"))
    try:
        gen = await eng.generate(prompt, SamplingParams(max_tokens=4, ignore_eos=True), request_id="long")
    finally:
        await eng.close()
    assert len(gen.token_ids) == 4 and all(math.isfinite(x) for x in gen.logprobs)
