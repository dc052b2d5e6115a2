"""Weight updates on the real engine: new weights really serve (log-probs match transformers on the perturbed
model), versions on tokens across an update in both pause modes, bad state dicts rejected before pausing.

Every test leaves the shared ``engine`` with the original weights (restored in ``finally``) and uses versions
above ``engine.version``."""

from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.base import SamplingParams
from agentrl.testing.engine_probe import TokenProbe

pytestmark = pytest.mark.engine

TOL = 1e-4  # float32 engine vs float32 transformers; measured max difference ~1e-6


@pytest.fixture(scope="module")
def original(tiny_model_dir):
    return load_file(str(tiny_model_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _hf_logprobs(model_dir, state_dict, seq):
    """Transformers' log p(seq[i+1] | seq[:i+1]) under ``state_dict`` (the trainer's view)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1)
    return [logp[i, seq[i + 1]].item() for i in range(len(seq) - 1)]


def _perturbed(original, seed=1, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in original.items()}


async def test_loaded_weights_serve_and_match_transformers(engine, tiny_model_dir, original, tok):
    seq = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 17 * 3."}, {"role": "assistant", "content": "17 * 3 = 51. \\boxed{51}"}],
        tokenize=True, return_dict=False)
    old_engine = await engine.prompt_logprobs(seq)
    old_hf = _hf_logprobs(tiny_model_dir, original, seq)
    assert max(abs(a - b) for a, b in zip(old_engine, old_hf)) < TOL

    new_sd = _perturbed(original)
    # The trainer hands over its own state dict: it includes the tied lm_head.weight, in float32.
    new_sd_with_head = dict(new_sd, **{"lm_head.weight": new_sd["model.embed_tokens.weight"]})
    digest0 = await engine.weights_digest()
    v = engine.version + 1
    try:
        await engine.update_weights(new_sd_with_head, v)
        assert engine.version == v
        assert await engine.weights_digest() != digest0
        new_engine = await engine.prompt_logprobs(seq)
        new_hf = _hf_logprobs(tiny_model_dir, new_sd, seq)
        assert max(abs(a - b) for a, b in zip(new_engine, new_hf)) < TOL
        assert max(abs(a - b) for a, b in zip(new_engine, old_engine)) > 0.1  # really different weights
        gen = await engine.generate(seq, SamplingParams(max_tokens=4, ignore_eos=True), request_id="ws-after")
        assert gen.versions == [v] * 4
    finally:
        await engine.update_weights(original, engine.version + 1)
    assert await engine.weights_digest() == digest0
    assert max(abs(a - b) for a, b in zip(await engine.prompt_logprobs(seq), old_engine)) < TOL


async def test_abort_mode_returns_partial_tokens_with_old_version(engine, original, tok):
    prompt = tok.apply_chat_template([{"role": "user", "content": "Count."}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False)
    v_old = engine.version
    with TokenProbe(engine, "ws-abort") as probe:
        task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=1500, ignore_eos=True),
                                                   request_id="ws-abort"))
        await probe.wait()  # some tokens in, far from 1500
    await engine.update_weights(_perturbed(original, seed=2), v_old + 1, pause_mode="abort")
    try:
        gen = await asyncio.wait_for(task, 60)
        assert gen.finish_reason == "abort"
        assert 0 < len(gen.token_ids) < 1500
        assert gen.versions == [v_old] * len(gen.token_ids)
        # The agent loop resubmits prompt + partial tokens: the continuation carries the new version.
        cont = await engine.generate(prompt + gen.token_ids, SamplingParams(max_tokens=5, ignore_eos=True), request_id="ws-abort")
        assert cont.versions == [v_old + 1] * 5
    finally:
        await engine.update_weights(original, engine.version + 1)


async def test_keep_mode_request_spans_the_update(engine, original, tok):
    prompt = tok.apply_chat_template([{"role": "user", "content": "Count."}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False)
    v_old = engine.version
    n = 1200
    with TokenProbe(engine, "ws-keep") as probe:
        task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=n, ignore_eos=True),
                                                   request_id="ws-keep"))
        await probe.wait()  # some tokens of the old version in, far from n
    assert not task.done()
    await engine.update_weights(_perturbed(original, seed=3), v_old + 1, pause_mode="keep")
    try:
        gen = await asyncio.wait_for(task, 120)
        assert gen.finish_reason == "length" and len(gen.token_ids) == n
        k = gen.versions.index(v_old + 1)
        assert k > 0
        assert gen.versions == [v_old] * k + [v_old + 1] * (n - k)
    finally:
        await engine.update_weights(original, engine.version + 1)


async def test_bad_state_dict_is_rejected_before_pausing(engine, original, tok):
    v = engine.version
    bad_shape = dict(original, **{"model.norm.weight": torch.ones(7)})
    with pytest.raises(ValueError, match="model.norm.weight"):
        await engine.update_weights(bad_shape, v + 1)
    with pytest.raises(ValueError, match="unknown tensors"):
        await engine.update_weights(dict(original, **{"model.extra.weight": torch.ones(2)}), v + 1)
    with pytest.raises(ValueError, match="missing tensors"):
        await engine.update_weights({k: t for k, t in original.items() if "layers.1." not in k}, v + 1)
    with pytest.raises(TypeError):
        await engine.update_weights(original, "7")  # type: ignore[arg-type]
    assert engine.version == v
    gen = await engine.generate([1, 286, 201], SamplingParams(max_tokens=3, ignore_eos=True), request_id="ws-bad")
    assert gen.versions == [v] * 3


def test_reload_warnings_of_layers_a_state_dict_never_holds_are_dropped_others_kept(caplog):
    """vLLM warns "<Layer>: Failed to load weights" on every reload for the rotary embedding and a tied LM head
    (twice per training step); those are expected and dropped, a real layer's warning still shows."""
    import logging

    from agentrl.inference.vllm_worker import _RELOAD_LOGGER, quiet_expected_reload_warnings

    quiet_expected_reload_warnings(tied_lm_head=True)
    log = logging.getLogger(_RELOAD_LOGGER)
    with caplog.at_level(logging.WARNING, logger=_RELOAD_LOGGER):
        for layer in ("RotaryEmbedding", "ParallelLMHead", "QKVParallelLinear"):
            log.warning("%s: Failed to load weights", layer)
    assert [r.getMessage() for r in caplog.records if r.name == _RELOAD_LOGGER] == [
        "QKVParallelLinear: Failed to load weights"]
