"""``.ci/start-dockerd.sh`` against a fake ``dockerd`` and ``docker`` on PATH: a daemon that exits before it answers
(CI saw dockerd give up with "failed to start containerd: timeout waiting for containerd to start" on a loaded
machine) is started again, within a bounded number of starts; one that never comes up fails with its log's tail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "start-dockerd.sh"

# The fake dockerd counts its starts; the first FAILS of them exit at once as the real one did in CI, a later one
# says it is up and stays until the test lets it go.
DOCKERD = """#!/bin/bash
n=$(( $(cat "$STATE/starts" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$STATE/starts"
if [ "$n" -le "$FAILS" ]; then
  echo "failed to start containerd: timeout waiting for containerd to start"; exit 1
fi
echo "API listen on /var/run/docker.sock"; touch "$STATE/up"
while [ ! -e "$STATE/release" ]; do sleep 0.05; done
"""
DOCKER = """#!/bin/bash
case "$1" in
  info) [ -e "$STATE/up" ] ;;
  version) echo 0.0-fake ;;
  *) exit 2 ;;
esac
"""
PGREP = "#!/bin/bash\nexit 1\n"  # no dockerd of anyone else's runs


def run(tmp_path: Path, fails: int, starts: int = 3) -> tuple[subprocess.CompletedProcess, int]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("dockerd", DOCKERD), ("docker", DOCKER), ("pgrep", PGREP)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state), "FAILS": str(fails),
           "DOCKERD_LOG": str(tmp_path / "dockerd.log"), "DOCKERD_STARTS": str(starts), "DOCKERD_WAIT_S": "120"}
    try:
        done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    finally:
        (state / "release").touch()
    return done, int((state / "starts").read_text())


def test_a_dockerd_that_exits_before_it_answers_is_started_again(tmp_path):
    done, starts = run(tmp_path, fails=2)
    assert done.returncode == 0, done.stderr
    assert starts == 3
    assert done.stdout.count("exited before it answered") == 2
    assert "timeout waiting for containerd" in done.stdout  # the cause is shown, not only the retry
    assert "docker 0.0-fake ready" in done.stdout


def test_a_dockerd_that_never_answers_fails_after_its_starts_with_the_logs_tail(tmp_path):
    done, starts = run(tmp_path, fails=99, starts=2)
    assert done.returncode == 1
    assert starts == 2
    assert "exited 2 times" in done.stderr and "timeout waiting for containerd" in done.stderr
