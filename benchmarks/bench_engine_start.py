"""The in-process vLLM engine's start-up and decode speed by ``EngineConfig.executor``: ``auto`` (on CPU hosts the
engine core forked from the driver and the worker in a process of its own, forked from the engine core:
``agentrl.inference.vllm_executor``) against ``in_core`` (the worker inside the engine-core process), ``core_spawned``
(``auto`` with the engine core spawned, as vLLM CPU spawns it) and ``spawned`` (vLLM CPU's own choice for both, the
baseline; ``engine.extra_engine_args.distributed_executor_backend=mp``).

Each run is a fresh process (start-up includes vLLM's imports and process spawns); executors alternate so that a
drifting host hits both alike. Per run: seconds until the engine is ready, then tokens/s of 6 rounds of 96 sampled
tokens each at batch 1, 8 and 32 (50-token prompts, seeded requests, as the agent loop sends them).

    .venv/bin/python benchmarks/bench_engine_start.py --executors auto core_spawned spawned in_core --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

BATCHES = (1, 8, 32)


# name -> (EngineConfig.executor, extra engine args, the executor vLLM must then run, engine core forked)
EXECUTORS = {"auto": ("auto", {}, "ForkedWorkerExecutor", True),
             "in_core": ("in_core", {}, "UniProcExecutor", True),
             "core_spawned": ("auto", {}, "ForkedWorkerExecutor", False),
             "spawned": ("auto", {"distributed_executor_backend": "mp"}, "mp", False)}


def child(name: str) -> dict:
    t0 = time.perf_counter()
    from agentrl.inference import EngineConfig
    from agentrl.inference.base import SamplingParams
    from agentrl.inference.vllm_engine import VLLMEngine
    from agentrl.models import ensure_tiny_model

    executor, extra, expected, fork_core = EXECUTORS[name]
    if not fork_core:
        from agentrl.inference import vllm_executor

        forked = vllm_executor.start_llm
        vllm_executor.start_llm = lambda args, fork_core: forked(args, fork_core=False)
    model = str(ensure_tiny_model(variant="tiny-tool"))
    eng = VLLMEngine(EngineConfig(model=model, max_model_len=2048, seed=0, executor=executor,
                                  extra_engine_args=extra))
    ready_s = time.perf_counter() - t0
    used = eng._llm.vllm_config.parallel_config.distributed_executor_backend
    if getattr(used, "__name__", used) != expected:
        raise RuntimeError(f"asked for executor {name!r}, vLLM runs {used!r}")
    if expected == "ForkedWorkerExecutor":
        (worker,) = eng._run_sync(eng._on_engine(eng._llm.collective_rpc("agentrl_process")))
        if (worker["core_forked_from"] == os.getpid()) != fork_core:
            raise RuntimeError(f"{name!r}: engine core forked from {worker['core_forked_from']}, not as asked")

    async def rounds() -> dict[int, float]:
        out = {}
        for n in BATCHES:
            ts = time.perf_counter()
            for k in range(6):
                await asyncio.gather(*[
                    eng.generate(list(range(10, 60)), SamplingParams(max_tokens=96, ignore_eos=True, seed=i),
                                 request_id=f"b{n}-{k}-{i}") for i in range(n)])
            out[n] = 6 * n * 96 / (time.perf_counter() - ts)
        return out

    tok_s = asyncio.run(rounds())
    tc = time.perf_counter()
    eng.close_sync()
    close_s = time.perf_counter() - tc
    return {"executor": name, "ready_s": round(ready_s, 1), "engine_start_s": round(eng.start_time_s, 1),
            "close_s": round(close_s, 1),
            "tok_per_s": {str(n): round(v, 1) for n, v in tok_s.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executors", nargs="+", default=["auto", "core_spawned", "in_core"], choices=list(EXECUTORS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child)), flush=True)
        return
    runs = []
    for r in range(args.repeats):
        for ex in args.executors:
            out = subprocess.run([sys.executable, __file__, "--child", ex], capture_output=True, text=True)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode or not line:
                sys.exit(f"{ex} run {r} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            runs.append(json.loads(line[0][7:]) | {"load": round(os.getloadavg()[0], 2)})
            print(json.dumps(runs[-1]), flush=True)
    print("\n| executor | ready s | close s | " + " | ".join(f"tok/s at {n}" for n in BATCHES) + " | load |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in BATCHES) + " | ---: |")
    for run in runs:
        print(f"| {run['executor']} | {run['ready_s']} | {run['close_s']} | "
              + " | ".join(str(run['tok_per_s'][str(n)]) for n in BATCHES) + f" | {run['load']} |")


if __name__ == "__main__":
    main()
