"""benchmarks/bench_fleet.py runs end to end at a tiny count (bwrap): every episode completes once, the killed
sandboxes' episodes are infrastructure failures retried in fresh sandboxes, nothing is left after release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import BUSYBOX, require_backend

ROOT = Path(__file__).resolve().parents[2]


def test_bench_fleet_tiny_count_with_faults_and_snapshot():
    require_backend("bwrap", BUSYBOX)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AGENTRL_RUN_ID", None)
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fleet.py"), "--backend", "bwrap",
                        "--count", "8", "--steps", "2", "--warm", "4", "--kill-frac", "0.25",
                        "--snapshot-iters", "2"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    fleet = out["fleet"]
    assert fleet["episodes_completed"] == 8 and fleet["episodes_lost"] == 0 and fleet["episodes_twice"] == 0
    assert fleet["killed"] == 2 and fleet["infra_failures"] == 2
    assert all("killed" in f for f in fleet["failures_sample"])
    assert fleet["warm_hits"] == 4 and fleet["created"] == 10 == fleet["stopped"]
    assert fleet["leftovers"] == {"containers": 0, "state_dirs": 0, "cgroups": 0}
    assert fleet["step_p50_s"] is not None and out["snapshot"]["restore_p50_s"] is not None
