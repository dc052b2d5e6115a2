"""Template modes by family: what ``split`` costs in trained tokens, and the agent loop's rendering time per turn.

For each family (the published templates and tokenizers of tests/chat/chat_tokenizers.py), ``--episodes``
scripted episodes of ``--turns`` turns run through ``AgentLoopPolicy`` against a zero-latency scripted engine that
emits the family's own output (a short reasoning block where the family thinks, then a one-line answer); every env
turn is a user message (feedback, as in GuessNumber), the case where thinking templates rewrite history each turn.

Per family and mode: sequence tokens the trainer processes (sum of segment lengths), loss tokens (identical in both
modes: what was sampled), segments per episode, drift counts, and loop time per turn (rendering, parsing, checks;
the engine answers instantly). Prints a markdown table.

Run::

    .venv/bin/python benchmarks/bench_chat_templates.py                 # 8 episodes x 8 turns
    .venv/bin/python benchmarks/bench_chat_templates.py --turns 16 --families qwen3-think glm-4.5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "chat"))

REASONING = "Let me think about which number is left given the feedback so far."


def output(case: str, i: int) -> str:
    n = str(i + 1)
    return {
        "qwen2.5": f"{n}<|im_end|>",
        "qwen3-think": f"<think>\n{REASONING}\n</think>\n\n{n}<|im_end|>",
        "qwq": f"{REASONING}\n</think>\n\n{n}<|im_end|>",
        "llama3": f"{n}<|eot_id|>",
        "mistral": f"{n}</s>",
        "deepseek-v3.1-think": f"{REASONING}</think>{n}<｜end▁of▁sentence｜>",
        "glm-4.5": f"\n<think>{REASONING}</think>\n{n}<|user|>",
        "gpt-oss": f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|channel|>final<|message|>{n}"
                   "<|return|>",
    }[case]


async def run(case: str, mode: str, episodes: int, turns: int) -> dict[str, float]:
    import test_chat_families as T

    from agentrl.chat import ChatConfig
    from agentrl.policy import EpisodeMeta
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig

    tok = T.tokenizer(case)
    engine = T.ScriptEngine([T.encode(tok, output(case, i % turns)) for i in range(episodes * turns)])
    cfg = RolloutConfig(max_tokens_per_turn=256, max_context_tokens=32768, max_turns=turns,
                        chat=ChatConfig(template_mode=mode, **T.CASES[case][1]))
    policy = AgentLoopPolicy(engine, tok, cfg)
    seq = loss = segs = handover = env = 0
    t0 = time.perf_counter()
    for e in range(episodes):
        s = policy.session(EpisodeMeta(f"{case}-{e}", "g", "bench", e))
        await s.act([{"role": "system", "content": "Guess the secret number between 1 and 100."},
                     {"role": "user", "content": "Your first guess?"}])
        for t in range(turns - 1):
            await s.act([{"role": "user", "content": "Too low. Try a higher number."}])
        rec = s.token_record()
        seq += len(rec.token_ids)
        loss += sum(rec.loss_mask)
        segs += max(1, len(rec.segments))
        handover += rec.info["chat/drift_handover"]
        env += rec.info["chat/drift_env"]
    dt = time.perf_counter() - t0
    return {"seq": seq / episodes, "loss": loss / episodes, "segs": segs / episodes, "handover": handover / episodes,
            "env": env / episodes, "ms_per_turn": 1000 * dt / (episodes * turns)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--families", nargs="*", default=["qwen2.5", "qwen3-think", "qwq", "llama3", "mistral",
                                                      "deepseek-v3.1-think", "glm-4.5", "gpt-oss"])
    args = ap.parse_args()
    print(f"load before: {open('/proc/loadavg').read().strip()}", file=sys.stderr)
    for case in args.families:  # warm-up: tokenizers, vLLM parser imports
        await run(case, "keep", 1, 2)
    rows = []
    for case in args.families:
        keep = await run(case, "keep", args.episodes, args.turns)
        split = await run(case, "split", args.episodes, args.turns)
        rows.append((case, keep, split))
    print(f"load after: {open('/proc/loadavg').read().strip()}", file=sys.stderr)
    print(f"\n{args.episodes} episodes x {args.turns} turns (user feedback every turn), per episode:\n")
    print("| family | loss tokens | keep: seq tokens | split: seq tokens | split/keep | split segments "
          "| env drifts | handover drifts | keep ms/turn | split ms/turn |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case, k, s in rows:
        assert k["loss"] == s["loss"]
        print(f"| {case} | {k['loss']:.0f} | {k['seq']:.0f} | {s['seq']:.0f} | {s['seq'] / k['seq']:.2f}x "
              f"| {s['segs']:.1f} | {k['env']:.1f} | {k['handover']:.1f} | {k['ms_per_turn']:.1f} "
              f"| {s['ms_per_turn']:.1f} |")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(main())
