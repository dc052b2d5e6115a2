"""The live reading of a streamed completion (agentrl.gateway.live.LiveTurn), token by token: its deltas add up to
the reading of the whole text, multi-byte characters split across tokens included, and it decodes each token a
bounded number of times, so a long answer costs linear, not quadratic, work (a whole decode per token made a
4k-token answer ~1 s of CPU; the counting below fails on that code)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl.chat import ChatRenderer
from agentrl.gateway.live import LiveTurn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chat"))
from chat_tokenizers import qwen_tokenizer, template  # noqa: E402
from test_gateway import tiny_tok  # noqa: E402,F401

TEXTS = ["She lives in a small town by the sea, where she keeps bees.",
         "naïve café: 東京の蜂 🐝🐝 and ½ of 𝔸, then plain words again",
         "<think>a short thought</think>The answer is 34."]


@pytest.fixture(scope="module")
def qwen3():
    return qwen_tokenizer(template("qwen3.jinja"))


def live_turn(tok, chat=True):
    r = ChatRenderer(tok)
    text, ids = r.prompt([{"role": "user", "content": "hi"}])
    return r, LiveTurn(r, ids, text, None, "auto", [], chat)


@pytest.mark.parametrize("family", ["tiny", "qwen3"])
@pytest.mark.parametrize("chat", [True, False])
def test_token_by_token_deltas_add_up_to_the_reading_of_the_whole(tiny_tok, qwen3, family, chat):
    tok = tiny_tok if family == "tiny" else qwen3
    for text in TEXTS:
        r, one_by_one = live_turn(tok, chat)
        _, at_once = live_turn(tok, chat)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        got = {"reasoning": "", "content": ""}
        for t in ids:
            for kind, part in one_by_one.feed([t]):
                assert "\ufffd" not in part, (text, part)  # never half a character
                got[kind] += part
        want = {"reasoning": "", "content": ""}
        for kind, part in at_once.feed(ids):
            want[kind] += part
        assert got == want and (got["content"] or got["reasoning"]), text
        if not chat:
            assert got["content"] == r.decode(ids)


def test_a_long_answer_decodes_each_token_a_bounded_number_of_times(tiny_tok):
    r, turn = live_turn(tiny_tok)
    decoded = [0]
    plain = r.decode

    def counting(ids):
        decoded[0] += len(ids)
        return plain(ids)

    r.decode = counting
    ids = tiny_tok(" I guess the number is eight, then nine. 東京 🐝" * 60, add_special_tokens=False)["input_ids"]
    assert len(ids) > 1000
    for t in ids:
        turn.feed([t])
    # each feed decodes its new tokens with 4 of context, twice (decode_after): ~10 per token; a whole decode per
    # token would be ~len(ids)^2 / 2
    assert decoded[0] <= 16 * len(ids), decoded[0]
    assert turn.sent["content"] == r.decode(ids).strip()  # (the reading trims the lead and holds the tail)


def _safe_reference(cut: list[str], hold: list[str], text: str) -> str:
    """The rule, written the obvious way: cut at the first marker; then hold back the longest tail that is a proper
    prefix of a held marker (one may be arriving)."""
    text = text.rstrip("\ufffd")
    for m in cut:
        if m in text:
            text = text[:text.find(m)]
    end = len(text)
    for m in hold:
        for k in range(len(m) - 1, 0, -1):
            if len(text) >= k and text.endswith(m[:k]):
                end = min(end, len(text) - k)
                break
    return text[:end]


def test_the_safe_text_is_the_rule_on_random_texts_and_markers():
    """``LiveTurn._safe`` runs once per streamed token; its fast tail search gives exactly the rule's text, on
    texts built from the markers' own characters (so prefixes, overlaps and repeats of markers are common)."""
    import random
    from types import SimpleNamespace

    rng = random.Random(0)
    families = [["<|im_end|>", "<tool_call>"], ["</s>", "<|eot_id|>", "aab"], ["<<", "<|", "x"]]
    for i in range(3000):
        cut = families[i % 3]
        hold = cut + ["<think>", "</think>"]
        alphabet = "".join(sorted(set("".join(hold)))) + "ab \ufffd"
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        if rng.random() < 0.5:  # end in a marker's proper prefix
            m = rng.choice([m for m in hold if len(m) > 1])
            text += m[:rng.randrange(1, len(m))]
        turn = SimpleNamespace(cut=cut, hold=hold)
        assert LiveTurn._safe(turn, text) == _safe_reference(cut, hold, text), (cut, text)


def test_bench_stream_reading_runs_against_a_baseline(tmp_path):
    """The benchmark's A/B mode end to end: a baseline ``live.py`` loaded from a file, interleaved with this one."""
    import shutil
    import subprocess

    import agentrl.gateway.live as live

    root = Path(__file__).resolve().parents[2]
    base = tmp_path / "live_copy.py"
    shutil.copy(live.__file__, base)
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_stream_reading.py"), "--lengths", "8",
                          "--repeats", "1", "--baseline", str(base)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = [x for x in out.stdout.splitlines() if x.startswith("| 8 |")]
    assert len(row) == 1 and row[0].rstrip().endswith("x |"), out.stdout
