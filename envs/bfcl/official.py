"""The one door to the installed ``bfcl-eval`` package: its loaders, checkers, handlers and aggregation.

Everything BFCL-specific that decides a score comes from ``bfcl_eval`` itself; this module only imports it so that
the import works in agentrl's environment and has no side effects on it:

- ``bfcl-eval`` is installed with ``--no-deps`` (its pins, numpy 1.x and an old vLLM among them, conflict with the
  stack). Grading needs only a few of its requirements (``tree_sitter`` + the Java/JavaScript grammars for the
  Java/JS decoders, ``overrides``, ``tenacity``, ``filelock``, ``python-dotenv``, ``mpmath``), which agentrl
  installs itself (``setup.sh``);
- ``bfcl_eval.constants.model_config`` imports all ~60 model handlers and, through them, every vendor SDK
  (anthropic, mistralai, cohere, google-genai, boto3, qwen-agent...). Grading reads one field of it
  (``underscore_to_dot``, in ``ast_checker.convert_func_name``) and the leaderboard table reads the display fields
  (``generate_leaderboard_csv``). A stand-in module with a mapping that answers every model name with a config of
  those fields (``underscore_to_dot=False``: agentrl shows the model function names as the data spells them, dots
  included, as the Qwen handlers do) takes its place while the grading modules are imported;
- ``openai`` (imported by the local-model handler base only to build a client, ~2 s) and ``pandas`` (used only to
  upload the leaderboard CSVs to W&B) get stand-ins too when they are not already imported;
- the stand-ins are removed from ``sys.modules`` right after the import, so later imports of the real packages
  (vLLM imports ``openai``) are unaffected;
- the leaderboard helper's dataset loader is memoized (it re-reads every unscored category on each call just to
  count its items);
- ``bfcl_eval.constants.eval_config`` creates ``result/``, ``score/`` and ``.file_locks/`` under
  ``$BFCL_PROJECT_ROOT`` (default: next to the installed package, i.e. inside site-packages) at import time;
  agentrl points ``BFCL_PROJECT_ROOT`` at its cache (``$AGENTRL_CACHE_DIR/bfcl``, else
  ``$XDG_CACHE_HOME/agentrl/bfcl``, else ``~/.cache/agentrl/bfcl``) unless the variable is already set.

:func:`load` returns the loaded modules (thread-safe, once per process). Nothing here is imported by
``import agentrl``; the envs call :func:`load` on first use.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

BFCL_PACKAGE = "bfcl-eval"
BFCL_VERSION = "2026.3.23"
INSTALL_HINT = (f"pip install --no-deps {BFCL_PACKAGE}=={BFCL_VERSION} && pip install -e '.[bfcl]' "
                "(./setup.sh does both)")


class BFCLUnavailable(RuntimeError):
    """``bfcl_eval`` (or one of the few requirements grading needs) is not installed; the message says what to
    install."""


@dataclass(frozen=True)
class Official:
    """The ``bfcl_eval`` modules agentrl uses (attribute = module)."""

    utils: types.ModuleType  # bfcl_eval.utils: load_dataset_entry, load_ground_truth_entry, category predicates
    categories: types.ModuleType  # bfcl_eval.constants.category_mapping
    prompts: types.ModuleType  # bfcl_eval.constants.default_prompts
    enums: types.ModuleType  # bfcl_eval.constants.enums: Language, ReturnFormat
    runner: types.ModuleType  # bfcl_eval.eval_checker.eval_runner: the per-entry evaluators and file runners
    helper: types.ModuleType  # bfcl_eval.eval_checker.eval_runner_helper: accuracy aggregation, leaderboard CSVs
    multi_turn_utils: types.ModuleType  # execute_multi_turn_func_call, is_empty_execute_response
    handler_utils: types.ModuleType  # bfcl_eval.model_handler.utils: system prompt, ast_parse, decoders

    def handler_class(self, path: str) -> type:
        """Returns the handler class ``"module.path:ClassName"`` (relative to ``bfcl_eval.model_handler``)."""
        module, _, name = path.partition(":")
        with _stand_ins():
            return getattr(importlib.import_module(f"bfcl_eval.model_handler.{module}"), name)


@dataclass
class _ModelConfig:
    """The fields of ``bfcl_eval.constants.model_config.ModelConfig`` that grading and the leaderboard table read."""

    model_name: str
    display_name: str
    url: str = ""
    org: str = ""
    license: str = ""
    model_handler: Any = None
    input_price: float | None = None
    output_price: float | None = None
    is_fc_model: bool = True
    underscore_to_dot: bool = False


class _AnyModel(dict):
    """``MODEL_CONFIG_MAPPING`` stand-in: every model name has a config named after itself."""

    def __missing__(self, key: str) -> _ModelConfig:
        return _ModelConfig(model_name=key, display_name=key)


class _NoClient:
    """``openai.OpenAI`` stand-in: the local-model handlers build a client in ``__init__``; grading never calls it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name, f"agentrl stand-in for {name} (see agentrl.envs.bfcl.official)")
    mod.__dict__.update(attrs)
    return mod


