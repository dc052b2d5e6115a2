"""Validates the simulator's engine model against the real CPU vLLM engine, in one process (no Ray).

Calibrates :class:`agentrl.simulate.engine.EngineModel` on this machine from fixed-length batches at two
concurrencies (``--fit``), then predicts what it was not fitted on: fixed-length batches at other concurrencies
(``--check``) and a mixed workload (``--mixed`` requests whose lengths are lognormal, all sent at once, as a rollout
step sends them), and prints predicted vs measured seconds. Load averages are printed at start and end: the machine
is shared, and every figure is wall time.

    .venv/bin/python benchmarks/bench_simulate_engine.py --model /path/to/model [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


async def main(args: argparse.Namespace) -> dict:
    from agentrl.inference.base import SamplingParams
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.vllm_engine import VLLMEngine
    from agentrl.simulate import run_virtual
    from agentrl.simulate.engine import EngineModel, SimEngine

    out: dict = {"load_start": os.getloadavg()}
    eng = await VLLMEngine.create(EngineConfig(model=args.model, max_model_len=1024, kv_cache_space_gib=1))
    rng = random.Random(0)
    ids = iter(range(10**9))
    P = args.prompt

    async def batch(lengths: list[int]) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*[eng.generate([rng.randrange(10, 1000) for _ in range(P)],
                                            SamplingParams(max_tokens=n, ignore_eos=True), request_id=f"v{next(ids)}")
                               for n in lengths])
        return time.perf_counter() - t0

    async def timed(lengths: list[int]) -> float:
        return statistics.median([await batch(lengths) for _ in range(args.reps)])

    try:
        await batch([8] * 8)  # warm-up
        D = args.decode
        one = {n: await timed([1] * n) for n in args.fit}
        more = {n: await timed([1 + D] * n) for n in args.fit}
        steps = {n: (more[n] - one[n]) / D for n in args.fit}
        (n1, n2) = args.fit
        b = max(0.0, (steps[n2] - steps[n1]) / (n2 - n1))
        a = max(0.0, steps[n1] - b * n1)
        # one[n] = n x (request + P x prefill) + one decode step at batch n (the serialised prefill of the model)
        per_req = max(0.0, (one[n2] - one[n1] - (a + b * n2) + (a + b * n1)) / (n2 - n1))
        model = EngineModel(request_s=per_req, decode_step_s=a, decode_step_s_per_seq=b, chunk=1)
        out["calibration"] = {"decode_step_s": a, "decode_step_s_per_seq": b, "request_plus_prefill_s": per_req,
                              "fit_batches": args.fit}

        def predict(lengths: list[int]) -> float:  # on a thread: a virtual loop of its own
            sim = SimEngine(model)

            async def go():
                await asyncio.gather(*[sim.generate_tokens(P, n) for n in lengths])

            return run_virtual(go())[1]

        rows = []
        for n in args.check:
            lengths = [1 + D] * n
            rows.append({"workload": f"{n} x {1 + D} tokens", "measured_s": await timed(lengths),
                         "predicted_s": await asyncio.to_thread(predict, lengths)})
        mixed = [max(1, min(args.max_len, round(rng.lognormvariate(2.5, 0.9)))) for _ in range(args.mixed)]
        rows.append({"workload": f"{args.mixed} mixed (lognormal, median 12, max {max(mixed)})",
                     "measured_s": await timed(mixed), "predicted_s": await asyncio.to_thread(predict, mixed)})
        for r in rows:
            r["error"] = r["predicted_s"] / r["measured_s"] - 1
        out["rows"] = rows
    finally:
        await eng.close()
    out["load_end"] = os.getloadavg()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/quickstart/warmstart/model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=120)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--fit", type=int, nargs=2, default=[1, 32])
    ap.add_argument("--check", type=int, nargs="*", default=[8, 64])
    ap.add_argument("--mixed", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=96)
    res = asyncio.run(main(ap.parse_args()))
    print(json.dumps(res, indent=2))
    print("| workload | measured (s) | predicted (s) | error |")
    print("| --- | --- | --- | --- |")
    for r in res["rows"]:
        print(f"| {r['workload']} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | {100 * r['error']:+.0f} % |")
    print(f"load average start {res['load_start']}, end {res['load_end']}")
