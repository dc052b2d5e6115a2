"""BFCL env throughput, and the full differential check against bfcl-eval's own runners.

Throughput (default), one process, one thread, per answer format:

- single turn: ground-truth answers of every item of every single-turn category, (a) graded only
  (``grading.grade_single_turn`` on the recorded answer: bfcl-eval's evaluator behind the safety screens), and
  (b) as env episodes (``reset`` building the official prompt + ``step``);
- multi turn: ground-truth episodes with the real backends (``reset``: backend instances from the item's
  configuration; one step per turn executing its calls, one step ending it; the final official grading, which
  replays the episode and the ground truth on fresh instances), and the grading alone
  (``grading.grade_multi_turn`` on the recorded answers).

``--differential``: every perturbed candidate of every item (``agentrl.envs.bfcl.differential``), graded by the
env and by bfcl-eval's file runners / inference loop; prints the agreement per category.

    .venv/bin/python benchmarks/bench_bfcl.py                      # throughput, both formats, all items
    .venv/bin/python benchmarks/bench_bfcl.py --items 50           # at most 50 items per category
    .venv/bin/python benchmarks/bench_bfcl.py --differential       # the full differential run (long)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def _items(n: int, limit: int | None) -> range:
    return range(n if limit is None else min(n, limit))


def bench_single_turn(fmt: str, limit: int | None) -> dict:
    from agentrl.envs.bfcl import categories
    from agentrl.envs.bfcl.formats import recorded_answer
    from agentrl.envs.bfcl.grading import grade_single_turn
    from agentrl.envs.bfcl.single_turn import BFCLEnv

    envs = [BFCLEnv(c, format=fmt) for c in categories.SINGLE_TURN]
    work = [(env, i, env.oracle_answer(i)) for env in envs for i in _items(env.num_tasks, limit)]
    answers = [(env, i, recorded_answer(env.fmt, text)) for env, i, text in work]
    t0 = time.perf_counter()
    valid = sum(bool(grade_single_turn(env.cat, i, env.fmt, a)["valid"]) for env, i, a in answers)
    graded_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rewards = 0.0
    for env, i, text in work:
        env.reset(options={"index": i})
        rewards += env.step(text)[1]
    episode_s = time.perf_counter() - t0
    return {"n": len(work), "valid": valid, "graded_per_s": len(work) / graded_s,
            "episodes_per_s": len(work) / episode_s, "reward": rewards}


def bench_multi_turn(fmt: str, limit: int | None) -> dict:
    from agentrl.envs.bfcl import categories
    from agentrl.envs.bfcl.grading import grade_multi_turn
    from agentrl.envs.bfcl.multi_turn import BFCLMultiTurnEnv

    envs = [BFCLMultiTurnEnv(c, format=fmt) for c in categories.MULTI_TURN]
    n = steps = correct = 0
    results = []
    t0 = time.perf_counter()
    for env in envs:
        for i in _items(env.num_tasks, limit):
            env.reset(options={"index": i})
            done = False
            while not done:
                _, _, done, _, info = env.step(env.solve([]))
                steps += 1
            n += 1
            correct += bool(info["correct"])
            results.append((env, i, info["result"]))
    episode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    valid = sum(bool(grade_multi_turn(env.cat, i, env.fmt, r)["valid"]) for env, i, r in results)
    graded_s = time.perf_counter() - t0
    return {"n": n, "correct": correct, "valid": valid, "steps": steps, "episodes_per_s": n / episode_s,
            "steps_per_s": steps / episode_s, "graded_per_s": n / graded_s}


def throughput(args: argparse.Namespace) -> None:
    print(f"load average before: {loadavg()}  (cpus: {os.cpu_count()})", flush=True)
    t0 = time.perf_counter()
    from agentrl.envs.bfcl import categories
    from agentrl.envs.bfcl.data import load_category

    for c in categories.ALL:
        load_category(c)
    load_s = time.perf_counter() - t0
    rows_st, rows_mt = [], []
    for fmt in args.formats:
        rows_st.append((fmt, bench_single_turn(fmt, args.items)))
        rows_mt.append((fmt, bench_multi_turn(fmt, args.items)))
    print(f"load average after: {loadavg()}\n")
    print(f"Loading the 17 categories (bfcl-eval's loaders, both views): {load_s:.1f} s\n")
    print("| single turn | items | oracle correct | graded items/s | env episodes/s (reset + step) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for fmt, r in rows_st:
        print(f"| {fmt} | {r['n']:,} | {r['valid']:,} | {r['graded_per_s']:,.0f} | {r['episodes_per_s']:,.0f} |")
    print("\n| multi turn (real backends) | episodes | oracle correct | env steps | episodes/s | env steps/s "
          "| graded episodes/s (replay + checks) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for fmt, r in rows_mt:
        print(f"| {fmt} | {r['n']:,} | {r['correct']:,} | {r['steps']:,} | {r['episodes_per_s']:,.1f} "
              f"| {r['steps_per_s']:,.0f} | {r['graded_per_s']:,.1f} |")


def differential(args: argparse.Namespace) -> None:
    from agentrl.envs.bfcl import categories
    from agentrl.envs.bfcl import differential as diff

    print(f"load average before: {loadavg()}", flush=True)
    print("| category | format | candidates | official valid | agree | agreement | results equal |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    total = diff.Tally()
    t0 = time.perf_counter()
    for fmt in args.formats:
        for c in categories.ALL:
            run = diff.run_multi_turn if c in categories.MULTI_TURN else diff.run_single_turn
            tally = run([c], [fmt], items=args.items, seed=args.seed)
            same = str(tally.results_equal) if c in categories.MULTI_TURN else "n/a"
            print(f"| {c} | {fmt} | {tally.candidates:,} | {tally.valid:,} | {tally.agree:,} "
                  f"| {100 * tally.agreement:.3f}% | {same} |", flush=True)
            for d in tally.disagreements[:5]:
                print(f"  disagreement: {d}", file=sys.stderr)
            total.candidates += tally.candidates
            total.agree += tally.agree
            total.valid += tally.valid
            total.disagreements += tally.disagreements
    print(f"| **all** | | {total.candidates:,} | {total.valid:,} | {total.agree:,} | "
          f"{100 * total.agreement:.3f}% | |")
    print(f"\n{time.perf_counter() - t0:.0f} s; load average after: {loadavg()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", nargs="+", default=["qwen_fc", "prompt"], help="answer formats (default: both)")
    p.add_argument("--items", type=int, default=None, help="at most N items per category (default: all)")
    p.add_argument("--differential", action="store_true", help="run the full differential check instead")
    p.add_argument("--seed", type=int, default=0, help="differential: seed of the item sample and perturbations")
    args = p.parse_args()
    random.seed(args.seed)
    (differential if args.differential else throughput)(args)


if __name__ == "__main__":
    main()
