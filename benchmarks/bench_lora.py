"""LoRA against full fine-tuning on one random Qwen2 (~100M parameters by default): trainer step time, trainer peak
memory, and what one weight sync moves (bytes) and costs (seconds), on the CPU.

Each mode runs in a fresh subprocess so that its peak RSS (``ru_maxrss``) is its own. Per mode: load the model into
the :class:`~agentrl.trainer.Trainer`, run ``--steps`` decoupled-PPO steps on random trajectories (the first is
warm-up), then time the weight sync's trainer half (``state_dict_for_inference``) and its engine half up to the
load (the engine's check and safetensors packing, ``VLLMEngine.prepare_weights``' work for that payload); with
``--engine`` also a real ``VLLMEngine.update_weights`` (the vLLM load or ``add_lora``; starts an engine per mode).

    nice -n 5 python benchmarks/bench_lora.py [--hidden 768 --layers 12] [--steps 4] [--engine] [--out FILE]

Prints one JSON row per mode and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build_model(path: Path, hidden: int, layers: int, vocab: int) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                      head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(str(path))
    return sum(p.numel() for p in model.parameters())


def batch(vocab: int, seqs: int, length: int, seed: int):
    from agentrl.trajectory import Trajectory

    g = random.Random(seed)
    prompt = 32
    return [Trajectory(id=f"b{seed}-{i}", group_id=f"g{i // 4}", env_id="bench",
                       token_ids=[g.randrange(3, vocab) for _ in range(length)],
                       loss_mask=[0] * prompt + [1] * (length - prompt),
                       logprobs=[0.0] * prompt + [-9.0] * (length - prompt), versions=[-1] * prompt + [0] * (length - prompt),
                       prompt_len=prompt, reward=float(i % 2)) for i in range(seqs)]


def run_mode(args: argparse.Namespace) -> dict:
    import torch

    from agentrl.trainer.config import LoraConfig, OptimizerConfig, TrainerConfig
    from agentrl.trainer.trainer import Trainer

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank) if args.mode == "lora" else None
    cfg = TrainerConfig(device="cpu", dtype="float32", micro_batch_size=args.seqs,
                        optimizer=OptimizerConfig(lr=1e-5), lora=lora)
    trainer = Trainer(cfg, args.model)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    times, cpu = [], []
    for s in range(args.steps):
        b = batch(args.vocab, args.seqs, args.length, s)
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.train_step(b, advantages=[(-1.0) ** i for i in range(len(b))])
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    t0 = time.perf_counter()
    sd = trainer.state_dict_for_inference()
    t_trainer = time.perf_counter() - t0
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    t0 = time.perf_counter()
    if lora is not None:
        from agentrl.inference.lora import AdapterSet

        payload = AdapterSet(None, {}, torch.float32).prepare(sd)
    else:
        from agentrl.inference.weights import checkpoint_schema, prepare_state_dict, serialize

        payload = serialize(prepare_state_dict(sd, checkpoint_schema(args.model), torch.float32, tied=True))
    t_pack = time.perf_counter() - t0
    row = {"mode": args.mode, "trainable_params": trainable, "step_s": min(times[1:] or times),
           "step_cpu_s": min(cpu[1:] or cpu), "sync_bytes": nbytes, "payload_bytes": len(payload),
           "sync_trainer_s": t_trainer, "sync_pack_s": t_pack,
           "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if args.engine:
        row["sync_engine_s"] = engine_sync(args, sd, trainer, lora)
    return row


def engine_sync(args: argparse.Namespace, sd: dict, trainer, lora) -> float:
    import asyncio

    from agentrl.inference.config import EngineConfig
    from agentrl.inference.vllm_engine import VLLMEngine

    extra = {}
    if lora is not None:
        from agentrl.trainer.lora import adapter_config

        extra["lora"] = adapter_config(lora, args.model)
    engine = VLLMEngine(EngineConfig(model=args.model, max_model_len=512, **extra))
    try:
        t0 = time.perf_counter()
        asyncio.run(engine.update_weights(sd, 1))
        return time.perf_counter() - t0
    finally:
        engine.close_sync()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--engine", action="store_true", help="also time a real vLLM update (starts one engine per mode)")
    p.add_argument("--out", default=None)
    p.add_argument("--mode", choices=["lora", "full"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:  # a child: one mode
        print("ROW " + json.dumps(run_mode(args)), flush=True)
        return
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as d:
        n = build_model(Path(d), args.hidden, args.layers, args.vocab)
        rows = []
        for mode in ("full", "lora"):
            cmd = [sys.executable, __file__, "--mode", mode, "--model", d] + [
                f"--{k}={getattr(args, k)}" for k in ("vocab", "rank", "steps", "seqs", "length")]
            if args.engine:
                cmd.append("--engine")
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(next(x for x in out.splitlines() if x.startswith("ROW "))[4:]))
    result = {"params": n, "hidden": args.hidden, "layers": args.layers, "seqs": args.seqs, "length": args.length,
              "rank": args.rank, "load_start": load0, "load_end": os.getloadavg(), "rows": rows}
    print(json.dumps(result, indent=1))
    print(f"\n{n / 1e6:.0f}M params, {args.seqs} x {args.length} tokens per step, load {load0[0]:.1f} -> "
          f"{result['load_end'][0]:.1f}\n")
    print("| mode | trainable params | step s (CPU s) | peak RSS GiB | sync bytes | trainer-side s | pack s |"
          + (" engine update s |" if args.engine else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.engine else ""))
    for r in rows:
        print(f"| {r['mode']} | {r['trainable_params'] / 1e6:.2f}M | {r['step_s']:.2f} ({r['step_cpu_s']:.2f}) | "
              f"{r['peak_rss_gib']:.2f} | {r['sync_bytes'] / 2**20:.1f} MiB | {r['sync_trainer_s']:.3f} | "
              f"{r['sync_pack_s']:.3f} |" + (f" {r['sync_engine_s']:.3f} |" if args.engine else ""))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
