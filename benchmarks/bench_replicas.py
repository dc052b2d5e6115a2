"""Rollout tokens/s with engine replicas, on the CPU: the in-driver engine (``engine.replicas: 1``), the same single
engine inside a Ray actor (what ``replicas: 1`` would cost if it always used an actor), and two replicas
(``engine.replicas: 2``), on the same agent-loop episodes in one run.

The episodes: ``--episodes`` concurrent episodes of ``--turns`` turns through ``EnvManager`` + ``AgentLoopPolicy``
(envs in the driver), each turn generating exactly ``--tokens`` tokens (``ignore_eos``) against a zero-latency env,
so every configuration generates the same number of tokens and only the engine side differs. The in-driver engine
stays up for the whole run; each other configuration is started in turn (one warm-up round each), and its
``--repeats`` timed rounds alternate with rounds of the in-driver engine, so both see the same machine load (this
machine is shared). Figures: generated tokens over wall time per round (median, min-max) and the median of the
per-pair ratios; the load average is read before and after each configuration.

    .venv/bin/python benchmarks/bench_replicas.py                       # markdown table on stdout
    .venv/bin/python benchmarks/bench_replicas.py --episodes 32 --repeats 1 --json out.json
    .venv/bin/python benchmarks/bench_replicas.py --configs 2-replicas --replica-bind nobind
    .venv/bin/python benchmarks/bench_replicas.py --hidden 1024 --layers 8   # a model whose compute dominates

``--replica-bind``: ``split`` (what ``ReplicatedEngine`` does: the replicas of a node split its cores) or
``nobind`` (``VLLM_CPU_OMP_THREADS_BIND=nobind`` for the replicas: the OS schedules their threads). The in-driver
engine always uses vLLM's own binding. ``--hidden``/``--layers`` build a bigger random model of the tiny model's
family into a temporary directory (the default is the tiny model itself, whose decode step is all overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agentrl.core import Env  # noqa: E402

ENV_REPLY = "Lower than 9. 3 guesses left."


class FixedTurnsEnv(Env):
    """Replies ``ENV_REPLY`` to every action; terminates after ``turns`` steps. Async, zero latency."""

    def __init__(self, turns: int = 4):
        super().__init__()
        self.turns, self.t = turns, 0

    async def areset(self, *, seed=None, options=None):
        self.t = 0
        return [{"role": "system", "content": "Guess my secret integer between 1 and 16."},
                {"role": "user", "content": f"Guess the number. Game {seed}."}], {}

    async def astep(self, action: str):
        self.t += 1
        return [{"role": "user", "content": ENV_REPLY}], 0.0, self.t >= self.turns, False, {}


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


async def rollout_round(engine: Any, tok: Any, args: argparse.Namespace, tag: str) -> dict[str, float]:
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig

    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=args.tokens, ignore_eos=True, max_turns=args.turns + 1,
                        max_context_tokens=4096)
    policy = AgentLoopPolicy(engine, tok, cfg)
    specs = [EpisodeSpec(f"{__name__}:FixedTurnsEnv", env_kwargs={"turns": args.turns}, seed=i, group_id=f"{tag}-{i}")
             for i in range(args.episodes)]
    t0 = time.perf_counter()
    async with EnvManager(ManagerConfig(max_concurrency=args.episodes, max_turns=args.turns + 1), policy) as mgr:
        trajs = await mgr.run_episodes(specs)
    dt = time.perf_counter() - t0
    bad = [t.error for t in trajs if t.termination != "terminated"]
    if bad:
        raise RuntimeError(f"episodes failed: {bad[:2]}")
    n = sum(t.num_generated for t in trajs)
    return {"tokens": n, "wall_s": dt, "tok_per_s": n / dt}


async def start(make: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    engine = await asyncio.to_thread(make)
    return engine, time.perf_counter() - t0


async def warm(engine: Any, tok: Any, args: argparse.Namespace, tag: str) -> None:
    await rollout_round(engine, tok, argparse.Namespace(**{**vars(args), "episodes": min(args.episodes, 16),
                                                            "turns": 2}), f"{tag}-warm")


def summary(name: str, start_s: float, rounds: list[dict[str, float]], load: tuple[float, float],
            ratios: list[float] | None) -> dict[str, Any]:
    rates = [x["tok_per_s"] for x in rounds]
    return {"config": name, "start_s": start_s, "rounds": rounds, "median_tok_per_s": statistics.median(rates),
            "min_tok_per_s": min(rates), "max_tok_per_s": max(rates), "load_before": load[0], "load_after": load[1],
            "tokens_per_round": rounds[0]["tokens"],
            "ratio_vs_in_driver": statistics.median(ratios) if ratios else 1.0, "pair_ratios": ratios or []}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from agentrl import raystart
    from agentrl.chat import load_tokenizer
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.replicas import ReplicatedEngine
    from agentrl.inference.vllm_engine import VLLMEngine
    from agentrl.models import ensure_tiny_model

    tmp = None
    if args.hidden or args.layers:
        import tempfile

        from agentrl.models.tiny import TinyModelSpec, build_tiny_model

        tmp = tempfile.TemporaryDirectory(prefix="agentrl-bench-model-")
        spec = TinyModelSpec(hidden_size=args.hidden or 128, intermediate_size=3 * (args.hidden or 128),
                             num_hidden_layers=args.layers or 2, num_attention_heads=max(2, (args.hidden or 128) // 64))
        model = str(build_tiny_model(tmp.name, spec=spec))
    else:
        model = args.model or str(ensure_tiny_model())
    tok = load_tokenizer(model)
    base = EngineConfig(model=model, max_model_len=max(1024, 64 + args.turns * (args.tokens + 48)),
                        max_num_seqs=max(args.episodes, 16))
    raystart.init(num_cpus=args.ray_cpus)
    others = {
        "1-actor": lambda: ReplicatedEngine(base),  # replicas: 1, but in a Ray actor
        "2-replicas": lambda: ReplicatedEngine(dataclasses.replace(base, replicas=2)),
    }
    if args.replica_bind == "nobind":
        # Read by ReplicatedEngine when it starts the replicas (the in-driver engine is started before this).
        def with_nobind(make: Any) -> Any:
            def run() -> Any:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
                try:
                    return make()
                finally:
                    del os.environ["VLLM_CPU_OMP_THREADS_BIND"]
            return run

        others = {k: with_nobind(v) for k, v in others.items()}
    out: list[dict[str, Any]] = []
    ref_rounds: list[dict[str, float]] = []
    load0 = loadavg()
    driver, driver_start = await start(lambda: VLLMEngine(base))
    try:
        await warm(driver, tok, args, "in-driver")
        for name in args.configs:
            load_before = loadavg()
            engine, start_s = await start(others[name])
            try:
                await warm(engine, tok, args, name)
                rounds, ratios = [], []
                for r in range(args.repeats):
                    a = await rollout_round(driver, tok, args, f"in-driver-{name}-{r}")
                    b = await rollout_round(engine, tok, args, f"{name}-{r}")
                    ref_rounds.append(a)
                    rounds.append(b)
                    ratios.append(b["tok_per_s"] / a["tok_per_s"])
                    print(f"round {r}: in-driver {a['tok_per_s']:.0f} tok/s, {name} {b['tok_per_s']:.0f} tok/s, "
                          f"load {loadavg():.1f}", file=sys.stderr)
            finally:
                await engine.close()
            out.append(summary(name, start_s, rounds, (load_before, loadavg()), ratios))
    finally:
        await driver.close()
        ray.shutdown()
        if tmp is not None:
            tmp.cleanup()
    out.insert(0, summary("in-driver", driver_start, ref_rounds, (load0, loadavg()), None))
    return {"episodes": args.episodes, "turns": args.turns, "tokens_per_turn": args.tokens, "repeats": args.repeats,
            "cores": os.cpu_count(), "replica_bind": args.replica_bind, "model": model if tmp is None else
            f"random Qwen2, hidden {args.hidden or 128}, {args.layers or 2} layers", "results": out}


def table(res: dict[str, Any]) -> str:
    lines = [f"{res['episodes']} episodes x {res['turns']} turns x {res['tokens_per_turn']} tokens "
             f"({res['results'][0]['tokens_per_round']} generated tokens per round), {res['repeats']} rounds, "
             f"{res['cores']} cores, model {res['model']}, replica binding {res['replica_bind']}", "",
             "| engine | start (s) | rollout tok/s, median (min-max) | vs in-driver (median of paired rounds) | load avg before / after |",
             "| --- | --- | --- | --- | --- |"]
    for r in res["results"]:
        lines.append(f"| {r['config']} | {r['start_s']:.0f} | {r['median_tok_per_s']:.0f} "
                     f"({r['min_tok_per_s']:.0f}-{r['max_tok_per_s']:.0f}) | {r['ratio_vs_in_driver']:.2f}x | "
                     f"{r['load_before']:.1f} / {r['load_after']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="generated tokens per turn (exact, ignore_eos)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray-cpus", type=int, default=None, help="Ray's logical CPUs (default: the machine's cores)")
    p.add_argument("--configs", nargs="+", default=["1-actor", "2-replicas"], choices=["1-actor", "2-replicas"],
                   help="compared with the in-driver engine, which runs throughout")
    p.add_argument("--replica-bind", choices=["split", "nobind"], default="split")
    p.add_argument("--hidden", type=int, default=0, help="build a random model with this hidden size (default: tiny)")
    p.add_argument("--layers", type=int, default=0, help="... and this many layers")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    res = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
