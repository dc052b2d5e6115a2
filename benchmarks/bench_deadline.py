"""What the time bound on in-process library calls (``envs/bridges/deadline.py``) adds to a bridge's call: the
bridges' RNG guard (``rng.with_states``) around a call that does nothing, without a bound and with one, alternating,
in CPU microseconds per call (this process, ``time.process_time``).

    nice -n 5 .venv/bin/python benchmarks/bench_deadline.py --calls 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import time

from agentrl.envs.bridges import rng


def per_call_us(bound: float | None, calls: int) -> float:
    states = rng.RNGStates.seeded(1)
    t0 = time.process_time()
    for _ in range(calls):
        _, states = rng.with_states(states, lambda: None, bound, "nothing")
    return (time.process_time() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for r in range(args.rounds):
        bare, bounded = per_call_us(None, args.calls), per_call_us(60.0, args.calls)
        print(f"round {r + 1}: guard alone {bare:.1f} us, with the bound {bounded:.1f} us (+{bounded - bare:.1f} us)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
