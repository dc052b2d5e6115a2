"""CPU the gateway spends reading a streamed answer token by token (agentrl.gateway.live.LiveTurn), by answer length.

Every streamed token is decoded and read (the family's parser) so that only text that cannot be taken back is sent.
Decoding the whole answer again for each token made that O(n^2) per answer; the reading now decodes only the tokens
since the last complete character. What is left grows with the text the parser reads each time.

    .venv/bin/python benchmarks/bench_stream_reading.py                 # 256 / 1,024 / 4,096 / 16,384 tokens

Reported: CPU seconds (``time.process_time``) to feed an answer of n tokens one at a time, and per token.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    a = p.parse_args()
    from agentrl.chat import ChatRenderer, load_tokenizer
    from agentrl.gateway.live import LiveTurn
    from agentrl.models import ensure_tiny_model

    tok = load_tokenizer(str(ensure_tiny_model()))
    r = ChatRenderer(tok)
    text, prompt = r.prompt([{"role": "user", "content": "Tell me a long story."}])
    unit = tok(" I guess the number is eight, then nine. 東京 🐝", add_special_tokens=False)["input_ids"]
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| answer tokens | CPU s | µs per token |\n| ---: | ---: | ---: |")
    for n in a.lengths:
        ids = (unit * (n // len(unit) + 1))[:n]
        turn = LiveTurn(r, prompt, text, None, "auto", [], True)
        t0 = time.process_time()
        for t in ids:
            turn.feed([t])
        dt = time.process_time() - t0
        print(f"| {n:,} | {dt:.3f} | {1e6 * dt / n:.0f} |", flush=True)


if __name__ == "__main__":
    main()
