"""CPU the gateway spends reading a streamed answer token by token (agentrl.gateway.live.LiveTurn), by answer length.

Every streamed token is decoded and read (the family's parser) so that only text that cannot be taken back is sent.
Decoding the whole answer again for each token made that O(n^2) per answer; the reading now decodes only the tokens
since the last complete character. What is left grows with the text the parser reads each time.

    .venv/bin/python benchmarks/bench_stream_reading.py                 # 256 / 1,024 / 4,096 / 16,384 tokens
    git show 8484ccc:agentrl/gateway/live.py > /tmp/live_before.py
    .venv/bin/python benchmarks/bench_stream_reading.py --lengths 32 1024 4096 --baseline /tmp/live_before.py

Reported: CPU seconds (``time.process_time``) to feed an answer of n tokens one at a time, and per token (the
median of ``--repeats``; answers shorter than 2,048 tokens are fed several times per repeat). ``--baseline``: another
version of ``live.py`` run on the same answers in the same process, interleaved with this one, and the ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time


def _cpu_per_token(live, r, prompt, text, ids) -> float:
    feeds = max(1, 2048 // len(ids))
    t0 = time.process_time()
    for _ in range(feeds):
        turn = live.LiveTurn(r, prompt, text, None, "auto", [], True)
        for t in ids:
            turn.feed([t])
    return (time.process_time() - t0) / feeds / len(ids)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", help="a live.py file to compare against (interleaved, same process)")
    a = p.parse_args()
    from agentrl.chat import ChatRenderer, load_tokenizer
    from agentrl.gateway import live
    from agentrl.models import ensure_tiny_model

    sides = {"this": live}
    if a.baseline:
        spec = importlib.util.spec_from_file_location("live_baseline", a.baseline)
        sides["baseline"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sides["baseline"])
    tok = load_tokenizer(str(ensure_tiny_model()))
    r = ChatRenderer(tok)
    text, prompt = r.prompt([{"role": "user", "content": "Tell me a long story."}])
    unit = tok(" I guess the number is eight, then nine. 東京 🐝", add_special_tokens=False)["input_ids"]
    print(f"load average {os.getloadavg()[0]:.2f}")
    head = "| answer tokens | CPU s per answer | µs per token |" + (" baseline µs per token | baseline / this |"
                                                                   if a.baseline else "")
    print(head + "\n|" + " ---: |" * head.count("|", 1))
    for n in a.lengths:
        ids = (unit * (n // len(unit) + 1))[:n]
        per = {k: [] for k in sides}
        for _ in range(a.repeats):
            for k, mod in sides.items():
                per[k].append(_cpu_per_token(mod, r, prompt, text, ids))
        med = {k: statistics.median(v) for k, v in per.items()}
        row = f"| {n:,} | {med['this'] * n:.4f} | {1e6 * med['this']:.1f} |"
        if a.baseline:
            row += f" {1e6 * med['baseline']:.1f} | {med['baseline'] / med['this']:.2f}x |"
        print(row, flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
