"""How soon the race's agentrl run (``bench_vs_trl.py``'s ToolLookup command) is training: seconds from the process's
start to the end of the evaluation before RL and to the end of RL steps 1 and N, by variant, alternating so that a
drifting host hits every variant alike.

Variants (each a fresh ``agentrl train`` process on the shared warm start):

- ``default``: as shipped (on CPU hosts the engine core forked from the driver, its worker from the engine core:
  ``agentrl/inference/vllm_executor.py``).
- ``core_spawned``: the engine core spawned as vLLM CPU spawns it, its worker forked (the twenty-eighth session's
  default).
- ``spawned``: both spawned, vLLM CPU's own way (the core as in ``core_spawned``, the worker by
  ``engine.extra_engine_args.distributed_executor_backend=mp``).

    .venv/bin/python benchmarks/bench_train_start.py --variants default core_spawned --pairs 3 --steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The CLI, with vLLM's engine core spawned rather than forked from the driver. The patch is applied as the engine
# starts: importing vllm_executor sooner would import vLLM before Ray starts, which the default does not.
SPAWN_CORE = """
import sys
from agentrl.inference import vllm_engine
start = vllm_engine.VLLMEngine._start
async def spawn_core(self):
    from agentrl.inference import vllm_executor as x
    if not hasattr(x, "forked_start_llm"):
        x.forked_start_llm = x.start_llm
        x.start_llm = lambda args, fork_core: x.forked_start_llm(args, fork_core=False)
    await start(self)
vllm_engine.VLLMEngine._start = spawn_core
from agentrl.cli import main
sys.exit(main(sys.argv[1:]))
"""
# variant -> (python's arguments before "train", config overrides)
VARIANTS = {"default": (["-m", "agentrl.cli"], []),
            "core_spawned": (["-c", SPAWN_CORE], []),
            "spawned": (["-c", SPAWN_CORE], ["engine.extra_engine_args.distributed_executor_backend=mp"])}
BEFORE = re.compile(r"^(\d\d):(\d\d):(\d\d) agentrl\.train: held-out reward before RL")


def clock_s(line_match: re.Match, t0: float) -> float:
    """Seconds from ``t0`` (epoch) to a log line's local HH:MM:SS (whole seconds: +-1 s)."""
    h, m, s = map(int, line_match.groups())
    day = time.localtime(t0)
    start = day.tm_hour * 3600 + day.tm_min * 60 + day.tm_sec + t0 % 1
    return (h * 3600 + m * 60 + s - start) % 86400


def one(variant: str, n: int, ws_model: Path, out: Path, steps: int) -> dict:
    run_dir = out / f"{variant}-{n}"
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "warmstart").mkdir(parents=True)
    os.symlink(ws_model.resolve(), run_dir / "warmstart" / "model")
    python_args, overrides = VARIANTS[variant]
    cmd = [sys.executable, *python_args, "train", str(ROOT / "configs/tooluse.yaml"), f"run_dir={run_dir}",
           "eval.episodes=128", "eval.every=0", f"steps={steps}", "checkpoint_every=100000", "progress=false",
           *overrides]
    load = os.getloadavg()[0]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    exit_s = time.time() - t0
    if p.returncode:
        sys.exit(f"{variant} run {n} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before = next(clock_s(m, t0) for line in p.stderr.splitlines() if (m := BEFORE.match(line)))
    return {"variant": variant, "eval_before_done_s": round(before, 1), "step1_s": round(rows[0]["wall_s"] - t0, 1),
            f"step{steps}_s": round(rows[-1]["wall_s"] - t0, 1), "exit_s": round(exit_s, 1), "load": round(load, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["default", "core_spawned"], choices=list(VARIANTS))
    ap.add_argument("--pairs", type=int, default=3, help="rounds; each runs every variant, the order alternating")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "runs/bench-train-start")
    ap.add_argument("--warm-start", type=Path, help="a warm-started model directory (default: made once under --out, "
                                                    "as bench_vs_trl.py makes it)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    ws_model = a.warm_start
    if ws_model is None:
        import bench_vs_trl
        import vs_trl_common

        ws_model = bench_vs_trl.make_warm_start(vs_trl_common.TASKS["tooluse"], a.out, 128)
    runs = []
    for n in range(a.pairs):
        for variant in a.variants if n % 2 == 0 else a.variants[::-1]:
            runs.append(one(variant, n, ws_model, a.out, a.steps))
            print(json.dumps(runs[-1]), flush=True)
    keys = [k for k in runs[0] if k != "variant"]
    print("\n| variant | " + " | ".join(keys) + " |\n| --- | " + " | ".join("---:" for _ in keys) + " |")
    for v in a.variants:
        mine = [r for r in runs if r["variant"] == v]
        print(f"| {v} | " + " | ".join(" / ".join(str(r[k]) for r in mine) for k in keys) + " |")


if __name__ == "__main__":
    main()
