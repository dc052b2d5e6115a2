"""Data-parallel trainer ranks on the CPU: seconds per ``train_step`` with ``trainer.world_size`` 1 vs 2 and the
time spent in collectives (gloo all-reduces of the gradients and of the step's counts/metrics).

Every setting starts its trainer(s) as Ray actors exactly as ``agentrl train`` does (``create_trainer``: one actor,
or a ``TrainerGroup`` of N ranks with one CPU each, so torch uses one thread per rank), all at once; after one
warm-up step each, ``--steps`` rounds follow, each timing one step of decoupled PPO per setting on the same batch of
random trajectories (the order alternates between rounds), so the settings share the machine's load drift.
Columns:

- ``s/step``: wall seconds per ``train_step`` seen by the driver (sharding, dispatch, the step, the result);
- ``rank step s``: rank 0's own ``perf/step_s``; ``comm s``: rank 0's ``perf/comm_s``, seconds inside collectives,
  which includes waiting for the slower rank (load imbalance, or a core taken by another process);
- ``tokens/s``: batch tokens per driver second; ``speed-up``: the median over rounds of (first setting's s/step /
  this row's s/step) within the same round.

The model is a Qwen2-architecture causal LM of the size given (default ~6.6 M parameters: 26 MB of float32
gradients per all-reduce), built at start in a temporary directory.

    .venv/bin/python benchmarks/bench_trainer_dp.py                      # world_size 1 and 2, markdown table
    .venv/bin/python benchmarks/bench_trainer_dp.py --world-sizes 1 2 --steps 5 --batch 64
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time


def _batch(n: int, prompt: int, gen: int, vocab: int, seed: int = 0) -> list:
    from agentrl.trajectory import Group, Trajectory

    g = random.Random(seed)
    groups = []
    for gi in range(max(1, n // 8)):
        p = [g.randrange(3, vocab) for _ in range(prompt)]
        trajs = []
        for j in range(8):
            k = g.randrange(gen // 2, gen + 1)  # uneven lengths, as real rollouts
            trajs.append(Trajectory(
                id=f"t{gi}-{j}", group_id=f"g{gi}", env_id="bench", token_ids=p + [g.randrange(3, vocab) for _ in range(k)],
                loss_mask=[0] * prompt + [1] * k, logprobs=[0.0] * prompt + [-6.0 + g.gauss(0, 0.3) for _ in range(k)],
                versions=[-1] * prompt + [0] * k, prompt_len=prompt, reward=float(g.random() < 0.5)))
        groups.append(Group(id=f"g{gi}", trajectories=trajs))
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="trajectories per step (groups of 8)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--micro", type=int, default=8, help="micro_batch_size (per rank)")
    args = ap.parse_args()

    import ray
    from agentrl import raystart
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.trainer.config import OptimizerConfig, TrainerConfig
    from agentrl.trainer.dp_group import create_trainer, stop_trainer

    model_dir = tempfile.mkdtemp(prefix="bench_trainer_dp_")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
        max_position_embeddings=1024, tie_word_embeddings=True))
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    del model
    batch = _batch(args.batch, args.prompt, args.gen, args.vocab)
    tokens = sum(len(t.token_ids) for g in batch for t in g.trajectories)

    raystart.init(num_cpus=sum(args.world_sizes))
    load_before = open("/proc/loadavg").read().split()[:3]
    trainers = {}
    try:
        for ws in args.world_sizes:
            cfg = TrainerConfig(device="cpu", world_size=ws, micro_batch_size=args.micro,
                                optimizer=OptimizerConfig(lr=1e-5), compute_entropy=True)
            trainers[ws] = create_trainer(cfg, model_dir, num_cpus=1)

        def step(ws: int) -> tuple[float, dict]:
            t0 = time.perf_counter()
            ref = trainers[ws].train_step.remote(batch)
            m = ref.result() if ws > 1 else ray.get(ref)
            return time.perf_counter() - t0, m

        for ws in args.world_sizes:
            step(ws)  # warm-up
        res: dict[int, list[tuple[float, dict]]] = {ws: [] for ws in args.world_sizes}
        for r in range(args.steps):
            for ws in (args.world_sizes if r % 2 == 0 else list(reversed(args.world_sizes))):
                res[ws].append(step(ws))
    finally:
        for t in trainers.values():
            stop_trainer(t)
    load_after = open("/proc/loadavg").read().split()[:3]
    ray.shutdown()

    first = args.world_sizes[0]
    rows = []
    for ws in args.world_sizes:
        walls = [w for w, _ in res[ws]]
        ratio = statistics.median(a[0] / b[0] for a, b in zip(res[first], res[ws]))
        rows.append((ws, statistics.median(walls), statistics.median(m["perf/step_s"] for _, m in res[ws]),
                     statistics.median(m.get("perf/comm_s", 0.0) for _, m in res[ws]), ratio))
    print(f"\nmodel: Qwen2 {n_params / 1e6:.1f} M params (hidden {args.hidden}, {args.layers} layers, vocab "
          f"{args.vocab}); batch {args.batch} trajectories, {tokens} tokens; micro_batch_size {args.micro} per rank; "
          f"1 CPU (1 torch thread) per rank; median of {args.steps} alternating rounds after 1 warm-up; "
          f"{os.cpu_count()} cores; load average before {' '.join(load_before)}, after {' '.join(load_after)}\n")
    print("| world_size | s/step | rank step s | comm s | comm share | tokens/s | speed-up |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for ws, wall, step_s, comm, ratio in rows:
        print(f"| {ws} | {wall:.2f} | {step_s:.2f} | {comm:.3f} | {comm / step_s:.0%} | {tokens / wall:.0f} | "
              f"{ratio:.2f}x |")


if __name__ == "__main__":
    main()
