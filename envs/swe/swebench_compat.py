"""The parts of the official ``swebench`` package agentrl uses: its test-log parsers and its status names.

``swebench`` is installed without its dependencies (``setup.sh``: ``--no-deps``): they (datasets, modal, docker
SDK pins, ...) conflict with the training stack and none is needed for parsing logs. Its ``swebench.harness``
package imports all of them in ``__init__``, so this module loads ``swebench.harness.log_parsers`` and
``swebench.harness.constants`` as submodules of a bare ``swebench.harness`` package object (their own imports only
reach ``swebench.types`` and the standard library).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable

_LOADED: dict[str, Callable[[str, object], dict[str, str]]] | None = None


def _harness_package() -> None:
    if "swebench.harness" in sys.modules:
        return
    spec = importlib.util.find_spec("swebench")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the swebench package is not installed (setup.sh installs it: pip install --no-deps swebench)")
    harness = types.ModuleType("swebench.harness")
    harness.__path__ = [str(Path(list(spec.submodule_search_locations)[0]) / "harness")]  # type: ignore[attr-defined]
    harness.__package__ = "swebench.harness"
    sys.modules["swebench.harness"] = harness


def parsers() -> dict[str, Callable[[str, object], dict[str, str]]]:
    """Returns swebench's ``PARSER_REGISTRY`` (parser name -> ``fn(log, test_spec) -> {test: status}``)."""
    global _LOADED
    if _LOADED is None:
        _harness_package()
        _LOADED = dict(importlib.import_module("swebench.harness.log_parsers").PARSER_REGISTRY)
    return _LOADED


def parse_log(name: str, log: str) -> dict[str, str]:
    """Parses a test log with swebench's parser ``name``; returns ``{test id: status}`` with swebench's status
    names (``PASSED``, ``FAILED``, ``SKIPPED``, ``ERROR``, ``XFAIL``). Raises ``KeyError`` for an unknown parser."""
    registry = parsers()
    if name not in registry:
        raise KeyError(f"unknown swebench log parser {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name](log, None)


#: swebench status -> agentrl status. XFAIL passes in swebench's grading (``test_passed``).
STATUS_MAP = {"PASSED": "pass", "FAILED": "fail", "ERROR": "error", "SKIPPED": "skip", "XFAIL": "xfail"}
