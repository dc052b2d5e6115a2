"""The BFCL v4 categories agentrl serves and their env ids (no ``bfcl_eval`` import: ``import agentrl`` reads this).

The lists are the leaderboard's own (``bfcl_eval.constants.category_mapping``: ``NON_LIVE_CATEGORY``,
``LIVE_CATEGORY``, ``MULTI_TURN_CATEGORY``), spelled out here so that registering the envs needs no import of the
package; ``tests/envs/test_bfcl.py`` checks they are equal. The agentic categories (``web_search_*``, which needs
a live search API, and ``memory_*``, which needs sentence-transformers and faiss) are not served.
"""

from __future__ import annotations

NON_LIVE: tuple[str, ...] = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
                             "parallel_multiple", "irrelevance")
LIVE: tuple[str, ...] = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance",
                         "live_relevance")
MULTI_TURN: tuple[str, ...] = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                               "multi_turn_long_context")
SINGLE_TURN: tuple[str, ...] = NON_LIVE + LIVE
ALL: tuple[str, ...] = SINGLE_TURN + MULTI_TURN


def env_id(category: str) -> str:
    """Returns the registered id of a category's env: ``agentrl/BFCL-<category with - for _>-v0``."""
    return f"agentrl/BFCL-{category.replace('_', '-')}-v0"


#: env id -> category, for every served category.
ENV_IDS: dict[str, str] = {env_id(c): c for c in ALL}


def registrations() -> dict[str, dict]:
    """Returns ``agentrl.register`` keyword arguments per env id (``envs/__init__.py`` registers them).

    Single-turn envs get a TimeLimit of 1 step; multi-turn envs none (they bound each turn at the leaderboard's
    step limit and end after the item's last turn)."""
    out: dict[str, dict] = {}
    for c in SINGLE_TURN:
        out[env_id(c)] = {
            "entry_point": "agentrl.envs.bfcl.single_turn:BFCLEnv",
            "kwargs": {"category": c},
            "max_episode_steps": 1,
            "description": f"BFCL v4 {c}: one function-calling answer, graded by bfcl-eval's checker.",
        }
    for c in MULTI_TURN:
        out[env_id(c)] = {
            "entry_point": "agentrl.envs.bfcl.multi_turn:BFCLMultiTurnEnv",
            "kwargs": {"category": c},
            "description": f"BFCL v4 {c}: multi-turn tool use on bfcl-eval's executable backends, graded by its "
                           "multi-turn checker.",
        }
    return out
