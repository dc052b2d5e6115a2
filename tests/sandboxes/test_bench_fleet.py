"""benchmarks/bench_fleet.py runs end to end at a tiny count (bwrap), through the env manager: every episode
completes once, the killed / OOM / disk-full sandboxes' episodes are infrastructure failures with their cause,
retried in fresh sandboxes, nothing is left after release."""

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
                        "--count", "16", "--steps", "1", "--kill-frac", "0.125", "--oom-frac", "0.0625",
                        "--disk-frac", "0.0625", "--snapshot-iters", "2"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    fleet = out["fleet"]
    assert fleet["episodes_completed"] == 16 and fleet["episodes_lost"] == 0 and fleet["episodes_twice"] == 0
    assert fleet["alive_at_up"] == 16 and not fleet["barrier_broken"]
    assert fleet["faults"] == {"kill": 2, "oom": 1, "disk": 1} and fleet["kills_landed"] == 2
    assert fleet["failures"] == {"sandbox_lost": 2, "sandbox_oom": 1, "sandbox_disk": 1}
    assert fleet["infra_retried"] == 4
    # the warm pool (sized by the manager: the whole fleet) served the first wave; the 4 retries made on demand
    assert fleet["warm_target"] == 16 and fleet["warm_hits"] >= 16 and fleet["created"] == fleet["stopped"]
    assert fleet["leftovers"] == {"containers": 0, "state_dirs": 0, "cgroups": 0}
    assert fleet["step_p50_s"] is not None and fleet["of_ideal"] is not None
    assert out["snapshot"]["restore_p50_s"] is not None
