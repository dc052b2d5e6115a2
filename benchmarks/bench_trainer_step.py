"""Trainer step throughput on the CPU-sized model (Qwen2 architecture, vocab 1024, hidden 128, 2 layers).

Measures ``Trainer.train_step`` (decoupled PPO, proximal recompute included) and ``Trainer.sft_step`` on a batch of
random trajectories, for a few micro-batch sizes, and prints one JSON line per setting. ``train_step_cpu_s`` is
process CPU time (all threads) per step: a steadier figure than wall time on a shared machine.

    .venv/bin/python benchmarks/bench_trainer_step.py --batch 32 --prompt 64 --gen 128 --steps 3
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro", type=int, nargs="+", default=[4, 16, 32])
    args = ap.parse_args()

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.trainer import Trainer
    from agentrl.trajectory import Trajectory

    d = tempfile.mkdtemp(prefix="bench_trainer_")
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=1024, tie_word_embeddings=True,
    )).save_pretrained(d)
    g = random.Random(0)
    n = args.prompt + args.gen
    trajs = [
        Trajectory(
            id=f"t{i}", group_id=f"g{i // 8}", env_id="bench", token_ids=[g.randrange(1024) for _ in range(n)],
            loss_mask=[0] * args.prompt + [1] * args.gen,
            logprobs=[0.0] * args.prompt + [-6.9 + g.gauss(0, 0.1) for _ in range(args.gen)],
            versions=[-1] * args.prompt + [0] * args.gen, reward=float(g.random() < 0.5),
        )
        for i in range(args.batch)
    ]
    print(json.dumps({"torch_threads": torch.get_num_threads(), "batch": args.batch, "seq_len": n}))
    for micro in args.micro:
        tr = Trainer(TrainerConfig(device="cpu", micro_batch_size=micro), d)
        tr.train_step(trajs)  # warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        prox = []
        for _ in range(args.steps):
            m = tr.train_step(trajs)
            prox.append(m["perf/prox_s"])
        rl_s = (time.perf_counter() - t0) / args.steps
        rl_cpu = (time.process_time() - c0) / args.steps
        t0 = time.perf_counter()
        for _ in range(args.steps):
            tr.sft_step(trajs)
        sft_s = (time.perf_counter() - t0) / args.steps
        tokens = args.batch * n
        print(json.dumps({
            "micro_batch_size": micro, "train_step_s": round(rl_s, 3), "train_tokens_per_s": round(tokens / rl_s),
            "train_step_cpu_s": round(rl_cpu, 3),
            "proximal_recompute_s": round(sum(prox) / len(prox), 3), "sft_step_s": round(sft_s, 3),
            "sft_tokens_per_s": round(tokens / sft_s),
        }))


if __name__ == "__main__":
    main()
