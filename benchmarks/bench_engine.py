"""Engine figures for the tiny model on this machine: start time, tokens/s at several concurrencies, weight-update
latency, and the engine-vs-transformers log-prob difference after a weight update.

    .venv/bin/python benchmarks/bench_engine.py [--dtype float32|bfloat16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


async def main(dtype: str, tokens: int) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from agentrl.inference.base import SamplingParams
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.vllm_engine import VLLMEngine
    from agentrl.models import ensure_tiny_model

    model_dir = ensure_tiny_model()
    eng = await VLLMEngine.create(EngineConfig(model=str(model_dir), dtype=dtype, max_model_len=1024))
    print(f"engine start: {eng.start_time_s:.1f} s (dtype {dtype})")
    prompt = [1, 286, 201, 313, 2, 201, 1, 294, 201]
    sp = SamplingParams(max_tokens=tokens, ignore_eos=True)
    for n in (1, 1, 64, 256):
        t0 = time.perf_counter()
        gens = await asyncio.gather(*[eng.generate(prompt, sp, request_id=f"b{n}-{i}-{t0}") for i in range(n)])
        dt = time.perf_counter() - t0
        print(f"{n:4d} concurrent x {tokens} tokens: {sum(len(g.token_ids) for g in gens) / dt:8.0f} tok/s ({dt:.2f} s)")
    original = load_file(str(model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    seq = prompt + gens[0].token_ids[:32]
    old_lp = await eng.prompt_logprobs(seq)
    t0 = time.perf_counter()
    await eng.update_weights(new, 1)
    print(f"update_weights (pause, load {sum(t.numel() for t in new.values())} params, reset cache, resume): "
          f"{(time.perf_counter() - t0) * 1000:.0f} ms")
    new_lp = await eng.prompt_logprobs(seq)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.load_state_dict(new, strict=False)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)
    ref_lp = [ref[i, seq[i + 1]].item() for i in range(len(seq) - 1)]
    print(f"max |engine - transformers fp32| log-prob after update: {max(abs(a - b) for a, b in zip(new_lp, ref_lp)):.2e}")
    print(f"max |new - old| engine log-prob: {max(abs(a - b) for a, b in zip(new_lp, old_lp)):.2f}")
    await eng.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    asyncio.run(main(a.dtype, a.tokens))
