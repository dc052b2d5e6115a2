"""SkyRL-Gym envs as agentrl envs: ``agentrl.make("skyrl_gym/<env id>", tasks="rows.jsonl")``, e.g.
``skyrl_gym/gsm8k``.

SkyRL-Gym envs are made per dataset row: the row's fields other than ``prompt`` are the env's ``extras`` (its
``reward_spec`` with the ground truth, ``extra_info``...), as SkyRL's own generator passes them. Flow: ``reset(seed)``
takes row ``seed % len(rows)`` of the task file (JSONL, one SkyRL dataset row a line: ``prompt`` a list of chat
messages or a string, plus the extras), makes the env with ``skyrl_gym.make(id, env_config=..., extras=...)`` and
returns ``env.init(prompt)``'s conversation; each ``step`` returns the step output's ``observations``, ``reward`` and
``done`` (terminated). ``close`` closes the SkyRL env.

``task_key(seed)`` (also ``info["task_key"]`` of ``reset``) is ``skyrl_gym/<id>:<sha256 of the row>`` (prompt and
ground truth), computed without making an env.

SkyRL-Gym's ``lcb`` and ``searchcode`` run the model's code in the process that steps them (``lcb`` in a forked
child under SkyRL's ``reliability_guard``, ``searchcode``'s Python tool as ``python -c``), as they do in SkyRL. Run
them in a sandboxed host: ``agentrl.make("outproc/Env-v0", python=sys.executable,
factory="agentrl.envs.bridges.skyrl_gym_env:SkyRLGymEnv", kwargs={"env": "lcb", "tasks": ...}, sandbox="bwrap",
sandbox_binds=[<the tasks' dir>])`` (:mod:`.outproc_env`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import typing
from pathlib import Path
from typing import Any

from agentrl.core import Env, Message, StepResult, as_messages

try:
    import skyrl_gym
except ImportError as e:  # an optional extra: say which
    raise ImportError(f"skyrl_gym envs need the skyrl-gym package: pip install 'agentrl[skyrl-gym]' ({e})") from e


def env_names() -> list[str]:
    """SkyRL-Gym's registered env ids (the ``skyrl_gym/<id>`` names)."""
    return sorted(skyrl_gym.registry)


def env_config_for(env: str, given: dict[str, Any]) -> Any:
    """The ``env_config`` SkyRL's env ``env`` reads. SkyRL's trainer hands its envs an OmegaConf config, and some
    read it by attribute (``env_config.search_url``); the defaults are the config dataclass the env's constructor
    names in its ``env_config`` annotation (``SearchEnvConfig``...), overridden by ``given``. Raises ValueError
    naming a key the env's config does not have."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    module, _, name = str(skyrl_gym.registry[env].entry_point).partition(":")
    cls = getattr(importlib.import_module(module), name)
    try:
        annotation = typing.get_type_hints(cls.__init__).get("env_config")
    except Exception:  # an annotation that does not resolve: no defaults to take from it
        annotation = None
    schemas = [a for a in (typing.get_args(annotation) or (annotation,)) if dataclasses.is_dataclass(a)]
    try:
        return OmegaConf.merge(OmegaConf.structured(schemas[0]) if schemas else OmegaConf.create({}), given)
    except OmegaConfBaseException as e:
        raise ValueError(f"skyrl_gym/{env}: env_config: {str(e).splitlines()[0]}") from None


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Reads a JSONL file of SkyRL dataset rows; raises ``ValueError`` naming the file and line of a bad row."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except JSON_ERRORS as e:
                raise ValueError(f"{path}:{n}: not JSON ({json_error(e)})") from None
            prompt = row.get("prompt") if isinstance(row, dict) else None
            if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
                raise ValueError(f"{path}:{n}: a row needs a 'prompt' (a string or a list of chat messages)")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


class SkyRLGymEnv(Env):
    """One SkyRL-Gym env per episode, made from a dataset row (see the module docstring). kwargs: ``env`` (set by
    the id), ``tasks`` (the JSONL rows), ``env_config`` (SkyRL's per-env config: a dict over the env's defaults,
    :func:`env_config_for`)."""

    description = "SkyRL-Gym env, made per dataset row (kwarg tasks=rows.jsonl)"

    def __init__(self, env: str, tasks: str, env_config: dict[str, Any] | None = None):
        super().__init__()
        if env not in skyrl_gym.registry:
            raise ValueError(f"SkyRLGymEnv: unknown env {env!r}; SkyRL-Gym has {env_names()}")
        self.env_id, self.rows = env, load_rows(tasks)
        self.env_config = env_config_for(env, env_config or {})
        self.sky: Any = None
        self.current_key = ""
        self.done = True

    def _key(self, row: dict[str, Any]) -> str:
        return f"skyrl_gym/{self.env_id}:{hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:16]}"

    def task_key(self, seed: int) -> str:
        """The content identity of row ``seed % len(rows)`` (the env contract's ``task_key``; makes no env)."""
        return self._key(self.rows[seed % len(self.rows)])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Makes the env for row ``seed % len(rows)`` (drawn from ``self.np_random`` when ``seed`` is None)."""
        super().reset(seed=seed)
        self.close()
        index = seed % len(self.rows) if seed is not None else int(self.np_random.integers(len(self.rows)))
        row = self.rows[index]
        extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
        prompt = as_messages(row["prompt"])
        self.sky = skyrl_gym.make(self.env_id, env_config=self.env_config, extras=extras)
        obs, metadata = self.sky.init(prompt)
        self.done = False
        self.current_key = self._key(row)
        info = {k: v for k, v in (metadata or {}).items() if isinstance(v, (str, int, float, bool))}
        return [dict(m) for m in obs], {**info, "task_key": self.current_key, "index": index}

    def step(self, action: str) -> StepResult:
        """One SkyRL step: its observations, reward and done."""
        if self.done or self.sky is None:
            return [{"role": "user", "content": "The episode is over. Call reset() for a new one."}], 0.0, True, False, {"invalid_action": True}
        out = self.sky.step(str(action))
        reward = float(out.get("reward") or 0.0)
        if not math.isfinite(reward):
            raise ValueError(f"SkyRL-Gym env {self.env_id!r} returned a non-finite reward {reward!r}")
        self.done = bool(out.get("done"))
        metadata = out.get("metadata") or {}
        info = {k: v for k, v in metadata.items() if isinstance(v, (str, int, float, bool))}
        obs = [dict(m) for m in (out.get("observations") or [])]
        if not obs:  # an agentrl step always says something: SkyRL's "no observation" becomes a short note
            obs = [{"role": "user", "content": f"Reward {reward:g}." if self.done else "(no observation)"}]
        return obs, reward, self.done, False, {**info, "task_key": self.current_key}

    def close(self) -> None:
        if self.sky is not None:
            sky, self.sky = self.sky, None
            sky.close()
