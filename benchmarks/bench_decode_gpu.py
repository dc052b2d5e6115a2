"""A floor for the simulator's engine costs on a real GPU: one decode step and one prefill of a published model's
shape (random bf16 weights, no downloads) in plain PyTorch, timed with CUDA events, beside what
``agentrl.simulate.presets.engine_model`` predicts for the same GPU and model.

vLLM cannot be installed on the lent GPU machines (no network, and its CUDA wheel is far past what a call may carry),
so this is not vLLM: it is the step vLLM schedules, without vLLM. Each decode step (every layer: RMSNorm, fused QKV,
rotary embedding, the new K/V written into a static cache, attention over the cache, output projection, SwiGLU MLP;
then the final norm, the LM head and a greedy pick) is captured once as a CUDA graph per (batch, context) and
replayed, so there is no Python or launch cost in it; attention is PyTorch's ``scaled_dot_product_attention`` with a
decode query of length 1 per head, grouped-query heads folded into the query axis so that no K/V is copied. What
the timings measure is what the preset's three decode terms stand for: the weights read once per step
(``decode_step_s``), the per-sequence compute (``decode_step_s_per_seq``) and the KV read
(``decode_step_s_per_ktoken``). Prefill: one causal forward of ``--prefill`` tokens, against the preset's
``prefill_s_per_token``. A device-to-device copy and an 8192-cube bf16 matmul give the machine's own ceilings.

    python benchmarks/bench_decode_gpu.py --out /tmp/decode.json                  # on a GPU (prints JSON)
    .venv/bin/python benchmarks/bench_decode_gpu.py --compare /tmp/decode.json    # beside the preset, here
    .venv/bin/python benchmarks/bench_decode_gpu.py --device cpu --models tiny --batches 1 2 --contexts 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# config.json of meta-llama/Llama-3.1-8B and Qwen/Qwen2.5-7B / -1.5B (the preset's MODELS); "tiny" for the CPU.
SHAPES = {
    "Llama-3.1-8B": dict(hidden=4096, layers=32, heads=32, kv_heads=8, inter=14336, vocab=128256, bias=False,
                         tied=False),
    "Qwen2.5-7B": dict(hidden=3584, layers=28, heads=28, kv_heads=4, inter=18944, vocab=152064, bias=True,
                       tied=False),
    "Qwen2.5-1.5B": dict(hidden=1536, layers=28, heads=12, kv_heads=2, inter=8960, vocab=151936, bias=True,
                         tied=True),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, inter=128, vocab=256, bias=True, tied=True),
}


def measure(name: str, device: str, batches: list[int], contexts: list[int], prefill: int, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    s = SHAPES[name]
    hd = s["hidden"] // s["heads"]
    h, nh, nkv, L = s["hidden"], s["heads"], s["kv_heads"], s["layers"]
    group = nh // nkv
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)

    def w(*shape):
        return torch.empty(*shape, device=device, dtype=dt).normal_(0, 0.02, generator=g)  # in place: no 2x peak

    qkv_out = (nh + 2 * nkv) * hd
    layers = [dict(n1=torch.ones(h, device=device, dtype=dt), wqkv=w(h, qkv_out),
                   bqkv=w(qkv_out) if s["bias"] else None, wo=w(nh * hd, h),
                   n2=torch.ones(h, device=device, dtype=dt), wgu=w(h, 2 * s["inter"]), wd=w(s["inter"], h))
              for _ in range(L)]
    embed = w(s["vocab"], h)
    head = embed.t() if s["tied"] else w(h, s["vocab"])
    norm = torch.ones(h, device=device, dtype=dt)
    params = sum(t.numel() for lay in layers for t in lay.values() if t is not None) + embed.numel() \
        + (0 if s["tied"] else head.numel())
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))

    def angles(pos):  # once per forward, as engines look them up once per step
        ang = pos.float()[:, None] * inv[None, :]
        return ang.cos().to(dt), ang.sin().to(dt)

    def rope(x, cs):  # x: [..., T, hd]
        cos, sin = cs
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def mlp(lay, x):
        gu = F.rms_norm(x, (h,), lay["n2"]) @ lay["wgu"]
        gate, up = gu.chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ lay["wd"]

    def qkv(lay, x):
        y = F.rms_norm(x, (h,), lay["n1"]) @ lay["wqkv"]
        return y + lay["bqkv"] if lay["bqkv"] is not None else y

    def decode_step(tokens, caches, pos):
        # tokens [B]; caches: per layer (k, v) of [B, nkv, ctx + 1, hd]; pos: [1], the new token's position.
        B = tokens.shape[0]
        x = embed[tokens]
        cs = angles(pos)
        for lay, (kc, vc) in zip(layers, caches):
            q, k, v = qkv(lay, x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = rope(q.view(B, nkv, group, hd), cs)           # the group's heads as a query axis of length group
            k = rope(k.view(B, nkv, 1, hd), cs)
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v.view(B, nkv, 1, hd))
            a = F.scaled_dot_product_attention(q, kc, vc)     # every cached position is visible to the new token
            x = x + a.reshape(B, nh * hd) @ lay["wo"]
            x = mlp(lay, x)
        return (F.rms_norm(x, (h,), norm) @ head).argmax(-1)

    def linears_step(x):
        # The step's weight reads alone (every matmul, nothing else): the preset's decode_step_s stands for this.
        for lay in layers:
            x @ lay["wqkv"]
            x = x @ lay["wo"]                                 # wo is [heads x head_dim, hidden] = [h, h]
            x = (x @ lay["wgu"])[:, : s["inter"]] @ lay["wd"]
        return x @ head

    def prefill_fwd(tokens):
        T = tokens.shape[0]
        x = embed[tokens]
        cs = angles(torch.arange(T, device=device))
        for lay in layers:
            q, k, v = qkv(lay, x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = rope(q.view(T, nh, hd).transpose(0, 1), cs)[None]
            # K/V repeated per query head: a copy of T x heads x hd, small beside the step, and every backend takes it
            k = rope(k.view(T, nkv, hd).transpose(0, 1), cs).repeat_interleave(group, dim=0)[None]
            v = v.view(T, nkv, hd).transpose(0, 1).repeat_interleave(group, dim=0)[None]
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a[0].transpose(0, 1).reshape(T, nh * hd) @ lay["wo"]
            x = mlp(lay, x)
        return (F.rms_norm(x[-1:], (h,), norm) @ head).argmax(-1)

    cuda = device == "cuda"

    def timed(fn, n):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                fn()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b) / 1e3 / n
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    def graphed(run):
        """Seconds per call of ``run``, replayed from a CUDA graph on a GPU (no launch or Python cost)."""
        if cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            run = graph.replay
        run()
        return timed(run, reps)

    out = {"model": name, "params": params, "weight_bytes": params * (2 if cuda else 4), "head_dim": hd,
           "decode": [], "linears": [], "prefill": None}
    with torch.inference_mode():
        for B in batches:
            x = w(B, h)
            step = graphed(lambda: linears_step(x))
            out["linears"].append({"batch": B, "step_ms": round(step * 1e3, 4)})
            print(f"{name} linears B={B}: {step * 1e3:.3f} ms", file=sys.stderr, flush=True)
        for ctx in contexts:
            for B in batches:
                caches = [(w(B, nkv, ctx + 1, hd), w(B, nkv, ctx + 1, hd)) for _ in range(L)]
                tokens = torch.randint(0, s["vocab"], (B,), device=device, generator=g)
                pos = torch.tensor([ctx], device=device)
                step = graphed(lambda: decode_step(tokens, caches, pos))
                out["decode"].append({"batch": B, "context": ctx, "step_ms": round(step * 1e3, 4),
                                      "tokens_per_s": round(B / step, 1)})
                print(f"{name} decode B={B} ctx={ctx}: {step * 1e3:.3f} ms", file=sys.stderr, flush=True)
                del caches
                if cuda:
                    torch.cuda.empty_cache()
        toks = torch.randint(0, s["vocab"], (prefill,), device=device, generator=g)
        prefill_fwd(toks)
        t = timed(lambda: prefill_fwd(toks), max(2, reps // 10))
        out["prefill"] = {"tokens": prefill, "s": round(t, 5), "tokens_per_s": round(prefill / t, 1)}
        print(f"{name} prefill {prefill}: {t * 1e3:.2f} ms", file=sys.stderr, flush=True)
    return out


def ceilings(device: str) -> dict:
    """The machine's own copy bandwidth and bf16 matmul rate (each the mean of 10 after warm-up)."""
    import torch
    if device != "cuda":
        return {}
    a = torch.empty(4 * 2 ** 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    res = {}
    for label, fn, work in (("copy_bytes_per_s", lambda: b.copy_(a), 2 * a.numel()),
                            ("bf16_flops", lambda: x @ x, 2 * 8192 ** 3)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            fn()
        e1.record()
        torch.cuda.synchronize()
        res[label] = work / (e0.elapsed_time(e1) / 1e3 / 10)
    res["gpu"] = torch.cuda.get_device_name()
    res["torch"] = torch.__version__
    return res


def compare(path: str, gpu: str) -> None:
    """The measured floors beside the preset's prediction for the same model on ``gpu``: a markdown table."""
    sys.path.insert(0, ".")
    from agentrl.simulate.presets import MODELS, Hardware, engine_model
    data = json.load(open(path))
    print(f"machine: {data['ceilings'].get('gpu')}, copy {data['ceilings'].get('copy_bytes_per_s', 0) / 1e12:.2f} "
          f"TB/s, bf16 matmul {data['ceilings'].get('bf16_flops', 0) / 1e12:.0f} TFLOP/s\n")
    print("| model | batch | context | measured step ms | preset step ms | preset / measured |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for m in data["models"]:
        if m["model"] not in MODELS:
            continue
        em = engine_model(Hardware(gpu=gpu, model=m["model"]))
        for d in m["decode"]:
            pred = (em.decode_step_s + d["batch"] * (em.decode_step_s_per_seq
                                                     + em.decode_step_s_per_ktoken * d["context"] / 1000)) * 1e3
            print(f"| {m['model']} | {d['batch']} | {d['context']} | {d['step_ms']:.2f} | {pred:.2f} | "
                  f"{pred / d['step_ms']:.2f} |")
        for d in m["linears"]:
            bw = m["weight_bytes"] / (d["step_ms"] / 1e3)
            print(f"| {m['model']} | {d['batch']} | matmuls only | {d['step_ms']:.2f} | "
                  f"{em.decode_step_s * 1e3:.2f} (weights) | {em.decode_step_s * 1e3 / d['step_ms']:.2f} "
                  f"({bw / 1e12:.2f} TB/s) |")
        p = m["prefill"]
        pred = em.prefill_s_per_token * p["tokens"]
        print(f"| {m['model']} | prefill | {p['tokens']} | {p['s'] * 1e3:.1f} | {pred * 1e3:.1f} | "
              f"{pred / p['s']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--models", nargs="+", default=["Llama-3.1-8B", "Qwen2.5-7B", "Qwen2.5-1.5B"],
                    choices=list(SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--contexts", nargs="+", type=int, default=[512, 2048])
    ap.add_argument("--prefill", type=int, default=4096, help="tokens of the one timed prefill")
    ap.add_argument("--reps", type=int, default=50, help="graph replays per decode timing")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--compare", metavar="JSON", help="print a saved run beside the preset and exit")
    ap.add_argument("--gpu", default="H200", help="the preset's GPU name for --compare")
    args = ap.parse_args()
    if args.compare:
        compare(args.compare, args.gpu)
        return
    res = {"ceilings": ceilings(args.device), "models": [
        measure(m, args.device, args.batches, args.contexts, args.prefill, args.reps) for m in args.models]}
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