@contextlib.contextmanager
def _stand_ins() -> Iterator[None]:
    """Puts the stand-ins into ``sys.modules`` for the duration of an import, then removes exactly those."""
    wanted = {
        "bfcl_eval.constants.model_config": _stub("bfcl_eval.constants.model_config", MODEL_CONFIG_MAPPING=_AnyModel(),
                                                  ModelConfig=_ModelConfig),
        "openai": _stub("openai", OpenAI=_NoClient),
        "pandas": _stub("pandas"),
    }
    added = [name for name in wanted if name not in sys.modules]
    for name in added:
        sys.modules[name] = wanted[name]
    try:
        yield
    finally:
        for name in added:
            if sys.modules.get(name) is wanted[name]:
                del sys.modules[name]


def cache_root() -> Path:
    """``$AGENTRL_CACHE_DIR/bfcl``, else ``$XDG_CACHE_HOME/agentrl/bfcl``, else ``~/.cache/agentrl/bfcl``."""
    if os.environ.get("AGENTRL_CACHE_DIR"):
        return Path(os.environ["AGENTRL_CACHE_DIR"]) / "bfcl"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrl" / "bfcl"


_lock = threading.Lock()
_loaded: Official | None = None


def load() -> Official:
    """Imports the ``bfcl_eval`` modules agentrl uses (once; thread-safe) and returns them.

    Raises :class:`BFCLUnavailable` naming the missing package and the install command."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        if importlib.util.find_spec("bfcl_eval") is None:
            raise BFCLUnavailable(f"BFCL needs the {BFCL_PACKAGE} package: {INSTALL_HINT}")
        if "bfcl_eval.constants.eval_config" not in sys.modules:
            root = Path(os.environ.setdefault("BFCL_PROJECT_ROOT", str(cache_root())))
            root.mkdir(parents=True, exist_ok=True)
        names = {
            "utils": "bfcl_eval.utils",
            "categories": "bfcl_eval.constants.category_mapping",
            "prompts": "bfcl_eval.constants.default_prompts",
            "enums": "bfcl_eval.constants.enums",
            "runner": "bfcl_eval.eval_checker.eval_runner",
            "helper": "bfcl_eval.eval_checker.eval_runner_helper",
            "multi_turn_utils": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils",
            "handler_utils": "bfcl_eval.model_handler.utils",
        }
        mods = {}
        with _stand_ins():
            for attr, name in names.items():
                try:
                    mods[attr] = importlib.import_module(name)
                except ImportError as e:
                    raise BFCLUnavailable(f"importing {name} failed ({e}); install: {INSTALL_HINT}") from e
        # generate_leaderboard_csv calls get_category_score for every category without a score, which re-reads and
        # re-parses that category's files (about 8 s in all) only to count its items; the files do not change, so
        # the helper's reference to the loader is memoized (same arguments, same list).
        mods["helper"].load_dataset_entry = functools.lru_cache(maxsize=None)(mods["helper"].load_dataset_entry)
        _loaded = Official(**mods)
        return _loaded
