"""Benchmark evaluation: a policy over a suite of envs, with resumable outputs and a report.

``run_eval(cfg)`` lists the instances of every env of the suite, skips those already recorded in the output
directory, runs the others with at most ``cfg.concurrency`` episodes alive at once, and writes into ``cfg.out``:

- ``trajectories.jsonl``: one record per finished instance (see :func:`episode_record`), the resume key being
  ``(env, instance_id)``;
- ``predictions.jsonl``: for envs whose final ``info`` carries a ``patch`` (SWE envs), one SWE-bench prediction per
  instance: ``{"instance_id", "model_name_or_path", "model_patch"}``; an episode of such an env (its class sets
  ``writes_predictions = True``) that errored gets an empty ``model_patch``, so every instance has one;
- ``report.json`` and ``report.md``: per env (and per ``info["category"]`` when envs report one) the number of
  instances, successes, accuracy (or resolved rate), mean reward, errors, tokens, time, and ``flagged``: episodes
  whose final ``info["integrity"]["flagged"]`` is set (SWE: read git history, or edited the tests that grade it).

Consistency (a crash or Ctrl-C at any moment leaves files a rerun can use):

- every line is written with one ``write`` on an ``O_APPEND`` descriptor and flushed (``fsync`` at the end), so a
  line is complete or absent; a torn last line (a kill during the write) is detected when the file is opened again
  and cut off;
- the trajectory line is written before its prediction line, in one step of the event loop, so an interrupt cannot
  fall between them; on resume, predictions without a trajectory are dropped and missing ones are rebuilt from the
  trajectory records (so ``predictions.jsonl`` never has duplicates);
- an interrupted episode writes nothing and is run again by the next run; the report is rewritten from the records
  on every exit (``"complete": false`` if instances are missing).

Instances: an env that has ``task_ids()`` (BFCL, SWE) is evaluated on every task, ``options={"index": i}`` and
``seed=i`` for the i-th; other envs (procedurally generated ones) on seeds ``seed .. seed+n-1`` with ``n`` the
limit (default :data:`DEFAULT_SEEDS`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from agentrl.config import ConfigError, from_dict
from agentrl.policy import EpisodeMeta, Policy, ScriptedPolicy
from agentrl.trajectory import Trajectory

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


# ---------------------------------------------------------------------------------------------------------------
# Config


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


@dataclass
class PolicyConfig:
    """What acts. ``kind``: ``oracle`` (the env's scripted solver: ground truth for BFCL and SWE), ``empty`` (answers
    nothing, or the env's own empty policy), ``vllm`` (in-process engine over ``model``, a HF model dir; the tiny
    model when unset), ``remote`` (vLLM servers started with ``--enable-scale-out`` at ``endpoint``; ``model`` is
    the name they serve and, unless ``engine.tokenizer`` is set, the tokenizer directory, needed for
    token-in/token-out). ``name`` is the
    ``model_name_or_path`` of predictions. ``engine`` holds ``agentrl.inference.config.EngineConfig`` fields,
    ``rollout`` ``agentrl.rollout.RolloutConfig`` fields (both checked when the policy is built)."""

    kind: Literal["oracle", "empty", "vllm", "remote"] = "oracle"
    model: str | None = None  # vllm: weights dir or "tiny" (default); remote: served name = tokenizer dir
    endpoint: str | None = None
    name: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
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


# ---------------------------------------------------------------------------------------------------------------
# Instances


@dataclass(frozen=True)
class Instance:
    """One episode to run: ``env`` is the entry's label, ``instance_id`` unique within it."""

    env: str
    env_id: str
    kwargs: tuple[tuple[str, Any], ...]
    instance_id: str
    seed: int
    options: tuple[tuple[str, Any], ...] = ()
    predicts: bool = False  # the env writes SWE-bench predictions (an errored episode gets an empty patch)

    @property
    def key(self) -> tuple[str, str]:
        return (self.env, self.instance_id)


def _ensure_registered(env_id: str) -> None:
    # The BFCL and SWE ids are registered by agentrl.envs; registering here too keeps eval working in a checkout
    # where envs/__init__.py does not list them yet (idempotent).
    import gymnasium

    if env_id in gymnasium.registry:
        return
    if env_id.startswith("agentrl/BFCL-"):
        from agentrl.envs.bfcl import register_all

        register_all()
    elif env_id == "agentrl/SWE-v0":
        from agentrl.registration import register

        register("agentrl/SWE-v0", entry_point="agentrl.envs.swe:SWEEnv",
                 description="SWE-bench-style bug fixing in a docker/bwrap sandbox (offline suite)")


