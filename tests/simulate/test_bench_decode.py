"""benchmarks/bench_decode_gpu.py's CPU path (the GPU run's code on a tiny shape, no CUDA graphs) and its comparison
with the preset: every (batch, context) is timed, and the preset column is the engine model's own arithmetic. (The
figures come from the run on an H200: the commands in the script's docstring.)"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = importlib.import_module("bench_decode_gpu")


def test_cpu_run_times_every_batch_and_context_and_compares_with_the_preset(tmp_path, capsys, monkeypatch):
    res = bench.measure("tiny", "cpu", batches=[1, 3], contexts=[8, 16], prefill=32, reps=2)
    assert [(d["batch"], d["context"]) for d in res["decode"]] == [(1, 8), (3, 8), (1, 16), (3, 16)]
    assert [d["batch"] for d in res["linears"]] == [1, 3] and res["prefill"]["tokens"] == 32
    assert all(d["step_ms"] > 0 for d in res["decode"] + res["linears"])
    # 2 layers of (norms, QKV + bias, output, gate/up, down) and the tied embedding: the published shape's count
    assert res["params"] == 2 * (2 * 64 + 64 * 128 + 128 + 64 * 64 + 64 * 256 + 128 * 64) + 256 * 64

    # the comparison's preset column: the engine model of a named model, fed the measured rows
    res["model"] = "Qwen2.5-1.5B"
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"ceilings": {}, "models": [res]}))
    monkeypatch.chdir(ROOT)
    bench.compare(str(path), "H200")
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| Qwen2.5-1.5B")]
    assert len(rows) == 4 + 2 + 1
    from agentrl.simulate.presets import Hardware, engine_model

    em = engine_model(Hardware(gpu="H200", model="Qwen2.5-1.5B"))
    want = (em.decode_step_s + 3 * (em.decode_step_s_per_seq + em.decode_step_s_per_ktoken * 16 / 1000)) * 1e3
    cells = [c.strip() for c in rows[3].strip("|").split("|")]
    assert cells[1:3] == ["3", "16"] and float(cells[4]) == pytest.approx(want, abs=0.01)
