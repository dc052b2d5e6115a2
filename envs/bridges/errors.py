"""How a bridged library's error is told: on one line, with what it says and nothing of its decoration.

Libraries write errors for a terminal: nltk's LookupError (a corpus not downloaded) opens with a blank line and a row
of asterisks, and colours the resource's name. Shown as ``f"{type}: {e}"`` in an episode's error or ``agentrl envs
check``'s one-line verdict, that reads ``LookupError:`` and nothing more.
"""

from __future__ import annotations

import re

_DECORATION = re.compile(r"\x1b\[[0-9;]*m|\*{3,}")  # ANSI colours; banner rows of asterisks
MAX_CHARS = 300


def one_line(text: str) -> str:
    """``text`` without ANSI colours and banner rows, its whitespace collapsed, at most :data:`MAX_CHARS` long."""
    return " ".join(_DECORATION.sub(" ", text).split())[:MAX_CHARS]


def describe(e: BaseException) -> str:
    """``Type: text`` of ``e`` on one line (:func:`one_line`); the type alone when it says nothing."""
    text = one_line(str(e))
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
