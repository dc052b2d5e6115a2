"""Built-in environments, registered under the ``agentrl/`` namespace.

======================== ============================================ ==================
id                       class                                        TimeLimit (steps)
======================== ============================================ ==================
agentrl/FrozenLake-v0    agentrl.envs.frozenlake:FrozenLakeEnv        20
agentrl/GuessNumber-v0   agentrl.envs.guess_number:GuessNumberEnv     none (guess budget)
agentrl/Arithmetic-v0    agentrl.envs.arithmetic:ArithmeticEnv        none (single turn)
agentrl/ToolUse-v0       agentrl.envs.tool_use:ToolUseEnv             8
agentrl/ToolLookup-v0    agentrl.envs.tool_lookup:ToolLookupEnv       5
agentrl/SWE-v0           agentrl.envs.swe.env:SWEEnv                  none (env bounds)
agentrl/BFCL-*-v0        agentrl.envs.bfcl (17 categories)            1 (single turn) / none
======================== ============================================ ==================

Every procedurally generated built-in env class has a scripted solver, ``Class.solve(conversation) -> action``
(also a module-level ``solve``): a deterministic policy that plays from the text observations alone, for tests,
demos and warm-start demonstrations. :func:`solver_for` finds it from an id, :func:`scripted_policy` wraps it as
an ``agentrl.policy.ScriptedPolicy``. Benchmark envs whose answers the conversation does not reveal (BFCL, SWE)
have instead an instance method ``solve`` for the current episode and an ``oracle_policy()`` that finds the task
from ``meta.task``. An env class may also have ``Class.mistake(conversation, rng) -> action``: a plausible wrong
action for the same state (for noisy warm-start demonstrations; :func:`mistakes_for`).

This module is imported by ``import agentrl``: it must stay light (the env modules are imported lazily by
``agentrl.make``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import gymnasium

from agentrl.envs.bfcl.categories import registrations as bfcl_registrations
from agentrl.registration import load_entry_point, register, spec

BUILTINS: dict[str, dict[str, Any]] = {
    "agentrl/FrozenLake-v0": {
        "entry_point": "agentrl.envs.frozenlake:FrozenLakeEnv",
        "max_episode_steps": 20,
        "description": "Grid puzzle (4x4, not slippery): walk P to G avoiding holes H; moves up/down/left/right.",
    },
    "agentrl/GuessNumber-v0": {
        "entry_point": "agentrl.envs.guess_number:GuessNumberEnv",
        "description": "Guess a secret number in 1..16 from higher/lower feedback, within 6 guesses.",
    },
    "agentrl/Arithmetic-v0": {
        "entry_point": "agentrl.envs.arithmetic:ArithmeticEnv",
        "description": "Single-turn arithmetic generated from the seed; answer in \\boxed{}, reward 1 if exact.",
    },
    "agentrl/ToolUse-v0": {
        "entry_point": "agentrl.envs.tool_use:ToolUseEnv",
        "max_episode_steps": 8,
        "description": "Answer questions about a hidden people table with lookup and calculator tool calls.",
    },
    "agentrl/ToolLookup-v0": {
        "entry_point": "agentrl.envs.tool_lookup:ToolLookupEnv",
        "max_episode_steps": 5,
        "description": "One question about a hidden person, answered with 1-2 lookup/calculator tool calls.",
    },
    # No TimeLimit: the env bounds turns, time and output itself and grades the diff when a bound is hit.
    "agentrl/SWE-v0": {
        "entry_point": "agentrl.envs.swe.env:SWEEnv",
        "description": "SWE-bench-style bug fixing in a docker/bwrap sandbox (offline suite of 13 repositories).",
    },
    # Berkeley Function-Calling Leaderboard: 13 single-turn and 4 multi-turn categories (agentrl.envs.bfcl).
    **bfcl_registrations(),
}


def _register_builtins() -> None:
    for env_id, fields in BUILTINS.items():
        existing = gymnasium.registry.get(env_id)
        if existing is not None and existing.entry_point == fields["entry_point"]:
            continue  # this module was imported again (e.g. reloaded): nothing new to register
        register(env_id, **fields)


_register_builtins()


def solver_for(env_id: str) -> Callable[[list[dict[str, Any]]], str]:
    """Returns the scripted solver ``solve(conversation) -> action`` of the env class registered as ``env_id``.

    Raises ``agentrl.RegistrationError`` for an unknown id and ``LookupError`` if the class has no ``solve``.
    """
    entry_point = load_entry_point(spec(env_id).entry_point)
    if inspect.isclass(entry_point):  # an instance method needs the episode: not a solver of the conversation
        ok = isinstance(inspect.getattr_static(entry_point, "solve", None), staticmethod)
    else:
        ok = callable(getattr(entry_point, "solve", None))
    if not ok:
        raise LookupError(f"env {env_id!r} ({entry_point!r}) has no scripted solver of the conversation alone (a "
                          "static 'solve' method); use the env's oracle_policy() if it has one")
    return getattr(entry_point, "solve")


def mistakes_for(env_id: str) -> Callable[[list[dict[str, Any]], Any], str]:
    """Returns the scripted mistakes ``mistake(conversation, rng: random.Random) -> action`` of the env class
    registered as ``env_id``: a plausible wrong action for the state the solver would act in.

    Raises ``agentrl.RegistrationError`` for an unknown id and ``LookupError`` if the class has no ``mistake``.
    """
    entry_point = load_entry_point(spec(env_id).entry_point)
    mistake = getattr(entry_point, "mistake", None)
    if not callable(mistake):
        raise LookupError(f"env {env_id!r} ({entry_point!r}) has no scripted mistakes (a callable 'mistake' attribute)")
    return mistake


def scripted_policy(env_id: str):
    """Returns an ``agentrl.policy.ScriptedPolicy`` that plays ``env_id`` with its scripted solver."""
    from agentrl.policy import ScriptedPolicy

    solve = solver_for(env_id)
    return ScriptedPolicy(lambda conversation, meta: solve(conversation))


__all__ = ["BUILTINS", "mistakes_for", "solver_for", "scripted_policy"]

import agentrl.envs.bridges  # noqa: E402,F401  ids and families of other ecosystems' envs (registered by name only)