def _make_env(env_id: str, kwargs: dict[str, Any], max_episode_steps: int | None):
    # The manager's own constructor: a registered id, or "package.module:Class".
    from agentrl.workers import make_env

    _ensure_registered(env_id)
    kw = dict(kwargs)
    if max_episode_steps is not None:
        kw["max_episode_steps"] = max_episode_steps
    return make_env(env_id, kw)


def task_ids_of(env: Any) -> list[str] | None:
    """Returns the ids of an indexed env's tasks (``options={"index": i}`` selects the i-th): its ``task_ids()``,
    or the ``instance_id`` of each of its ``instances`` (SWE); None for seed-indexed envs."""
    fn = getattr(env, "task_ids", None)
    if callable(fn):
        return [str(t) for t in fn()]
    insts = getattr(env, "instances", None)
    if isinstance(insts, (list, tuple)) and insts and all(hasattr(i, "instance_id") for i in insts):
        return [str(i.instance_id) for i in insts]
    return None


def list_instances(entry: EnvEntry, limit: int | None, seed: int = 0) -> list[Instance]:
    """Returns the entry's instances in a fixed order (the first ``limit`` if given; ``entry.limit`` wins).

    Raises :class:`ConfigError` naming the env if it cannot be made."""
    n = entry.limit or limit
    try:
        env = _make_env(entry.id, entry.kwargs, None)
    except Exception as e:
        raise ConfigError(f"env {entry.label!r}: cannot make {entry.id!r}: {type(e).__name__}: {e}") from e
    try:
        ids = task_ids_of(env.unwrapped)
        kw = tuple(sorted(entry.kwargs.items()))
        predicts = bool(getattr(env.unwrapped, "writes_predictions", False))
        if ids is not None:
            ids = ids[: n or None]
            return [Instance(entry.label, entry.id, kw, str(t), i, (("index", i),), predicts) for i, t in enumerate(ids)]
        count = n or DEFAULT_SEEDS
        return [Instance(entry.label, entry.id, kw, f"seed-{s}", s) for s in range(seed, seed + count)]
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------------------------
# Append-only JSON-lines files


class JsonlLog:
    """An append-only JSON-lines file whose lines are complete or absent.

    ``open()`` reads the existing records, cuts off a torn last line (no final newline, or not JSON) and returns
    the records (an unparseable line inside the file, which this class never writes, is skipped and counted). ``append(obj)`` writes ``json + "\\n"`` with a single ``os.write`` on an ``O_APPEND`` descriptor.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None
        self.dropped_partial = False  # open() cut off a torn last line
        self.bad_lines = 0  # unparseable lines inside the file, skipped

    def open(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        if self.path.exists():
            data = self.path.read_bytes()
            good = 0  # byte offset after the last complete, parseable line
            pos = 0
            while pos < len(data):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break  # no final newline: a torn last line
                line = data[pos:nl]
                obj = None
                if line.strip():
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError:
                        if nl + 1 >= len(data):
                            break  # the last line does not parse: torn
                        self.bad_lines += 1  # damage inside the file (not ours): skipped, kept
                if isinstance(obj, dict):
                    records.append(obj)
                pos = good = nl + 1
            if good < len(data):
                self.dropped_partial = True
                with self.path.open("r+b") as f:
                    f.truncate(good)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return records

    def append(self, obj: dict[str, Any]) -> None:
        if self._fd is None:
            raise RuntimeError(f"{self.path}: append() before open()")
        data = (json.dumps(obj, default=_json_default, ensure_ascii=False) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replaces the file's content atomically (temp file + rename) and reopens it for appending."""
        self.close()
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, default=_json_default, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


# ---------------------------------------------------------------------------------------------------------------
# Records


def success_of(reward: float, info: dict[str, Any]) -> bool:
    """Returns whether an episode counts as solved: ``info["resolved"]`` (SWE), else ``info["correct"]``, else
    ``reward >= 1``."""
    for key in ("resolved", "correct"):
        if isinstance(info.get(key), bool):
            return info[key]
    return reward >= 1.0


