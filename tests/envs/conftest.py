"""Shared helpers for the built-in env tests."""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable

import pytest
from gymnasium.utils.env_checker import check_env

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_check_env(env: Any) -> list[str]:
    """Runs gymnasium's ``check_env`` (render check skipped: text envs render nothing) and returns its warnings,
    minus the note that a wrapped env is being checked."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    messages = [_ANSI.sub("", str(w.message)) for w in caught]
    return [m for m in messages if "is different from the unwrapped version" not in m]


@pytest.fixture
def checked() -> Callable[[Any], None]:
    """A function that runs ``check_env`` on an env and fails the test on any warning or error."""

    def _check(env: Any) -> None:
        problems = run_check_env(env)
        assert not problems, problems

    return _check
