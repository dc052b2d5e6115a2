"""The evaluation config: the suite's envs (``EnvEntry``), the policy (``PolicyConfig``) and the run
(``EvalConfig``), loaded from YAML with ``key.sub=value`` overrides; named suites and output file names."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.config import from_dict


DEFAULT_SEEDS = 100

#: BFCL v4 categories by leaderboard section (``agentrl.envs.bfcl.categories``; env id ``agentrl/BFCL-<cat>-v0``).
_BFCL_NON_LIVE = ["simple-python", "simple-java", "simple-javascript", "multiple", "parallel", "parallel-multiple",
                  "irrelevance"]
_BFCL_LIVE = ["live-simple", "live-multiple", "live-parallel", "live-parallel-multiple", "live-irrelevance",
              "live-relevance"]
_BFCL_MULTI_TURN = ["multi-turn-base", "multi-turn-miss-func", "multi-turn-miss-param", "multi-turn-long-context"]

#: Named suites: lists of env ids (``--env`` can name a suite too). ``bfcl`` is every BFCL category agentrl serves
#: (all the leaderboard scores but the agentic ones).
SUITES: dict[str, list[str]] = {
    "bfcl": [f"agentrl/BFCL-{c}-v0" for c in _BFCL_NON_LIVE + _BFCL_LIVE + _BFCL_MULTI_TURN],
    "bfcl-non-live": [f"agentrl/BFCL-{c}-v0" for c in _BFCL_NON_LIVE],
    "bfcl-live": [f"agentrl/BFCL-{c}-v0" for c in _BFCL_LIVE],
    "bfcl-multi-turn": [f"agentrl/BFCL-{c}-v0" for c in _BFCL_MULTI_TURN],
    "tool-use": ["agentrl/ToolUse-v0"],
    "swe": ["agentrl/SWE-v0"],
}

TRAJECTORIES = "trajectories.jsonl"
PREDICTIONS = "predictions.jsonl"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"


@dataclass
class EnvEntry:
    """One env of the suite. ``name`` labels it in the outputs (default: the id); ``kwargs`` go to
    ``agentrl.make``; ``limit`` overrides the run's limit for this env."""

    id: str
    name: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    limit: int | None = None

    @property
    def label(self) -> str:
        return self.name or self.id

    def validate(self) -> None:
        if not self.id:
            raise ValueError("id must be a registered env id")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")


# hosted policy kinds -> the API dialect they speak (agentrl.eval.dialects)
HOSTED_KINDS = {"openai-chat": "chat", "openai-responses": "responses", "anthropic-messages": "messages",
                "google-gemini": "gemini"}


@dataclass
class PolicyConfig:
    """What acts. ``kind``: ``oracle`` (the env's scripted solver: ground truth for BFCL and SWE), ``empty`` (answers
    nothing, or the env's own empty policy), ``vllm`` (in-process engine over ``model``, a HF model dir; the tiny
    model when unset), ``remote`` (vLLM servers started with ``--enable-scale-out`` at ``endpoint``; ``model`` is
    the name they serve and, unless ``engine.tokenizer`` is set, the tokenizer directory, needed for
    token-in/token-out). ``name`` is the
    ``model_name_or_path`` of predictions. ``engine`` holds ``agentrl.inference.config.EngineConfig`` fields,
    ``rollout`` ``agentrl.agent.loop.RolloutConfig`` fields (both checked when the policy is built).
    ``openai-chat``, ``openai-responses``, ``anthropic-messages``, ``google-gemini``: a hosted API of that dialect at
    ``endpoint`` (``.../v1``; Gemini's ``.../v1beta``) serving ``model``, tool calls in the API's native form,
    text-level trajectories (:mod:`agentrl.eval.hosted`); ``api`` holds :class:`~agentrl.eval.hosted.HostedConfig` fields (``api_key_env``,
    ``max_total_tokens``, retries...)."""

    kind: Literal["oracle", "empty", "vllm", "remote", "openai-chat", "openai-responses", "anthropic-messages",
                  "google-gemini"] = "oracle"
    model: str | None = None  # vllm: weights dir or "tiny" (default); remote: served name = tokenizer dir
    endpoint: str | None = None
    name: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    api: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.kind in HOSTED_KINDS and not (self.endpoint and self.model):
            raise ValueError(f"kind {self.kind!r} needs endpoint (the API root, e.g. https://host/v1) and model (the "
                             "name it serves)")
        if self.kind == "remote" and not self.endpoint:
            raise ValueError("kind 'remote' needs an endpoint (e.g. http://127.0.0.1:8000)")
        if self.kind == "remote" and not self.model:
            raise ValueError("kind 'remote' needs model: the tokenizer directory of the served model")

    @property
    def model_name(self) -> str:
        return self.name or self.model or self.kind


@dataclass
class EvalConfig:
    """A run: ``envs`` and/or a ``suite`` name (their union, suite first), a policy, and the output directory.
    ``suite_kwargs`` go to ``agentrl.make`` for every env of the suite (e.g. ``{format: prompt}`` for BFCL).

    ``limit``: at most this many instances per env (the first ones, deterministic). ``concurrency``: episodes alive
    at once (the manager's ``max_concurrency``). ``retry_errors``: rerun instances whose recorded episode ended in an
    error. ``seed``: first seed of seed-indexed envs. ``max_episode_steps`` overrides the registered TimeLimit;
    ``max_turns`` and ``episode_timeout_s`` bound every episode (the manager ends it as truncated / error).
    ``retries``: an episode that errors is retried this many times before its error is recorded (0: errors are
    results). ``workers``: env workers (0: envs in this process; N: Ray actors)."""

    envs: list[EnvEntry] = field(default_factory=list)
    suite: str | None = None
    suite_kwargs: dict[str, Any] = field(default_factory=dict)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    out: str = "eval_out"
    limit: int | None = None
    concurrency: int = 8
    seed: int = 0
    retry_errors: bool = False
    max_episode_steps: int | None = None
    max_turns: int = 64
    episode_timeout_s: float | None = None
    retries: int = 0
    workers: int = 0
    progress: bool = True

    def validate(self) -> None:
        if not self.envs and not self.suite:
            raise ValueError("give envs or a suite")
        if self.suite is not None and self.suite not in SUITES:
            raise ValueError(f"unknown suite {self.suite!r}; known: {', '.join(SUITES)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        for name in ("concurrency", "max_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("retries", "workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.episode_timeout_s is not None and self.episode_timeout_s <= 0:
            raise ValueError(f"episode_timeout_s must be > 0, got {self.episode_timeout_s}")
        labels = [e.label for e in self.entries()]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise ValueError(f"env labels must be unique, repeated: {sorted(dup)} (set a name per entry)")

    def entries(self) -> list[EnvEntry]:
        """Returns the suite's envs followed by ``envs``."""
        suite = [EnvEntry(id=i, kwargs=dict(self.suite_kwargs)) for i in SUITES.get(self.suite or "", [])]
        return suite + list(self.envs)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> EvalConfig:
    """Returns the :class:`EvalConfig` of a YAML file (with ``key=value`` overrides) or of a mapping."""
    from agentrl.config import apply_overrides, load

    if path is not None:
        return load(EvalConfig, path, overrides)
    return from_dict(EvalConfig, apply_overrides(data or {}, overrides or []), "<command line>")
