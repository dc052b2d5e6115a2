"""Prefix-tree layout against the flat one (issue 27) on a synthetic harness batch: groups of ``--samples``
trajectories sharing a ``--prompt``-token prompt, each sample generating ``--gen`` tokens, on the CPU-sized model
(Qwen2 architecture, vocab 1024, hidden 128, 2 layers).

For each layout (flat padded, flat packed, tree) it runs ``Trainer.train_step`` (decoupled PPO, proximal recompute
included) ``--steps`` times after one warm-up step, from the same initial weights, and prints one JSON line: the
tokens the training forwards computed (``batch/tree_tokens``; the flat layouts compute ``batch/num_tokens``), the
unique tokens of the batch (distinct prefixes of the whole batch), wall and process-CPU seconds per step, and the
1-minute load average beside them (timings on a shared machine are noise without it). The last line gives the tree
layout's speed-up over each flat layout and the largest parameter difference after the steps (the layouts must
agree to float rounding).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_prefix_tree.py --groups 2 --samples 8 --prompt 4096 --gen 256
    PYTHONPATH=. .venv/bin/python benchmarks/bench_prefix_tree.py --groups 1 --samples 2 --prompt 16 --gen 4 --steps 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8, help="trajectories per group (sharing the group's prompt)")
    ap.add_argument("--prompt", type=int, default=4096, help="shared prompt tokens per group")
    ap.add_argument("--gen", type=int, default=256, help="generated tokens per trajectory (lengths vary +-25%%)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--micro", type=int, default=8, help="micro_batch_size")
    args = ap.parse_args()

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.trainer.config import LossConfig, TrainerConfig
    from agentrl.trainer.prefix_tree import build_tree
    from agentrl.trainer.trainer import Trainer
    from agentrl.trajectory import Group, Trajectory

    d = tempfile.mkdtemp(prefix="bench_prefix_tree_")
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=args.prompt + 2 * args.gen + 8,
        tie_word_embeddings=True,
    )).save_pretrained(d)
    g = random.Random(0)
    groups = []
    for gi in range(args.groups):
        prompt = [g.randrange(1024) for _ in range(args.prompt)]
        trajs = []
        for j in range(args.samples):
            n = max(1, round(args.gen * g.uniform(0.75, 1.25)))
            trajs.append(Trajectory(
                id=f"t{gi}-{j}", group_id=f"g{gi}", env_id="bench",
                token_ids=prompt + [g.randrange(1024) for _ in range(n)], loss_mask=[0] * args.prompt + [1] * n,
                logprobs=[0.0] * args.prompt + [-6.9 + g.gauss(0, 0.1) for _ in range(n)],
                versions=[-1] * args.prompt + [0] * n, prompt_len=args.prompt, reward=float(g.random() < 0.5),
            ))
        groups.append(Group(id=f"g{gi}", trajectories=trajs))
    ids = [torch.tensor(t.token_ids) for gr in groups for t in gr.trajectories]
    # distinct prefixes of the whole sequences (build_tree drops each sequence's last token: pad one on)
    unique = build_tree([torch.cat([x, x[:1]]) for x in ids]).num_nodes
    print(json.dumps({"torch_threads": torch.get_num_threads(), "trajectories": len(ids),
                      "flat_tokens": sum(int(x.numel()) for x in ids), "unique_tokens": unique}))

    results, params = {}, {}
    for layout in ("padded", "packed", "tree"):
        cfg = TrainerConfig(device="cpu", micro_batch_size=args.micro, packing=layout == "packed",
                            prefix_tree=layout == "tree", loss=LossConfig(name="decoupled_ppo"))
        tr = Trainer(cfg, d)
        m = tr.train_step(groups)  # warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            m = tr.train_step(groups)
        wall = (time.perf_counter() - t0) / args.steps
        cpu = (time.process_time() - c0) / args.steps
        computed = m.get("batch/tree_tokens", m["batch/num_tokens"])
        results[layout] = wall
        params[layout] = [p.detach().clone() for p in tr.model.parameters()]
        print(json.dumps({"layout": layout, "computed_tokens": computed, "flat_tokens": m["batch/num_tokens"],
                          "computed_over_unique": round(computed / unique, 3), "step_s": round(wall, 3),
                          "step_cpu_s": round(cpu, 3), "loadavg_1m": round(os.getloadavg()[0], 2)}))
    diff = max(float((a - b).abs().max()) for a, b in zip(params["tree"], params["padded"]))
    print(json.dumps({"tree_speedup_vs_padded": round(results["padded"] / results["tree"], 2),
                      "tree_speedup_vs_packed": round(results["packed"] / results["tree"], 2),
                      "max_param_diff_tree_vs_padded": diff}))


if __name__ == "__main__":
    main()
