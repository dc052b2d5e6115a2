"""Validates the simulator against real CPU runs: measure the engine's and the trainer's cost parameters on this
machine, run the schedulers benchmark's variants for real, then simulate each variant with the measured costs and
compare the mean seconds per step.

    .venv/bin/python benchmarks/bench_simulate_validate.py --out /tmp/simval            # calibrate, run, predict
    .venv/bin/python benchmarks/bench_simulate_validate.py --out /tmp/simval --predict-only
    .venv/bin/python benchmarks/bench_simulate_validate.py --out /tmp/simval --rounds 3   # all of it 3 times, pooled

Phases (each writes under ``--out``):

1. ``calibration.json``: the real CPU vLLM engine of ``configs/quickstart.yaml`` (with ``--model``) and the real
   trainer actor. Engine: ``n`` concurrent requests of random prompts (no prefix-cache hits) generating 1 and
   ``1 + D`` tokens; the difference over ``D`` is the decode step at batch ``n``, fitted as ``a + b n``; one request
   with a short and a long prompt gives the prefill cost per token, and what is left of a one-token request is the
   fixed per-request cost. Weight sync: the controller's ``WeightSync.push``. Trainer: ``train_step`` on 64
   synthetic trajectories in 5 shapes that vary padded and real tokens apart, fitted as ``overhead + a padded +
   b real`` with every coefficient >= 0 (:func:`fit_trainer`, at prediction time; the trainer pads each
   micro-batch to its longest row, its log-prob head sees real positions only).
   Contention (the 2 cores are shared): the manager's rollout of 64 zero-latency episodes of the benchmark's env,
   timed alone and while the trainer trains (the engine's slowdown), and a trainer step timed alone and beside
   streams of zero-latency episodes holding 16, 64 and ``max_concurrency`` in flight, fitted as slowdown = ``a + k
   x`` requests running (the driver's agent loops compete for the cores too, which a bare decode loop leaves out).
   The driver's own CPU per turn (:func:`measure_driver`, no model) is recorded too: 0.5-1.9 ms here, too little
   to be a cost of its own.
2. ``real.json``: ``benchmarks/bench_schedulers.py`` for ``--variants`` (its run dirs keep each run's
   ``trajectories.jsonl``).
3. the table: each variant simulated with the calibration, the benchmark's env latency (lognormal, median
   ``--latency``, sigma 1, capped at 20x) and the lengths of that variant's own trained trajectories (turn counts and
   generated tokens replayed; prompt and per-turn observation tokens fitted from them); the prediction is the mean
   simulated seconds per step against the real mean ``time/step_s``.

The machine is shared: the load average is recorded at every phase; calibrate right before the real runs.
Results (RESULTS-simulate.md), sync / alpha2 / stream / tail, 14 steps per variant: +2 / +8 / -21 / +10 % while
the simulated trainer ran the streamed steps' queued ``accumulate`` calls side by side; +2 / +12 / -15 / +10 % once
they run one at a time, as on the real actor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fit_trainer(rows: dict[str, dict]) -> dict[str, float]:
    """``step_s = o + a padded + b real`` by least squares with every coefficient >= 0: a coefficient the free fit
    makes negative is dropped and the rest refitted. (Clamping a negative intercept to 0 after the fit, as this
    script first did, shifted every prediction up by the intercept: +0.16-0.20 s per step on this machine.)"""
    X = np.array([[1.0, r["padded"], r["real"]] for r in rows.values()])
    y = np.array([r["step_s"] for r in rows.values()])
    keep = [0, 1, 2]
    while True:
        c, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
        if (c >= 0).all() or len(keep) == 1:
            break
        del keep[int(np.argmin(c))]
    coef = [0.0, 0.0, 0.0]
    for i, v in zip(keep, c):
        coef[i] = max(0.0, float(v))
    return {"step_overhead_s": coef[0], "s_per_padded_token": coef[1], "s_per_real_token": coef[2]}


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


async def calibrate(model: str, reps: int, max_turns: int) -> dict:
    import ray
    from agentrl import raystart

    from agentrl.controller.run import load_config
    from agentrl.controller.weights import WeightSync
    from agentrl.inference.base import SamplingParams
    from agentrl.inference.factory import make_engine
    from agentrl.trainer.dp_group import create_trainer, stop_trainer
    from agentrl.simulate.models import TrainerModel
    from agentrl.trajectory import Group, Trajectory

    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [f"engine.model={model}"])
    out: dict = {"load_start": _load()}
    raystart.init(num_cpus=cfg.ray_num_cpus)
    trainer = create_trainer(cfg.trainer_config(), model, num_cpus=cfg.trainer_num_cpus)
    engine = make_engine(cfg.engine)
    rng = random.Random(0)
    ids = iter(range(10**9))

    async def batch(n: int, prompt: int, tokens: int) -> float:
        sp = SamplingParams(max_tokens=tokens, ignore_eos=True)
        t0 = time.perf_counter()
        await asyncio.gather(*[engine.generate([rng.randrange(10, 1000) for _ in range(prompt)], sp,
                                               request_id=f"cal-{next(ids)}") for _ in range(n)])
        return time.perf_counter() - t0

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    try:
        weights = WeightSync(trainer, engine)
        await weights.start()
        await batch(8, 120, 8)  # warm-up
        D, P = 16, 120
        steps = {}
        for n in (1, 8, 32, 64):
            one = med([await batch(n, P, 1) for _ in range(reps)])
            more = med([await batch(n, P, 1 + D) for _ in range(reps)])
            steps[n] = (more - one) / D
        a, b = _fit(list(steps), list(steps.values()))
        short = med([await batch(1, 20, 1) for _ in range(reps)])
        long = med([await batch(1, 620, 1) for _ in range(reps)])
        prefill = max(0.0, (long - short) / 600)
        request = max(0.0, short - 20 * prefill - (a + b))
        sync = []
        for v in range(reps):
            t0 = time.perf_counter()
            await weights.push(v + 1)
            sync.append(time.perf_counter() - t0)
        print("engine steps by batch:", steps, flush=True)
        out["engine"] = {"decode_step_s_by_batch": steps, "decode_step_s": max(0.0, a),
                         "decode_step_s_per_seq": max(0.0, b), "prefill_s_per_token": prefill, "request_s": request,
                         "sync_s": med(sync)}

        def groups(lengths: list[int], prompt: int = 40) -> list:
            """8 groups of 8 synthetic trajectories of the given total lengths (64 values), ``prompt`` of each
            not trained."""
            out_g = []
            for g in range(8):
                trajs = []
                for i in range(8):
                    n = lengths[8 * g + i]
                    p = min(prompt, n - 1)
                    trajs.append(Trajectory(id=f"t{g}.{i}", group_id=f"g{g}", env_id="cal",
                                            token_ids=[rng.randrange(10, 1000) for _ in range(n)],
                                            loss_mask=[0] * p + [1] * (n - p),
                                            logprobs=[0.0] * p + [-3.0] * (n - p), versions=[-1] * p + [0] * (n - p),
                                            reward=float(i % 2)))
                out_g.append(Group(id=f"g{g}", trajectories=trajs))
            return out_g

        async def step(gs: list) -> float:
            t0 = time.perf_counter()
            await trainer.train_step.remote(gs)
            return time.perf_counter() - t0

        # The trainer pads each micro-batch to its longest row (quickstart: one micro-batch of 64), and its head sees
        # real positions only: shapes that vary padded and real tokens apart fit step = o + a padded + b real.
        mb = cfg.trainer.micro_batch_size
        shapes = {"uniform120": [120] * 64, "uniform320": [320] * 64, "one_long": [320] + [60] * 63,
                  "quarter_long": [320] * 16 + [100] * 48, "uniform200": [200] * 64}
        await step(groups(shapes["uniform120"]))  # warm-up
        fit_rows = {}
        for name, ls in shapes.items():
            t = med([await step(groups(ls)) for _ in range(reps)])
            padded = TrainerModel(micro_batch_size=mb).padded_tokens(ls)  # the simulator's own count
            fit_rows[name] = {"padded": padded, "real": sum(ls), "step_s": t}
        print("trainer steps:", fit_rows, flush=True)
        out["trainer"] = {"micro_batch_size": mb, "steps": fit_rows}

        # Contention, measured under the load a real run puts beside the trainer: the manager playing 64 episodes of
        # the benchmark's env (zero latency: every second of it is CPU, engine and driver) on the engine. A bare
        # decode loop (the first version of this calibration) left the driver idle and measured a 1.2x trainer
        # slowdown where the real alpha2 run showed 3x.
        from agentrl.manager import EnvManager, EpisodeSpec

        ENV_ID, policy, mcfg = rollout_parts(cfg, engine, max_turns)
        seeds = iter(range(10**6, 2 * 10**6))
        big = groups([320] * 16 + [100] * 48)
        t_big = fit_rows["quarter_long"]["step_s"]

        async with EnvManager(mcfg, policy) as mgr:
            async def rollout() -> float:
                specs = [EpisodeSpec(ENV_ID, env_kwargs={"latency_s": 0.0}, seed=next(seeds)) for _ in range(64)]
                t0 = time.perf_counter()
                await mgr.run_episodes(specs)
                return time.perf_counter() - t0

            await rollout()  # warm-up
            alone = med([await rollout() for _ in range(reps)])
            stop = asyncio.Event()

            async def keep(fn) -> None:
                while not stop.is_set():
                    await fn()

            bg = asyncio.create_task(keep(lambda: step(big)))
            during = med([await rollout() for _ in range(reps)])
            stop.set()
            await bg
            stop.clear()
            bg = asyncio.create_task(keep(rollout))
            t_during = med([await step(big) for _ in range(reps)])
            stop.set()
            await bg

        # The trainer's slowdown against the requests the engine runs: a rollout of 64 ends in a tail of a few
        # episodes, so the loop above loads the cores less than a run that keeps max_concurrency in flight (alpha = 2
        # here: 128). A stream of zero-latency episodes at each level of concurrency (all of them in the engine
        # nearly all the time) holds that many; fitted as slowdown = a + k x running requests.
        async def saturate(m) -> None:
            specs = [EpisodeSpec(ENV_ID, env_kwargs={"latency_s": 0.0}, seed=next(seeds)) for _ in range(20_000)]
            async with contextlib.aclosing(m.stream_episodes(specs)) as stream:
                async for _ in stream:
                    if stop.is_set():
                        break

        by_level = {}
        for n in sorted({16, 64, mcfg.max_concurrency}):
            async with EnvManager(dataclasses.replace(mcfg, max_concurrency=n), policy) as m:
                stop.clear()
                bg = asyncio.create_task(saturate(m))
                by_level[n] = med([await step(big) for _ in range(reps)]) / t_big
                stop.set()
                await bg
        print("trainer slowdown by requests in flight:", by_level, flush=True)
        base, per_request = _fit(list(by_level), list(by_level.values()))
        out["driver"] = await measure_driver(cfg, max_turns, reps)
        out["contention"] = {"rollout_alone_s": alone, "rollout_during_training_s": during,
                             "slowdown_while_training": max(1.0, during / alone),
                             "trainer_step_alone_s": t_big, "trainer_step_during_64_episode_rollouts_s": t_during,
                             "trainer_slowdown_by_requests_in_flight": by_level,
                             "slowdown_while_generating": max(1.0, base),
                             "slowdown_per_running_request": max(0.0, per_request)}
    finally:
        await engine.close()
        stop_trainer(trainer)
        ray.shutdown()
    out["load_end"] = _load()
    return out


def rollout_parts(cfg, engine, max_turns: int) -> tuple:
    """The benchmark's env (registered), the agent loop on ``engine`` and the manager config of a rollout of it:
    (env id, policy, ManagerConfig)."""
    import agentrl
    from agentrl.agent.loop import AgentLoopPolicy
    from agentrl.controller.run import run_tokenizer
    from agentrl.manager import ManagerConfig

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_schedulers import ENV_ID, LatencyFrozenLake

    if ENV_ID not in agentrl.registered_ids():
        agentrl.register(ENV_ID, entry_point=LatencyFrozenLake, max_episode_steps=max_turns)
    policy = AgentLoopPolicy(engine, run_tokenizer(cfg.engine), dataclasses.replace(cfg.rollout, max_turns=max_turns))
    return ENV_ID, policy, ManagerConfig.of(dataclasses.replace(cfg.manager, workers=0, max_turns=max_turns))


async def measure_driver(cfg, max_turns: int, reps: int) -> dict:
    """The driver's own CPU per agent-loop turn: the manager plays 64 zero-latency episodes of the benchmark's env
    through the real agent loop against an engine that answers at once (``bench_gateway.InstantEngine``: no model,
    so what is left is rendering, tokenising, parsing, the manager and the env); this process's CPU time over the
    turns played, the median of ``reps``."""
    from agentrl.controller.run import run_tokenizer
    from agentrl.manager import EnvManager, EpisodeSpec

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_gateway import InstantEngine

    instant = InstantEngine(run_tokenizer(cfg.engine), cfg.engine.max_model_len)
    ENV_ID, policy, mcfg = rollout_parts(cfg, instant, max_turns)
    seeds = iter(range(2 * 10**6, 3 * 10**6))
    per_turn, turns = [], 0
    async with EnvManager(mcfg, policy) as mgr:
        for rep in range(reps + 1):  # the first warms up
            specs = [EpisodeSpec(ENV_ID, env_kwargs={"latency_s": 0.0}, seed=next(seeds)) for _ in range(64)]
            c0 = time.process_time()
            trajs = await mgr.run_episodes(specs)
            cpu = time.process_time() - c0
            turns = sum(t.num_turns for t in trajs)
            if rep:
                per_turn.append(cpu / max(1, turns))
    print(f"driver CPU per turn: {[round(1e3 * x, 3) for x in per_turn]} ms ({turns} turns a rollout)", flush=True)
    return {"turn_s": statistics.median(per_turn), "turns_per_rollout": turns}


def _shape(trajs_path: Path) -> tuple[int, int]:
    """Prompt tokens and observation tokens per later turn, fitted from ``tokens - generated = p + o (turns - 1)``."""
    xs, ys = [], []
    for line in trajs_path.read_text().splitlines():
        s = json.loads(line)["summary"]
        xs.append(s["turns"] - 1)
        ys.append(s["tokens"] - s["generated"])
    if len(set(xs)) < 2:
        return round(statistics.fmean(ys)), 0
    p, o = _fit(xs, ys)
    return max(0, round(p)), max(0, round(o))


def predict(real: list[dict], cal: dict, out: Path, latency: float, max_turns: int, budget: int, extra: int,
            seed: int) -> list[dict]:
    from agentrl.simulate.models import EngineModel, ResponseModel, TrainerModel
    from agentrl.simulate.run import SimulationConfig, simulate

    e, c = cal["engine"], cal["contention"]
    t = {**fit_trainer(cal["trainer"]["steps"]), "micro_batch_size": cal["trainer"]["micro_batch_size"]}
    mean = latency * math.exp(0.5)  # lognormal(log latency, 1)
    sd = mean * math.sqrt(math.e - 1)
    rows = []
    for r in real:
        trajs = out / "real" / r["name"] / "trajectories.jsonl"
        prompt, obs = _shape(trajs)
        run = {"steps": len(r["step_s"]), "seed": seed,
               "manager": {"num_groups": 8, "group_size": 8, "max_concurrency": 128, "max_turns": max_turns},
               "env": {"id": "sim/Env-v0",
                       "kwargs": {"turns": 0, "latency": mean, "latency_sigma": sd, "latency_dist": "lognormal",
                                  "latency_max": 20 * latency}},
               "tail_batching": {"length_budget": budget, "extra_prompts": extra}}
        for o in r["overrides"]:
            k, v = o.split("=", 1)
            node = run
            *path, last = k.split(".")
            for p in path:
                node = node.setdefault(p, {})
            node[last] = {"true": True, "false": False}.get(v, int(v) if v.isdigit() else v)
        sim = SimulationConfig(
            run=run,
            engine=EngineModel(request_s=e["request_s"], prefill_s_per_token=e["prefill_s_per_token"],
                               decode_step_s=e["decode_step_s"], decode_step_s_per_seq=e["decode_step_s_per_seq"],
                               sync_s=e["sync_s"], slowdown_while_training=c["slowdown_while_training"], chunk=1),
            trainer=TrainerModel(flops_per_token=t["s_per_padded_token"], head_flops_per_token=t["s_per_real_token"],
                                 micro_batch_size=t["micro_batch_size"], peak_flops=1.0, mfu=1.0,
                                 step_overhead_s=t["step_overhead_s"],
                                 slowdown_while_generating=c["slowdown_while_generating"],
                                 slowdown_per_running_request=c.get("slowdown_per_running_request", 0.0)),
            response=ResponseModel(prompt_tokens=prompt, obs_tokens=obs, trajectories=str(trajs)))
        s = simulate(sim, seed=seed)
        sim_step = s["wall_s"] / s["steps"]
        real_step = statistics.fmean(r["step_s"])
        rows.append({"variant": r["name"], "real_step_s": real_step, "sim_step_s": sim_step,
                     "error": sim_step / real_step - 1, "real_trainer_idle": r["trainer_idle"],
                     "sim_trainer_idle": 1 - s["trainer_busy_frac"], "prompt_tokens": prompt, "obs_tokens": obs,
                     "load_start": r["load_start"], "load_end": r["load_end"]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/quickstart/warmstart/model")
    ap.add_argument("--out", default="/tmp/agentrl-simulate-validate")
    ap.add_argument("--variants", nargs="*", default=["sync", "alpha2", "stream", "tail"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--max-turns", type=int, default=16)
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--extra", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--predict-only", action="store_true", help="reuse calibration.json and real.json under --out")
    ap.add_argument("--reuse-real", action="store_true", help="calibrate anew, reuse real.json (the real runs)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat calibrate-run-predict this many times into OUT/round-N, the variants' order rotated "
                         "each round, then pool the rounds (one real run of a variant varies by more than 15 %% here)")
    args = ap.parse_args()
    if args.rounds > 1:
        return rounds(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.predict_only:
        cal = asyncio.run(calibrate(args.model, args.reps, args.max_turns))
        (out / "calibration.json").write_text(json.dumps(cal, indent=2))
        print(json.dumps(cal), flush=True)
    if not (args.predict_only or args.reuse_real):
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_schedulers.py"), "--model", args.model,
                        "--variants", *args.variants, "--steps", str(args.steps), "--latency", str(args.latency),
                        "--max-turns", str(args.max_turns), "--budget", str(args.budget), "--extra", str(args.extra),
                        "--eval", "8", "--seed", str(args.seed), "--out", str(out / "real"),
                        "--json", str(out / "real.json")], check=True)
    cal = json.loads((out / "calibration.json").read_text())
    real = json.loads((out / "real.json").read_text())
    rows = predict(real, cal, out, args.latency, args.max_turns, args.budget, args.extra, args.seed)
    (out / "validation.json").write_text(json.dumps(rows, indent=2))
    print("| variant | real s/step | simulated s/step | error | trainer idle real / sim | load start / end |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['variant']} | {r['real_step_s']:.2f} | {r['sim_step_s']:.2f} | {100 * r['error']:+.0f} % | "
              f"{r['real_trainer_idle']:.2f} / {r['sim_trainer_idle']:.2f} | {r['load_start']:.1f} / "
              f"{r['load_end']:.1f} |")
    return 0


def rounds(args: argparse.Namespace) -> int:
    """``--rounds N``: this script's whole run N times, each round calibrated right before its own real runs and
    predicted with its own calibration, the variants' order rotated so that none always runs first or last; then
    ``pooled.json`` and a table of each variant's rounds."""
    base = Path(args.out)
    done = []
    for k in range(args.rounds):
        rot = args.variants[k % len(args.variants):] + args.variants[:k % len(args.variants)]
        out = base / f"round-{k + 1}"
        cmd = [sys.executable, __file__, "--out", str(out), "--variants", *rot, "--model", args.model,
               "--steps", str(args.steps), "--latency", str(args.latency), "--max-turns", str(args.max_turns),
               "--budget", str(args.budget), "--extra", str(args.extra), "--reps", str(args.reps),
               "--seed", str(args.seed), *(["--predict-only"] if args.predict_only else []),
               *(["--reuse-real"] if args.reuse_real else [])]
        print(f"== round {k + 1}/{args.rounds}: {' '.join(rot)} (load {_load()})", flush=True)
        subprocess.run(cmd, check=True)
        done.append(json.loads((out / "validation.json").read_text()))
    pooled = pool(done)
    (base / "pooled.json").write_text(json.dumps(pooled, indent=2))
    print("| variant | real s/step, per round | simulated s/step, per round | error per round | error of the means |")
    print("| --- | --- | --- | --- | --- |")
    for v in pooled:
        print(f"| {v['variant']} | {' / '.join(f'{x:.2f}' for x in v['real'])} | "
              f"{' / '.join(f'{x:.2f}' for x in v['sim'])} | "
              f"{' / '.join(f'{100 * (s / r - 1):+.0f}' for s, r in zip(v['sim'], v['real']))} % | "
              f"{100 * v['error_of_means']:+.0f} % |")
    return 0


def pool(rounds_rows: list[list[dict]]) -> list[dict]:
    """Per variant (in the first round's order), its real and simulated s/step of every round, and the error of
    the mean prediction against the mean real run."""
    out = []
    for name in [r["variant"] for r in rounds_rows[0]]:
        got = [next(r for r in rows if r["variant"] == name) for rows in rounds_rows]
        real, sim = [g["real_step_s"] for g in got], [g["sim_step_s"] for g in got]
        out.append({"variant": name, "real": real, "sim": sim,
                    "error_of_means": statistics.fmean(sim) / statistics.fmean(real) - 1,
                    "real_spread": (max(real) - min(real)) / statistics.fmean(real)})
    return out


if __name__ == "__main__":
    sys.exit(main())
