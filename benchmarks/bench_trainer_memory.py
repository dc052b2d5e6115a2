"""CPU memory of one ``Trainer.train_step`` at a real vocabulary (issue 11's CPU target).

A 1-layer Qwen2 (vocabulary 151,936, hidden 128, 2 heads of 64, 1 KV head, tied embeddings, random init, fp32) trains
on 2 sequences of ``--seq-len`` tokens (256 prompt + generated) with micro-batch 1, decoupled PPO. Each setting runs
in its own subprocess; peak RSS growth = ``VmHWM`` after the step minus ``VmRSS`` before it, with the high-water
mark reset (``/proc/self/clear_refs``) just before the step. ``first step`` includes allocating the gradients and
AdamW's state (3 x 78 MB here); ``second step`` is the steady state.

Log-probs are checked against the model's own logits (HF ``forward`` with ``logits_to_keep`` slices of 512
positions, float32 log-softmax: the computation the trainer did before chunking, without its memory).

``--impl full`` is the pre-chunking path (full ``[tokens, vocabulary]`` float32 logits, log-softmax and entropy);
it needs ~2.4 GiB per 1,024 tokens, so by default it runs at 512 and 1,024 tokens only (``--full-lengths`` to
change; 4,096 needs ~10 GiB).

    .venv/bin/python benchmarks/bench_trainer_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

VOCAB = 151_936


def _status() -> dict[str, float]:
    s = open("/proc/self/status").read()
    return {k: int(re.search(k + r":\s+(\d+)", s).group(1)) / 1024 ** 2 for k in ("VmRSS", "VmHWM")}  # GiB


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def child(args: argparse.Namespace) -> None:
    import random

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.trainer import Trainer
    from agentrl.trajectory import Trajectory

    torch.manual_seed(0)
    d = tempfile.mkdtemp(prefix="bench_mem_")
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=max(8192, args.seq_len), tie_word_embeddings=True,
    )).save_pretrained(d)
    g = random.Random(0)
    n, p = args.seq_len, 256
    trajs = [Trajectory(
        id=f"t{i}", group_id="g", env_id="bench", token_ids=[g.randrange(VOCAB) for _ in range(n)],
        loss_mask=[0] * p + [1] * (n - p), logprobs=[0.0] * p + [-11.9 + g.gauss(0, 0.1) for _ in range(n - p)],
        versions=[-1] * p + [0] * (n - p), reward=float(i),
    ) for i in range(2)]
    tr = Trainer(TrainerConfig(device="cpu", micro_batch_size=1, logprob_impl=args.impl), d)
    out = {"impl": tr.logprob_impl, "seq_len": n, "threads": torch.get_num_threads()}
    for name in ("first_step", "second_step"):
        before = _status()["VmRSS"]
        _reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        m = tr.train_step(trajs)
        out[name + "_s"] = time.perf_counter() - t0
        out[name + "_cpu_s"] = time.process_time() - c0
        out[name + "_growth_gib"] = _status()["VmHWM"] - before
        assert m["train/skipped_steps"] == 0, m
    if args.check_logprobs:
        lp = tr.compute_logprobs(trajs)
        worst = 0.0
        with torch.no_grad():
            for i, t in enumerate(trajs):
                ids = torch.tensor([t.token_ids])
                for s in range(0, n - 1, 512):
                    idx = torch.arange(s, min(s + 512, n - 1))
                    logits = tr.model(input_ids=ids, logits_to_keep=idx, use_cache=False).logits[0].float()
                    ref = torch.log_softmax(logits, -1).gather(-1, ids[0, idx + 1][:, None]).squeeze(-1)
                    worst = max(worst, float((lp[i, idx] - ref).abs().max()))
        out["max_abs_logprob_diff"] = worst
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", default="torch")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--check-logprobs", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096], help="sequence lengths for the chunked path")
    ap.add_argument("--full-lengths", type=int, nargs="*", default=[512, 1024],
                    help="sequence lengths for the full-logits path (memory-hungry)")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    runs = [("torch", n, True) for n in args.lengths] + [("full", n, False) for n in args.full_lengths]
    load = [open("/proc/loadavg").read().split()[:3]]
    rows = []
    for impl, n, check in runs:
        cmd = [sys.executable, __file__, "--child", "--impl", impl, "--seq-len", str(n)] + (["--check-logprobs"] if check else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"{impl} {n}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(line[0][7:]))
    load.append(open("/proc/loadavg").read().split()[:3])
    print(f"load average before/after: {' '.join(load[0])} / {' '.join(load[1])}")
    print("| log-prob path | 2 x tokens | peak RSS growth, first step | second step | wall s / CPU s (2nd step) "
          "| max abs diff vs model logits |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        diff = f"{r['max_abs_logprob_diff']:.1e}" if "max_abs_logprob_diff" in r else "(reference)"
        print(f"| {r['impl']} | 2 x {r['seq_len']:,} | {r['first_step_growth_gib']:.2f} GiB | "
              f"{r['second_step_growth_gib']:.2f} GiB | {r['second_step_s']:.1f} / {r['second_step_cpu_s']:.1f} | "
              f"{diff} |")


if __name__ == "__main__":
    main()
