"""Prefix-tree layout against the flat one (issue 27), on three kinds of batches, in one run:

- ``tooluse``: the tool-use demo's batches (``configs/tooluse.yaml``: ``agentrl/ToolLookup-v0``, 4 groups x 8
  episodes of up to 5 turns, ``keep`` mode, the tiny-tool model and its template), played by the warm start's noisy
  scripted policy (the env's solver with 40 % of its turns the env's scripted mistakes), so no engine is needed;
- ``split``: split-mode Qwen3-thinking trajectories (the chat tests' scripted episodes, plain and tool-calling, whose
  template strips past reasoning and so starts a segment per turn), on a tiny Qwen2 with the real Qwen vocabulary;
- ``harness``: a synthetic harness batch: a ``--prompt``-token system prompt shared by every sample, ``--groups``
  groups with their own 64-token task, ``--samples`` samples per group generating about ``--gen`` tokens each, on
  the CPU-sized model (Qwen2 architecture, vocab 1024, hidden 128, 2 layers).

For each case a flat trainer (the default padded layout) and a tree trainer start from the same weights, take one
warm-up ``train_step`` each (decoupled PPO, proximal recompute included) and then ``--reps`` timed steps each,
*interleaved* (flat, tree, flat, tree, ...) so both see the same machine load. One JSON line per case: tokens the
training forwards computed (flat: ``batch/num_tokens``; tree: ``batch/tree_tokens``), the batch's unique tokens
(distinct prefixes of the whole batch), median wall and process-CPU seconds per step, the speed-up (flat / tree), the
largest parameter difference after the steps (float rounding only), and the 1-minute load average at the case's
start and end (timings on a shared machine are noise without it).

    PYTHONPATH=. nice -n 5 .venv/bin/python benchmarks/bench_prefix_tree.py --cases tooluse split harness
    PYTHONPATH=. .venv/bin/python benchmarks/bench_prefix_tree.py --cases harness --prompt 64 --gen 8 --reps 1
    PYTHONPATH=. nice -n 5 .venv/bin/python benchmarks/bench_prefix_tree.py --micro 64 --micro-tokens 8192
    python benchmarks/bench_prefix_tree.py --device cuda --cases harness --hidden 896 --layers 24 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tiny_qwen2(vocab: int, hidden: int, heads: int, positions: int, seed: int, layers: int = 2) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    d = tempfile.mkdtemp(prefix="bench_prefix_tree_")
    torch.manual_seed(seed)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=1, head_dim=hidden // heads,
        max_position_embeddings=positions, tie_word_embeddings=True,
    )).save_pretrained(d)
    return d


def harness_batch(args: argparse.Namespace) -> tuple[list, str]:
    from agentrl.trajectory import Group, Trajectory

    g = random.Random(0)
    system = [g.randrange(1024) for _ in range(args.prompt)]
    groups = []
    for gi in range(args.groups):
        prompt = system + [g.randrange(1024) for _ in range(64)]
        trajs = []
        for j in range(args.samples):
            n = max(1, round(args.gen * g.uniform(0.75, 1.25)))
            trajs.append(Trajectory(
                id=f"t{gi}-{j}", group_id=f"g{gi}", env_id="bench",
                token_ids=prompt + [g.randrange(1024) for _ in range(n)], loss_mask=[0] * len(prompt) + [1] * n,
                logprobs=[0.0] * len(prompt) + [-6.9 + g.gauss(0, 0.1) for _ in range(n)],
                versions=[-1] * len(prompt) + [0] * n, prompt_len=len(prompt), reward=float(g.random() < 0.5),
            ))
        groups.append(Group(id=f"g{gi}", trajectories=trajs))
    return groups, _tiny_qwen2(1024, args.hidden, max(1, args.hidden // 64), args.prompt + 64 + 2 * args.gen + 8, 0,
                               args.layers)


def tooluse_batch(args: argparse.Namespace) -> tuple[list, str]:
    from agentrl.agent.loop import RolloutConfig
    from agentrl.chat import load_tokenizer
    from agentrl.controller.warmstart import DemoPolicy, noisy
    from agentrl.envs import mistakes_for, solver_for
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.models import ensure_tiny_model

    env_id = "agentrl/ToolLookup-v0"
    model = ensure_tiny_model(variant="tiny-tool")
    tok = load_tokenizer(model)
    policy = DemoPolicy(noisy(solver_for(env_id), mistakes_for(env_id), 0.4, seed=0), tok,
                        RolloutConfig(max_tokens_per_turn=32, max_turns=5, max_context_tokens=1024, tools=False))
    cfg = ManagerConfig(workers=0, max_turns=5, max_concurrency=64, num_groups=4, group_size=8)
    specs = [EpisodeSpec(env_id, seed=100 + g, group_id=f"tool-{g}") for g in range(4)]

    async def run() -> list:
        async with EnvManager(cfg, policy) as mgr:
            return await mgr.collect_groups(iter(specs))

    groups = asyncio.run(run())
    rng = random.Random(0)
    for gr in groups:  # the demonstrations carry log-prob 0.0; give the loss a plausible behaviour policy
        for t in gr.trajectories:
            t.logprobs = [-2.0 + rng.gauss(0, 0.3) if m else x for x, m in zip(t.logprobs, t.loss_mask)]
            t.reward = float(rng.random() < 0.5)
    return groups, str(model)


def split_batch(args: argparse.Namespace) -> tuple[list, str]:
    sys.path.insert(0, str(ROOT / "tests" / "chat"))
    from test_chat_families import run_episode

    from agentrl.trajectory import Group, Trajectory

    trajs = []
    for i, episode in enumerate(("plain", "tools")):
        s, _, _, _ = asyncio.run(run_episode("qwen3-think", episode, "split"))
        rec = s.token_record()
        trajs.append(Trajectory(
            id=f"q3-{episode}", group_id="q3", env_id="e", token_ids=rec.token_ids, loss_mask=rec.loss_mask,
            logprobs=[x - 0.5 if m else x for x, m in zip(rec.logprobs, rec.loss_mask)],
            versions=[0 if m else -1 for m in rec.loss_mask], prompt_len=rec.prompt_len, segments=rec.segments,
            reward=float(i)))
    return [Group(id="q3", trajectories=trajs)], _tiny_qwen2(151_936, 32, 2, 8192, 7)


CASES = {"tooluse": tooluse_batch, "split": split_batch, "harness": harness_batch}


def run_case(name: str, args: argparse.Namespace) -> dict:
    import torch

    from agentrl.trainer.config import LossConfig, TrainerConfig
    from agentrl.trainer.prefix_tree import build_tree
    from agentrl.trainer.trainer import Trainer

    groups, model_dir = CASES[name](args)
    load0 = os.getloadavg()[0]
    seqs = [torch.tensor(t.token_ids[a:b]) for gr in groups for t in gr.trajectories for a, b in t.segment_slices()]
    # distinct prefixes of the whole sequences (build_tree drops each sequence's last token: pad one on)
    unique = build_tree([torch.cat([x, x[:1]]) for x in seqs]).num_nodes
    trainers = {layout: Trainer(TrainerConfig(device=args.device, micro_batch_size=args.micro,
                                              micro_batch_tokens=args.micro_tokens, prefix_tree=layout == "tree",
                                              loss=LossConfig(name="decoupled_ppo"), dtype=args.dtype), model_dir)
                for layout in ("flat", "tree")}
    metrics = {layout: tr.train_step(groups) for layout, tr in trainers.items()}  # warm-up
    wall: dict[str, list[float]] = {"flat": [], "tree": []}
    cpu: dict[str, list[float]] = {"flat": [], "tree": []}
    for _ in range(args.reps):
        for layout, tr in trainers.items():  # interleaved: both layouts see the same load
            t0, c0 = time.perf_counter(), time.process_time()
            metrics[layout] = tr.train_step(groups)
            wall[layout].append(time.perf_counter() - t0)
            cpu[layout].append(time.process_time() - c0)
    pf, pt = (dict(trainers[k].model.named_parameters()) for k in ("flat", "tree"))
    diff = max(float((pt[k] - p).abs().max()) for k, p in pf.items())
    flat_tokens = metrics["flat"]["batch/num_tokens"]
    tree_tokens = metrics["tree"]["batch/tree_tokens"]
    med = {k: statistics.median(v) for k, v in wall.items()}
    return {"case": name, "sequences": len(seqs), "flat_tokens": flat_tokens, "tree_tokens": tree_tokens,
            "unique_tokens": unique, "flat_over_unique": round(flat_tokens / unique, 2),
            "tree_over_unique": round(tree_tokens / unique, 3),
            "flat_step_s": round(med["flat"], 3), "tree_step_s": round(med["tree"], 3),
            "flat_step_cpu_s": round(statistics.median(cpu["flat"]), 3),
            "tree_step_cpu_s": round(statistics.median(cpu["tree"]), 3),
            "speedup": round(med["flat"] / med["tree"], 2),
            "speedup_cpu": round(statistics.median(cpu["flat"]) / statistics.median(cpu["tree"]), 2),
            "micro_batch_size": args.micro, "micro_batch_tokens": args.micro_tokens,
            "device": args.device, "dtype": args.dtype,
            **({"gpu": torch.cuda.get_device_name(),
                "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)} if args.device == "cuda" else {}),
            "reps": args.reps, "max_param_diff": diff, "torch_threads": torch.get_num_threads(),
            "loadavg_1m_start": round(load0, 1), "loadavg_1m_end": round(os.getloadavg()[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    ap.add_argument("--groups", type=int, default=2, help="harness: groups (each with its own task)")
    ap.add_argument("--samples", type=int, default=8, help="harness: samples per group")
    ap.add_argument("--prompt", type=int, default=4096, help="harness: system-prompt tokens every sample shares")
    ap.add_argument("--gen", type=int, default=128, help="harness: generated tokens per sample (+-25%%)")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per layout (interleaved)")
    ap.add_argument("--micro", type=int, default=8, help="micro_batch_size")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the tree layout's flex_attention")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="compute precision (bfloat16: autocast over float32 master weights, the GPU configs' own)")
    ap.add_argument("--hidden", type=int, default=128, help="harness: the model's hidden size (heads of 64)")
    ap.add_argument("--layers", type=int, default=2, help="harness: the model's layers")
    ap.add_argument("--micro-tokens", type=int, default=None,
                    help="micro_batch_tokens: the same memory budget for both layouts (flat: padded tokens per "
                         "micro-batch; tree: distinct prefixes), so the tree fits more sequences per micro-batch")
    args = ap.parse_args()
    for name in args.cases:
        print(json.dumps(run_case(name, args)), flush=True)


if __name__ == "__main__":
    main()
