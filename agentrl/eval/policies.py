"""The policies an evaluation runs: oracle/empty per env (dispatched on ``meta.env_id``), the in-process vLLM
engine, or a remote OpenAI-compatible server (``PolicyConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from agentrl.config import ConfigError, from_dict
from agentrl.policy import EpisodeMeta, Policy, ScriptedPolicy
from agentrl.eval.config import HOSTED_KINDS, PolicyConfig
from agentrl.eval.instances import _make_env


class _DispatchPolicy(Policy):
    """Chooses a per-env policy from ``meta.env_id`` (built once per id by ``factory(env_id, env_kwargs)``, with the
    kwargs of the suite's first entry of that id)."""

    def __init__(self, factory: Callable[[str, dict[str, Any]], Policy], kwargs_by_env: dict[str, dict[str, Any]]):
        self.factory = factory
        self.kwargs_by_env = kwargs_by_env
        # Built now, so that an env without such a policy is a setup error, not one error per episode.
        self._by_env: dict[str, Policy] = {}
        for env_id, kwargs in kwargs_by_env.items():
            try:
                self._by_env[env_id] = factory(env_id, kwargs)
            except LookupError as e:
                raise ConfigError(f"policy: {e}") from e

    def session(self, meta: EpisodeMeta):
        if meta.env_id not in self._by_env:
            self._by_env[meta.env_id] = self.factory(meta.env_id, self.kwargs_by_env.get(meta.env_id, {}))
        return self._by_env[meta.env_id].session(meta)


def _scripted_from_env(env_id: str, kwargs: dict[str, Any], which: Literal["oracle", "empty"]) -> Policy | None:
    """The env's own scripted policy, by convention, or None: a method ``oracle_policy()``/``empty_policy()`` of the
    env, or module functions ``oracle_policy_fn(env.instances)``/``empty_policy_fn`` (SWE), or (oracle only) the
    class's scripted solver ``solve(conversation)``."""
    import importlib

    env = _make_env(env_id, kwargs, None)
    try:
        u = env.unwrapped
        method = getattr(u, f"{which}_policy", None)
        if callable(method):
            return method()
        module = importlib.import_module(type(u).__module__)
        fn = getattr(module, f"{which}_policy_fn", None)
        if callable(fn):
            if which == "oracle":
                if hasattr(u, "instances"):
                    return ScriptedPolicy(fn(list(u.instances)))
            else:
                return ScriptedPolicy(fn)
        solve = getattr(type(u), "solve", None)
        if which == "oracle" and callable(solve):
            return ScriptedPolicy(lambda conversation, meta: solve(conversation))
        return None
    finally:
        env.close()


def oracle_policy_for(env_id: str, kwargs: dict[str, Any] | None = None) -> Policy:
    """Returns the ground-truth policy of ``env_id`` (SWE: applies the gold patch; BFCL: the possible answer; the
    built-in envs: their scripted solver). Raises ``LookupError`` if the env has none."""
    policy = _scripted_from_env(env_id, kwargs or {}, "oracle")
    if policy is None:
        raise LookupError(f"env {env_id!r} has no oracle (no oracle_policy(), oracle_policy_fn or solve())")
    return policy


def empty_policy_for(env_id: str, kwargs: dict[str, Any] | None = None) -> Policy:
    """Returns the do-nothing policy of ``env_id``: the env's own (SWE: submit at once, an empty patch), else a
    policy that always answers the empty string."""
    return _scripted_from_env(env_id, kwargs or {}, "empty") or ScriptedPolicy(lambda conversation, meta: "")


@dataclass
class BuiltPolicy:
    """A policy, the coroutine that releases what it holds (engines), and ``dead``: why it can act no more (its
    engine's process died), or None."""

    policy: Policy
    close: Callable[[], Any] | None = None
    dead: Callable[[], str | None] | None = None


def build_policy(cfg: PolicyConfig, kwargs_by_env: dict[str, dict[str, Any]] | None = None) -> BuiltPolicy:
    """Returns the policy ``cfg`` describes (engines are started here; call ``close`` when done).
    ``kwargs_by_env``: env constructor kwargs per env id (the scripted policies build an env to find theirs)."""
    if cfg.kind == "oracle":
        return BuiltPolicy(_DispatchPolicy(oracle_policy_for, kwargs_by_env or {}))
    if cfg.kind == "empty":
        return BuiltPolicy(_DispatchPolicy(empty_policy_for, kwargs_by_env or {}))
    if cfg.kind in HOSTED_KINDS:
        from agentrl.eval.hosted import HostedChatPolicy, HostedConfig

        dialect = HOSTED_KINDS[cfg.kind]
        key_env = {"messages": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}.get(dialect, "OPENAI_API_KEY")
        hosted = HostedChatPolicy(from_dict(HostedConfig, {"base_url": cfg.endpoint, "model": cfg.model,
                                                           "dialect": dialect, "api_key_env": key_env, **cfg.api},
                                            "policy.api"))
        return BuiltPolicy(hosted, hosted.aclose)
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig

    rollout = from_dict(RolloutConfig, cfg.rollout, "policy.rollout")
    if cfg.kind == "vllm":
        ecfg = from_dict(EngineConfig, {"backend": "vllm", "model": cfg.model or "tiny", **cfg.engine}, "policy.engine")
    else:
        ecfg = from_dict(EngineConfig, {"backend": "remote", "model": cfg.model, "urls": [cfg.endpoint], **cfg.engine},
                         "policy.engine")
    # Token-in/token-out needs the served model's own tokenizer (and chat template).
    tokenizer_dir = ecfg.tokenizer or ecfg.resolved_model()
    from agentrl.chat import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    engine = make_engine(ecfg)
    policy = AgentLoopPolicy(engine, tokenizer, rollout)

    async def close() -> None:
        await engine.close()

    return BuiltPolicy(policy, close, engine.dead)
