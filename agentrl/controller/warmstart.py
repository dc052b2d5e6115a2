"""Warm start on scripted demonstrations: scripted actions recorded as the agent loop would record tokens.

A tiny model trained from scratch cannot act at all, so the CPU quickstart first imitates a deliberately noisy
scripted policy (the env's solver or, where the answer needs the episode, its oracle: :func:`scripted_actor`;
with a fraction ``noise`` of its moves replaced by random ones, or by the env's own scripted mistakes:
``agentrl.envs.mistakes_for``) and then improves on it with RL. The demonstrations go
through the same token path as real rollouts (:class:`DemoPolicy` reuses the agent loop's session and only replaces
the engine call), so SFT sees exactly the token layout that RL will.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from agentrl.core import Message
from agentrl.inference.base import Generation
from agentrl.policy import EpisodeMeta
from agentrl.agent.loop import AgentLoopPolicy, AgentLoopSession, RolloutConfig

ActionFn = Callable[[list[Message], EpisodeMeta], str]
MistakeFn = Callable[[list[Message], random.Random], str]


class _DemoSession(AgentLoopSession):
    async def _generate(self, max_tokens: int) -> Generation:
        text = self.policy.fn(list(self.messages), self.meta)
        ids = self.chat.encode(text)[: max(max_tokens - 1, 0)] + [self.policy.eos_id]
        # Version 0: demonstrations belong to the starting policy; behavior log-probs are unknown (0.0) and are
        # never used by SFT.
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), versions=[0] * len(ids), finish_reason="stop")


class DemoPolicy(AgentLoopPolicy):
    """A policy whose actions come from ``fn(conversation, meta) -> str``, tokenized with the chat template into
    trajectories (``loss_mask`` 1 on the action tokens and the end-of-turn token) for supervised warm starts."""

    def __init__(self, fn: ActionFn, tokenizer: Any, cfg: RolloutConfig | None = None):
        super().__init__(engine=None, tokenizer=tokenizer, cfg=cfg)  # type: ignore[arg-type]
        self.fn = fn
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def session(self, meta: EpisodeMeta) -> AgentLoopSession:
        return _DemoSession(self, meta)

    @property
    def version(self) -> int:
        return 0


def scripted_actor(env_id: str, kwargs: dict[str, Any] | None = None) -> ActionFn:
    """The env's scripted play as ``fn(conversation, meta) -> action``: its class's static ``solve(conversation)``
    (``agentrl.envs.solver_for``) or, when the right action needs the episode itself (reasoning-gym: the gold answer
    is in the dataset entry that ``meta.seed`` picks, not in the conversation), the env's oracle
    (``agentrl.eval.policies.oracle_policy_for`` with ``kwargs``). Raises ``LookupError`` naming the env if it has
    neither."""
    from agentrl.envs import solver_for
    from agentrl.eval.policies import oracle_policy_for
    from agentrl.policy import ScriptedPolicy

    try:
        solve = solver_for(env_id)
        return lambda conversation, meta: solve(conversation)
    except LookupError as no_solver:
        try:
            oracle = oracle_policy_for(env_id, kwargs or {})
        except LookupError as no_oracle:
            raise LookupError(f"warm start: env {env_id!r} has no scripted play ({no_solver}; {no_oracle})") from None
    if not isinstance(oracle, ScriptedPolicy):  # a policy that is not a function of the conversation cannot demo
        raise LookupError(f"warm start: the oracle of env {env_id!r} is a {type(oracle).__name__}, not a scripted "
                          "policy of (conversation, meta)")
    return oracle.fn


def noisy(solver: Callable[[list[Message]], str], actions: list[str] | MistakeFn, noise: float,
          seed: int = 0) -> ActionFn:
    """:func:`noisy_actor` of a solver of the conversation alone."""
    return noisy_actor(lambda conversation, meta: solver(conversation), actions, noise, seed)


def noisy_actor(actor: ActionFn, actions: list[str] | MistakeFn, noise: float, seed: int = 0) -> ActionFn:
    """Returns an action function that plays ``actor`` but, with probability ``noise`` per turn, a mistake instead:
    a uniformly random choice from ``actions`` when it is a list, else ``actions(conversation, rng)`` (an env's
    state-dependent scripted mistakes). Deterministic given ``seed``, the episode (:func:`_stable_key`) and the turn."""
    if not callable(actions) and not actions and noise > 0:
        raise ValueError("noisy: noise > 0 needs actions (a non-empty list or a mistake function)")

    def act(conversation: list[Message], meta: EpisodeMeta) -> str:
        turn = sum(1 for m in conversation if m["role"] == "assistant")
        rng = random.Random(f"{seed}/{_stable_key(meta)}/{turn}")
        if rng.random() < noise:
            return actions(conversation, rng) if callable(actions) else rng.choice(actions)
        return actor(conversation, meta)

    return act


def _stable_key(meta: EpisodeMeta) -> str:
    """The episode's identity across runs: its env, env seed and place in its group (``#index.attempt``, what its
    trajectory id adds to the group id). Not the trajectory id itself: an unnamed group's id carries a per-manager
    random prefix, so seeding by it made every run's demonstrations, and the warm-started policy, differ at the same
    config and seed. Unseeded episodes fall back to the trajectory id."""
    tid, gid, env_seed = meta.trajectory_id, getattr(meta, "group_id", ""), getattr(meta, "seed", None)
    if env_seed is None:
        return tid
    return f"{getattr(meta, 'env_id', '')}/{env_seed}{tid[len(gid):] if gid and tid.startswith(gid) else ''}"