def episode_record(inst: Instance, traj: Trajectory) -> dict[str, Any]:
    """Returns the ``trajectories.jsonl`` record of a finished episode: the instance, ``success``, ``reward``,
    ``termination``, ``error``, ``num_turns``, token counts, seconds, the final ``info`` and the trajectory."""
    info = traj.info or {}
    return {
        "env": inst.env,
        "env_id": inst.env_id,
        "instance_id": inst.instance_id,
        "seed": inst.seed,
        "options": dict(inst.options),
        "success": bool(success_of(traj.reward, info)) and traj.termination != "error",
        "reward": float(traj.reward),
        "termination": traj.termination,
        "error": traj.error,
        "num_turns": traj.num_turns,
        "prompt_tokens": traj.prompt_len,
        "generated_tokens": int(sum(traj.loss_mask)),
        "total_tokens": len(traj.token_ids),
        # Seconds from the episode's start to its trajectory (queueing for a concurrency slot excluded).
        "time_s": max(0.0, float(traj.timings.get("total_s", 0.0)) - float(traj.timings.get("queue_s", 0.0))),
        "queue_s": float(traj.timings.get("queue_s", 0.0)),
        "category": info.get("category"),
        "predicts": inst.predicts,
        "info": info,
        "trajectory": traj.to_dict(),
    }


def prediction_of(record: dict[str, Any], model_name: str) -> dict[str, Any] | None:
    """Returns the SWE-bench prediction of a record whose final info has a ``patch`` (an empty patch for a record
    of a predicting env without one: an errored episode), else None."""
    info = record.get("info") or {}
    if "patch" not in info and not record.get("predicts"):
        return None
    patch = info.get("patch")
    return {
        "instance_id": info.get("instance_id") or record["instance_id"],
        "model_name_or_path": model_name,
        "model_patch": patch if isinstance(patch, str) else "",
    }


# ---------------------------------------------------------------------------------------------------------------
# Policies


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
    """A policy and the coroutine that releases what it holds (engines)."""

    policy: Policy
    close: Callable[[], Any] | None = None


def build_policy(cfg: PolicyConfig, kwargs_by_env: dict[str, dict[str, Any]] | None = None) -> BuiltPolicy:
    """Returns the policy ``cfg`` describes (engines are started here; call ``close`` when done).
    ``kwargs_by_env``: env constructor kwargs per env id (the scripted policies build an env to find theirs)."""
    if cfg.kind == "oracle":
        return BuiltPolicy(_DispatchPolicy(oracle_policy_for, kwargs_by_env or {}))
    if cfg.kind == "empty":
        return BuiltPolicy(_DispatchPolicy(empty_policy_for, kwargs_by_env or {}))
    from agentrl.inference.config import EngineConfig, make_engine
    from agentrl.rollout import AgentLoopPolicy, RolloutConfig

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

    return BuiltPolicy(policy, close)


# ---------------------------------------------------------------------------------------------------------------
# Running episodes


def episode_spec(inst: Instance, max_episode_steps: int | None = None) -> Any:
    """Returns the manager's :class:`~agentrl.manager.EpisodeSpec` of an instance: ``seed``, reset ``options``
    (``{"index": i}`` for indexed envs) and, for indexed envs, ``task={"instance_id", "index"}`` (which policies
    see as ``meta.task`` and envs as ``options["task"]``)."""
    from agentrl.manager import EpisodeSpec

    kwargs = dict(inst.kwargs)
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    options = dict(inst.options)
    task = {"instance_id": inst.instance_id, **options} if options else None
    return EpisodeSpec(env_id=inst.env_id, env_kwargs=kwargs, seed=inst.seed, task=task,
                       group_id=f"{inst.env}/{inst.instance_id}", options=options or None)


async def _quietly(coro: Any) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        pass


# ---------------------------------------------------------------------------------------------------------------
# Report


