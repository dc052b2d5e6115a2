"""agentrl.raystart: a Ray that agentrl starts runs its workers (trainer ranks, env workers, replicas) at the driver's
priority, not Ray's default niceness of +15; a user's ``RAY_worker_niceness`` wins; nothing else calls ``ray.init``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A fresh process per case: Ray is process-global, and the environment variable must be there before Ray starts.
PROBE = """
import os, ray
from agentrl import raystart
raystart.init(num_cpus=1)

@ray.remote(num_cpus=0)
def niceness():
    return os.nice(0)

print("driver", os.nice(0), "worker", ray.get(niceness.remote()))
ray.shutdown()
"""


def probe(env_extra: dict[str, str]) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180,
                         env={**env, **env_extra}, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    words = out.stdout.split()
    return int(words[words.index("driver") + 1]), int(words[words.index("worker") + 1])


def test_a_ray_started_by_agentrl_runs_its_workers_at_the_drivers_priority():
    driver, worker = probe({})
    assert worker == driver  # Ray's own default puts it at min(driver + 15, 19)


def test_a_users_ray_worker_niceness_wins():
    driver, worker = probe({"RAY_worker_niceness": "3"})
    assert worker == min(driver + 3, 19)


def test_nothing_but_raystart_calls_ray_init():
    callers = [str(p.relative_to(ROOT)) for tree in ("agentrl", "envs", "sandboxes") for p in (ROOT / tree).rglob("*.py")
               if "ray.init(" in p.read_text() and p.name != "raystart.py"]
    assert callers == []
