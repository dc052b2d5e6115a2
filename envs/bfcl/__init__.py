"""The Berkeley Function-Calling Leaderboard (BFCL v4) as agentrl envs, graded by the installed ``bfcl-eval``.

Every score comes from ``bfcl_eval``'s own code; agentrl adds the env adapter around it:

- :mod:`.official`: imports ``bfcl_eval`` (stand-ins for the modules grading does not need, cache directory);
- :mod:`.data`: the items, from its loaders (``load_dataset_entry``, ``load_ground_truth_entry``);
- :mod:`.formats`: the answer formats (``qwen_fc``: the Qwen/Hermes ``<tool_call>`` FC handler; ``prompt``: the
  Python-call prompt handler), i.e. which official handler builds the prompt and decodes the answer;
- :mod:`.safety`: screens in front of the two places the official code ``eval``\\ s model text;
- :mod:`.grading`: verdicts from the official per-entry evaluators;
- :mod:`.single_turn` (:class:`BFCLEnv`) and :mod:`.multi_turn` (:class:`BFCLMultiTurnEnv`): the envs;
- :mod:`.oracle`: ground-truth answers in either format (tests, ``--policy oracle``, demonstrations);
- :mod:`.scoring`: the leaderboard's aggregation of per-category accuracies for ``agentrl eval`` reports.

Env ids: ``agentrl/BFCL-<category>-v0`` with the category's ``_`` written ``-`` (:mod:`.categories`), e.g.
``agentrl/BFCL-simple-python-v0``, ``agentrl/BFCL-multi-turn-base-v0``; kwargs ``format`` (``qwen_fc``, the
default, or ``prompt``) and, multi-turn, ``reward`` (``episode`` or ``turn``). This package is light to import;
``bfcl_eval`` is loaded when an env is made.

Use: ``agentrl eval --env bfcl`` (every served category; ``bfcl-non-live``, ``bfcl-live``, ``bfcl-multi-turn``
for a section; ``--set suite_kwargs.format=prompt`` for the prompt format) reports per category and the
leaderboard's summaries. For RL, the multi-turn envs are ordinary agentrl envs; give the rollout room: the item's
function docs (up to ~30) are in every prompt, the official loop allows 20 tool steps per turn, and a truncated
episode counts as wrong (as a force-terminated one does in BFCL), so raise ``policy.rollout.max_context_tokens``,
``policy.rollout.max_turns`` and the run's ``max_turns``.
"""

from __future__ import annotations

from agentrl.envs.bfcl.categories import ALL, ENV_IDS, LIVE, MULTI_TURN, NON_LIVE, SINGLE_TURN, env_id


def register_all() -> None:
    """Registers every BFCL env id (idempotent; ``import agentrl`` already does it through ``agentrl.envs``)."""
    from agentrl.envs.bfcl.categories import registrations
    from agentrl.registration import register, registered_ids

    have = set(registered_ids())
    for i, fields in registrations().items():
        if i not in have:
            register(i, **fields)


__all__ = ["ALL", "ENV_IDS", "LIVE", "MULTI_TURN", "NON_LIVE", "SINGLE_TURN", "env_id", "register_all"]