def summarize(records: list[dict[str, Any]], expected: dict[str, int], wall_s: float | None = None,
              policy: str = "") -> dict[str, Any]:
    """Returns the report: per env (``rows``, in ``expected``'s order) and per (env, category) when records carry a
    category, plus ``total``. Each row: ``n`` done, ``expected``, ``success``, ``accuracy`` (success/n),
    ``mean_reward``, ``errors``, ``flagged``, ``truncated``, ``prompt_tokens``/``generated_tokens`` (sums),
    ``mean_time_s``."""

    def row(name: str, rs: list[dict[str, Any]], exp: int | None) -> dict[str, Any]:
        n = len(rs)
        succ = sum(1 for r in rs if r.get("success"))
        return {
            "env": name,
            "n": n,
            "expected": exp,
            "success": succ,
            "accuracy": succ / n if n else 0.0,
            "mean_reward": sum(float(r.get("reward", 0.0)) for r in rs) / n if n else 0.0,
            "errors": sum(1 for r in rs if r.get("termination") == "error"),
            "flagged": sum(1 for r in rs if ((r.get("info") or {}).get("integrity") or {}).get("flagged")),
            "truncated": sum(1 for r in rs if r.get("termination") == "truncated"),
            "prompt_tokens": sum(int(r.get("prompt_tokens", 0)) for r in rs),
            "generated_tokens": sum(int(r.get("generated_tokens", 0)) for r in rs),
            "mean_time_s": sum(float(r.get("time_s", 0.0)) for r in rs) / n if n else 0.0,
        }

    by_env: dict[str, list[dict[str, Any]]] = {name: [] for name in expected}
    for r in records:
        by_env.setdefault(r["env"], []).append(r)
    rows, categories = [], []
    for name, rs in by_env.items():
        rows.append(row(name, rs, expected.get(name)))
        cats = sorted({str(r["category"]) for r in rs if r.get("category") is not None})
        if len(cats) > 1:
            for c in cats:
                categories.append(row(f"{name} [{c}]", [r for r in rs if str(r.get("category")) == c], None))
    total = row("total", records, sum(expected.values()))
    report = {
        "policy": policy,
        "complete": all(r["n"] >= (r["expected"] or 0) for r in rows),
        "wall_s": wall_s,
        "rows": rows,
        "categories": categories,
        "total": total,
    }
    if any(str(r.get("env_id", "")).startswith("agentrl/BFCL-") for r in records):
        # BFCL's per-category and leaderboard scores, aggregated by bfcl-eval's own code (agentrl.envs.bfcl.scoring).
        from agentrl.envs.bfcl.scoring import section

        report["bfcl"] = section(records, policy or "agentrl")
    return report


