"""examples/custom_env.py runs as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env.py"


def test_custom_env_example_runs():
    result = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check_env: ok" in result.stdout
    assert "returns: [1.0, 1.0, 1.0]" in result.stdout
    assert "solved every episode" in result.stdout
