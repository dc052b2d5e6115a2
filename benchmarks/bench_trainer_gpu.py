"""Trainer throughput, memory and MFU on random-init Qwen2 models (no downloads), as in issue 11.

GPU mode (default): Qwen2.5-0.5B-, 1.5B- and 3B-shaped models (random weights, built from their published shapes), a
batch of ``--groups`` x ``--group-size`` trajectories of ``--prompt`` + ``--gen`` tokens (fixed) or ``--prompt`` +
uniform(``--var-gen``) tokens (variable), decoupled PPO through ``Trainer.train_step`` with the settings of
``configs/gpu_qwen2.5_tooluse.yaml`` (bf16 compute, float32 master weights and AdamW state, token budget per
micro-batch; the config's ``compile_layers`` is the ``compiled`` variant here, ``default`` runs without it), one
warm-up step then ``--steps`` timed steps. Reports s/step, tokens/s, peak GPU memory
(``torch.cuda.max_memory_allocated``) and MFU = 6 x non-embedding parameters x tokens / time / peak bf16 FLOP/s
(989 TFLOP/s for an H100 SXM; ``--peak-tflops`` otherwise). The proximal pass, when a variant needs one, is work
the MFU does not count. ``--longest`` then finds the longest single sequence that trains (doubling from 16,384).

CPU mode (``--cpu``): the same code on small shapes (4 layers, hidden 256, vocabulary 32,000; 8 trajectories of
64 + 192 tokens, variable 32-448), reporting s/step, tokens/s and peak RSS growth; no MFU.

Each (model, lengths, variant) runs in its own subprocess so peaks and compile caches do not leak between runs.

    .venv/bin/python benchmarks/bench_trainer_gpu.py --cpu
    python benchmarks/bench_trainer_gpu.py --models 0.5b 1.5b --variants default compiled --longest   # on a GPU
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

# Published shapes (config.json of Qwen/Qwen2.5-0.5B, -1.5B and -3B); weights are random here.
MODELS = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "cpu-small": dict(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}

# TrainerConfig overrides per variant, on top of BASE (the GPU config's trainer section).
BASE = dict(dtype="bfloat16", micro_batch_size=64, micro_batch_tokens=16384, gradient_checkpointing=True,
            loss={"name": "decoupled_ppo"})
CPU_BASE = dict(dtype="float32", micro_batch_size=8, micro_batch_tokens=1024, gradient_checkpointing=False,
                loss={"name": "decoupled_ppo"})
VARIANTS = {
    "default": {},
    "packed": dict(packing=True),
    "compiled": dict(compile_layers=True),
    "compiled-ckpt2": dict(compile_layers=True, checkpoint_every=2),
    "no-ckpt": dict(gradient_checkpointing=False),
    "proximal-pass": dict(_force_prox_pass=True),
    "full-logits": dict(logprob_impl="full"),
    "torch-logprobs": dict(logprob_impl="torch"),
    "bf16-compute": dict(dtype="bfloat16"),
}


def _peak_flops(name: str) -> float | None:
    n = name.upper()
    if "H100" in n and "PCIE" in n:
        return 756e12
    if "H100" in n or "H200" in n or "GH200" in n:
        return 989.4e12
    if "A100" in n:
        return 312e12
    return None


def _rss_gib() -> dict[str, float]:
    s = open("/proc/self/status").read()
    return {k: int(re.search(k + r":\s+(\d+)", s).group(1)) / 1024 ** 2 for k in ("VmRSS", "VmHWM")}


def _make_model(shape: str, out_dir: str, max_len: int) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    d = os.path.join(out_dir, shape)
    if not os.path.exists(os.path.join(d, "config.json")):
        torch.manual_seed(0)
        cfg = Qwen2Config(**MODELS[shape], max_position_embeddings=max(32768, max_len), rope_theta=1e6)
        with torch.device("cuda" if torch.cuda.is_available() and shape != "cpu-small" else "cpu"):
            model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
        model.save_pretrained(d)
        del model
    return d


def _trajectories(n_traj: int, group_size: int, prompt: int, gens: list[int], vocab: int, seed: int):
    import math
    import random

    from agentrl.trajectory import Trajectory

    g = random.Random(seed)
    out = []
    for i in range(n_traj):
        n = gens[i]
        out.append(Trajectory(
            id=f"t{i}", group_id=f"g{i // group_size}", env_id="bench",
            token_ids=[g.randrange(vocab) for _ in range(prompt + n)], loss_mask=[0] * prompt + [1] * n,
            # a random-init model is near uniform: behavior log-probs near -log V keep IS weights near 1
            logprobs=[0.0] * prompt + [-math.log(vocab) + g.gauss(0, 0.05) for _ in range(n)],
            versions=[-1] * prompt + [0] * n, prompt_len=prompt, reward=float(g.random() < 0.5),
        ))
    return out


def child(spec: dict) -> dict:
    import torch

    from agentrl.config import from_dict
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.trainer import Trainer

    cuda = spec["device"] == "cuda"
    overrides = dict(spec["trainer"])
    force_prox = overrides.pop("_force_prox_pass", False)
    cfg = from_dict(TrainerConfig, {**overrides, "device": spec["device"]}, "bench")
    tr = Trainer(cfg, spec["model_dir"])
    if force_prox:
        tr._prox_reusable = lambda: False  # measure the cost of the separate proximal pass
    emb = tr.model.get_input_embeddings().weight
    non_emb = sum(p.numel() for p in tr.model.parameters() if p is not emb)
    trajs = _trajectories(len(spec["gens"]), spec["group_size"], spec["prompt"], spec["gens"], tr.vocab_size,
                          spec["seed"])
    tokens = sum(len(t.token_ids) for t in trajs)
    out = {"non_embedding_params": non_emb, "tokens": tokens, "logprob_impl": tr.logprob_impl}
    try:
        for _ in range(spec["warmup"]):
            tr.train_step(trajs)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            before = _rss_gib()["VmRSS"]
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(spec["steps"]):
            m = tr.train_step(trajs)
            assert m["train/skipped_steps"] == 0, m
        if cuda:
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / spec["steps"]
        out.update(ok=True, s_per_step=dt, tokens_per_s=tokens / dt, prox_s=m.get("perf/prox_s", 0.0),
                   cpu_s_per_step=(time.process_time() - c0) / spec["steps"])
        if cuda:
            out["peak_gib"] = torch.cuda.max_memory_allocated() / 1024 ** 3
            peak = spec.get("peak_flops") or _peak_flops(torch.cuda.get_device_name())
            out["device_name"] = torch.cuda.get_device_name()
            if peak:
                out["mfu"] = 6 * non_emb * tokens / dt / peak
        else:
            out["peak_gib"] = _rss_gib()["VmHWM"] - before
    except torch.OutOfMemoryError as e:
        out.update(ok=False, error=f"OOM: {str(e)[:200]}")
    return out


def _run(spec: dict, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child-run", json.dumps(spec)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout:.0f} s"}
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"ok": False, "error": " / ".join(tail)[-300:] or f"exit {proc.returncode}"}
    return json.loads(line[0][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child-run", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", action="store_true", help="small shapes on the CPU")
    ap.add_argument("--models", nargs="+", default=None, help="0.5b 1.5b 3b (GPU) / cpu-small (CPU)")
    ap.add_argument("--variants", nargs="+", default=None, choices=sorted(VARIANTS))
    ap.add_argument("--lengths", nargs="+", default=["fixed", "variable"], choices=["fixed", "variable"])
    ap.add_argument("--groups", type=int, default=None)
    ap.add_argument("--group-size", type=int, default=None)
    ap.add_argument("--prompt", type=int, default=None)
    ap.add_argument("--gen", type=int, default=None)
    ap.add_argument("--var-gen", type=int, nargs=2, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s of the GPU")
    ap.add_argument("--longest", action="store_true", help="find the longest single sequence that trains")
    ap.add_argument("--longest-model", default="0.5b")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--workdir", default=None, help="where the random models are saved (reused)")
    args = ap.parse_args()
    if args.child_run:
        print("RESULT " + json.dumps(child(json.loads(args.child_run))), flush=True)
        return

    import torch

    cpu = args.cpu or not torch.cuda.is_available()
    if cpu and not args.cpu:
        print("no CUDA device: running the CPU mode (--cpu)")
    d = dict(models=["cpu-small"], variants=["default", "packed", "full-logits"], groups=2, group_size=4, prompt=64,
             gen=192, var_gen=[32, 448], steps=2) if cpu else \
        dict(models=["0.5b", "1.5b"], variants=["default"], groups=8, group_size=8, prompt=512, gen=1536,
             var_gen=[256, 2560], steps=3)
    for k in d:
        if getattr(args, k) is None:
            setattr(args, k, d[k])
    base = CPU_BASE if cpu else BASE
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_trainer_gpu_")
    n = args.groups * args.group_size
    import random

    g = random.Random(1)
    var = [g.randint(*args.var_gen) for _ in range(n)]
    load0 = open("/proc/loadavg").read().split()[:3]
    rows = []
    for shape in args.models:
        model_dir = _make_model(shape, workdir, args.prompt + max(args.gen, args.var_gen[1]))
        for lengths in args.lengths:
            gens = [args.gen] * n if lengths == "fixed" else var
            for variant in args.variants:
                spec = dict(device="cpu" if cpu else "cuda", model_dir=model_dir, trainer={**base, **VARIANTS[variant]},
                            prompt=args.prompt, gens=gens, group_size=args.group_size, seed=0, warmup=1,
                            steps=args.steps, peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None)
                r = _run(spec, args.timeout)
                r.update(model=shape, lengths=lengths, variant=variant)
                rows.append(r)
                print(json.dumps(r), flush=True)
    longest = []
    if args.longest:
        if cpu and args.longest_model != "cpu-small":
            args.longest_model = "cpu-small"
        model_dir = _make_model(args.longest_model, workdir, 131072)
        length = 2048 if cpu else 16384
        while length <= (16384 if cpu else 131072):
            spec = dict(device="cpu" if cpu else "cuda", model_dir=model_dir,
                        trainer={**base, "micro_batch_size": 1, "micro_batch_tokens": None, "max_seq_len": None},
                        prompt=512, gens=[length - 512], group_size=1, seed=0, warmup=1, steps=1, peak_flops=None)
            r = _run(spec, args.timeout)
            r.update(model=args.longest_model, length=length)
            longest.append(r)
            print(json.dumps(r), flush=True)
            if not r.get("ok"):
                break
            length *= 2
    load1 = open("/proc/loadavg").read().split()[:3]

    print(f"\nload average before/after: {' '.join(load0)} / {' '.join(load1)}; device: "
          f"{'CPU, ' + str(torch.get_num_threads()) + ' threads' if cpu else rows[0].get('device_name', 'cuda')}")
    mem = "peak RSS growth" if cpu else "peak GPU memory"
    cpu_col = " CPU s/step |" if cpu else ""
    print(f"| model | lengths | variant | log-probs | s/step | tokens/s |{cpu_col} {mem} | MFU |")
    print("| --- | --- | --- | --- | --- | --- |" + (" --- |" if cpu else "") + " --- | --- |")
    for r in rows:
        if not r.get("ok"):
            print(f"| {r['model']} | {r['lengths']} | {r['variant']} | | failed: {r.get('error', '')[:80]} | | |"
                  + (" |" if cpu else "") + " |")
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if "mfu" in r else "n/a"
        cpu_val = f" {r['cpu_s_per_step']:.2f} |" if cpu else ""
        print(f"| {r['model']} | {r['lengths']} | {r['variant']} | {r['logprob_impl']} | {r['s_per_step']:.2f} | "
              f"{r['tokens_per_s']:,.0f} |{cpu_val} {r['peak_gib']:.2f} GiB | {mfu} |")
    if longest:
        ok = [r for r in longest if r.get("ok")]
        print(f"\nlongest single sequence that trains ({args.longest_model}): "
              + (f"{ok[-1]['length']:,} tokens ({ok[-1]['peak_gib']:.1f} GiB, {ok[-1]['s_per_step']:.1f} s/step)"
                 if ok else "none tried succeeded")
              + (f"; {longest[-1]['length']:,} failed: {longest[-1].get('error', '')[:80]}"
                 if not longest[-1].get("ok") else ""))


if __name__ == "__main__":
    main()