def render_markdown(report: dict[str, Any]) -> str:
    """Returns the report as a markdown table (one line per env, then categories, then the total)."""
    lines = [
        f"# Evaluation report ({report.get('policy') or 'policy'})",
        "",
        "| env | done | success | accuracy | mean reward | errors | truncated | prompt tokens | generated tokens | mean s/instance |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in [*report["rows"], *report["categories"], report["total"]]:
        done = f"{r['n']}/{r['expected']}" if r.get("expected") is not None else str(r["n"])
        name = f"**{r['env']}**" if r["env"] == "total" else r["env"]
        lines.append(
            f"| {name} | {done} | {r['success']} | {100 * r['accuracy']:.1f}% | {r['mean_reward']:.3f} | {r['errors']} "
            f"| {r['truncated']} | {r['prompt_tokens']} | {r['generated_tokens']} | {r['mean_time_s']:.3f} |"
        )
    lines.append("")
    if report.get("wall_s") is not None:
        lines.append(f"Wall time of the last run: {report['wall_s']:.1f} s.")
    if not report.get("complete"):
        lines.append("Incomplete: some instances have no record yet; rerun the same command to finish.")
    flagged = report["total"].get("flagged", 0)
    if flagged:
        per_env = ", ".join(f"{r['env']}: {r['flagged']}" for r in report["rows"] if r.get("flagged"))
        lines.append(f"Flagged episodes (read git history, or edited the tests or test hooks that grade them): "
                     f"{flagged} ({per_env}).")
    lines.append("Success = SWE `resolved`, else the env's `correct`, else reward >= 1; errored episodes count as failures.")
    if report.get("bfcl"):
        from agentrl.envs.bfcl.scoring import render_markdown as bfcl_markdown

        lines += ["", bfcl_markdown(report["bfcl"])]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# The run


@dataclass
class EvalResult:
    report: dict[str, Any]
    out: Path
    ran: int  # episodes run by this call
    skipped: int  # instances found already done


def run_eval(cfg: EvalConfig, policy: Policy | None = None) -> EvalResult:
    """Runs ``cfg`` (see the module docstring) and returns the report. ``policy`` overrides ``cfg.policy``.

    A ``KeyboardInterrupt`` (Ctrl-C) stops the run after cancelling the live episodes (their envs are closed);
    the files stay consistent, the report is written, and the interrupt propagates."""
    cfg.validate()
    return asyncio.run(_run(cfg, policy))


async def _run(cfg: EvalConfig, given: Policy | None) -> EvalResult:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    instances: list[Instance] = []
    expected: dict[str, int] = {}
    for entry in cfg.entries():
        insts = list_instances(entry, cfg.limit, cfg.seed)
        expected[entry.label] = len(insts)
        instances += insts

    traj_log, pred_log = JsonlLog(out / TRAJECTORIES), JsonlLog(out / PREDICTIONS)
    records = traj_log.open()
    # One record per key: the last (a key has two only when retry_errors appended a new result after an error).
    # Records of keys no longer listed (a smaller limit) stay in the file but are not reported.
    wanted = {i.key for i in instances}
    done: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        done[(r.get("env"), r.get("instance_id"))] = r
    retry = {k for k, r in done.items() if cfg.retry_errors and r.get("termination") == "error"}
    model_name = cfg.policy.model_name
    _repair_predictions(pred_log, list(done.values()), retry, model_name)

    todo = [i for i in instances if i.key not in done or i.key in retry]
    for k in retry:
        done.pop(k, None)
    skipped = len(instances) - len(todo)

    built = BuiltPolicy(given) if given is not None else None
    t0 = time.monotonic()
    ran = 0
    bar = _progress(cfg, len(instances), [r for k, r in done.items() if k in wanted])
    try:
        if todo:
            from agentrl.manager import EnvManager, ManagerConfig

            if built is None:
                kwargs_by_env: dict[str, dict[str, Any]] = {}
                for e in cfg.entries():
                    kwargs_by_env.setdefault(e.id, dict(e.kwargs))
                built = build_policy(cfg.policy, kwargs_by_env)
            for inst in todo:
                _ensure_registered(inst.env_id)
            mcfg = ManagerConfig(workers=cfg.workers, max_concurrency=cfg.concurrency, max_turns=cfg.max_turns,
                                 max_failures_per_group=cfg.retries, episode_timeout_s=cfg.episode_timeout_s)
            async with EnvManager(mcfg, built.policy) as mgr:
                specs = [episode_spec(i, cfg.max_episode_steps) for i in todo]
                async for k, traj in mgr.stream_episodes(specs):
                    if traj.termination == "cancelled":
                        continue  # not a result: run again next time
                    inst = todo[k]
                    rec = episode_record(inst, traj)
                    # Trajectory first, then prediction, with no await between: a cancel cannot split them.
                    traj_log.append(rec)
                    pred = prediction_of(rec, model_name)
                    if pred is not None:
                        pred_log.append(pred)
                    done[inst.key] = rec
                    ran += 1
                    if bar is not None:
                        bar.update(rec)
    finally:
        if bar is not None:
            bar.close()
        traj_log.close()
        pred_log.close()
        if built is not None and built.close is not None and given is None:
            await _quietly(built.close())
        report = summarize([r for k, r in done.items() if k in wanted], expected, time.monotonic() - t0, model_name)
        write_report(out, report)
    return EvalResult(report=report, out=out, ran=ran, skipped=skipped)


def _repair_predictions(log: JsonlLog, records: list[dict[str, Any]], retry: set, model_name: str) -> None:
    """Makes ``predictions.jsonl`` hold exactly one prediction per recorded SWE instance (not being retried)."""
    preds = log.open()
    want: dict[str, dict[str, Any]] = {}
    for r in records:
        if (r.get("env"), r.get("instance_id")) in retry:
            continue
        p = prediction_of(r, model_name)
        if p is not None:
            want.setdefault(p["instance_id"], p)
    have = {}
    for p in preds:
        have.setdefault(p.get("instance_id"), p)
    if len(preds) != len(have) or set(have) != set(want):
        log.rewrite([have.get(i, p) for i, p in want.items()])


def write_report(out: Path, report: dict[str, Any]) -> None:
    """Writes ``report.json`` and ``report.md`` atomically (temp file + rename)."""
    for name, text in ((REPORT_JSON, json.dumps(report, indent=2) + "\n"), (REPORT_MD, render_markdown(report))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)


class _Progress:
    """A tqdm bar over all instances (resumed ones count as done) showing successes and the running accuracy."""

    def __init__(self, total: int, done: list[dict[str, Any]]):
        from tqdm import tqdm

        self.n = len(done)
        self.success = sum(1 for r in done if r.get("success"))
        self.bar = tqdm(total=total, initial=self.n, desc="eval", unit="inst", dynamic_ncols=True)
        self._post()

    def _post(self) -> None:
        acc = self.success / self.n if self.n else 0.0
        self.bar.set_postfix_str(f"ok={self.success}/{self.n} acc={100 * acc:.1f}%", refresh=False)

    def update(self, record: dict[str, Any]) -> None:
        self.n += 1
        self.success += bool(record.get("success"))
        self._post()
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _progress(cfg: EvalConfig, total: int, done: list[dict[str, Any]]) -> _Progress | None:
    return _Progress(total, done) if cfg.progress else None
