"""reasoning-gym datasets as agentrl envs: ``agentrl.make("reasoning_gym/<dataset>", **config)``.

Flow: ``reset(seed)`` picks entry ``seed % size`` of the dataset (built once per process and config, shared by
every env of that config) and shows its question; the one ``step`` takes the model's answer from its last
``<answer>...</answer>`` block and scores it with the dataset's own ``score_answer`` (reasoning-gym's reward, a
float in [0, 1]); the episode then terminates.

Invariants:

- Same dataset, config and seed give the same question, in any process: entries come from reasoning-gym's own
  ``Random(config.seed + index)`` and the index from the seed.
- A few generators draw from the process-global ``random``/``numpy.random`` (``list_functions``) or seed them
  (``pool_matrix``). Every call into the library (building a dataset, making an entry, scoring) therefore holds the
  bridges' one lock (:mod:`.rng`) and gives what it gives with both global generators seeded from the entry's
  identity, the process's states restored afterwards: such entries stay reproducible, and no other code on another
  thread sees the global RNG state move. Making an entry and scoring are pure, so they are seeded only when seen to
  draw (:func:`.rng.replayable`); the rest run once, unseeded, for a fifth of the guard's cost or less.
- The model's answer never reaches a scorer that evaluates it as code (``eval``, sympy's ``parse_expr``: found in
  the scorer's source) unless it is a plain expression (:mod:`.safe_answer`) or the entry's own answer: otherwise it
  scores 0 and ``info["score_error"]`` says why. Scoring is bounded (``call_timeout_s``, 60 s; :mod:`.deadline`):
  a scorer stuck on an answer scores it 0 instead of holding the lock.
- ``task_key(seed)`` (the env contract's content identity, also ``info["task_key"]`` of ``reset``) is
  ``reasoning_gym/<dataset>:<sha256 of the question>``, so held-out evaluation excludes by content whatever seeds
  made it (seeds ``s`` and ``s + size`` draw one entry and share it).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import re
import typing
from typing import Any, Callable, ContextManager, TypeVar

import numpy as np

from agentrl.core import Env, Message, StepResult
from agentrl.envs.bridges.deadline import timeout_arg
from agentrl.envs.bridges.errors import describe
from agentrl.envs.bridges.rng import LOCK, replayable, seeded
from agentrl.envs.bridges.safe_answer import refusal

try:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS
    from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
except ImportError as e:  # an optional extra: say which
    raise ImportError(f"reasoning_gym envs need the reasoning-gym package: pip install 'agentrl[reasoning-gym]' ({e})") from e

T = TypeVar("T")
_datasets: dict[tuple[str, str], Any] = {}


def dataset_names() -> list[str]:
    """The names of every dataset reasoning-gym registers (the ``reasoning_gym/<name>`` ids)."""
    return sorted(DATASETS)


def _seed_of(key: tuple[Any, ...]) -> int:
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:4], "little")


def global_rng(*key: Any, bound_s: float | None = None) -> ContextManager[None]:
    """Holds the bridges' one lock with ``random`` and ``numpy.random`` seeded from ``key``; puts the process's
    states back on exit (:mod:`.rng`). ``bound_s``: the body is interrupted past it (:mod:`.deadline`)."""
    return seeded(_seed_of(key), bound_s, f"reasoning-gym {key[0]}")


def library_call(fn: Callable[[], T], *key: Any, bound_s: float | None = None) -> T:
    """``fn()`` as ``with global_rng(*key): fn()`` gives it, seeding only where ``fn`` draws from the global
    generators (:func:`.rng.replayable`: making an entry and scoring are pure functions of their inputs and those
    draws). The kind of call (dataset and entry or score) is remembered once seen to draw."""
    return replayable((key[0], key[-1] == "score"), lambda: _seed_of(key), fn, bound_s, f"reasoning-gym {key[0]}")


_EVALUATES = re.compile(r"(?<![\w.])(?:eval|exec)\(|(?:parse_expr|sympify)\(")


@functools.lru_cache(maxsize=None)
def scorer_evaluates(name: str) -> bool:
    """Whether dataset ``name``'s ``score_answer`` runs its input as code (read from its source; a scorer whose
    source cannot be read counts as one that does)."""
    try:
        return bool(_EVALUATES.search(inspect.getsource(DATASETS[name][0].score_answer)))
    except (KeyError, TypeError, OSError):
        return True


def answer_refusal(name: str, answer: str, entry: dict[str, Any]) -> str | None:
    """Why ``answer`` must not reach dataset ``name``'s scorer, or None (see the module docstring). A composite
    dataset's entry is judged by the dataset it came from."""
    source = (entry.get("metadata") or {}).get("source_dataset", name)
    if not scorer_evaluates(source):
        return None
    known = [entry.get("answer"), *((entry.get("metadata") or {}).get("valid_answers") or [])]
    if answer.strip() in {str(k).strip() for k in known if k is not None}:
        return None
    why = refusal(answer)
    return None if why is None else f"answer refused: {why} (the {source} scorer evaluates answers as code)"


@functools.lru_cache(maxsize=None)
def _config_fields(name: str) -> dict[str, dataclasses.Field]:  # once per dataset: every episode makes an env
    return {f.name: f for f in dataclasses.fields(DATASETS[name][1])}


@functools.lru_cache(maxsize=None)
def _field_types(name: str) -> dict[str, Any]:
    return typing.get_type_hints(DATASETS[name][1])  # ~70 us: once per dataset, not per env


def _as_enums(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the strings a config file or command line gives turned into the enum members that the
    dataset's config fields of an enum type (or a list of one) hold, e.g. aiw's ``task_types=[siblings]``. Raises
    ``ValueError`` naming the field and the choices for a string that is no member."""
    hints = _field_types(name)
    out = dict(config)
    for key, value in config.items():
        hint = hints.get(key)
        many = typing.get_origin(hint) is list
        kind = (typing.get_args(hint) or (None,))[0] if many else hint
        if not (isinstance(kind, type) and issubclass(kind, enum.Enum)):
            continue
        choices = [m.value for m in kind]

        def member(v: Any) -> Any:
            if isinstance(v, kind):
                return v
            try:
                return kind(v)
            except ValueError:
                raise ValueError(f"ReasoningGymEnv({name}): {key} has {v!r}, not one of {choices}") from None

        out[key] = [member(v) for v in value] if many and isinstance(value, (list, tuple)) else member(value)
    return out


def get_dataset(name: str, config: dict[str, Any]) -> Any:
    """The process's one dataset of ``name`` with ``config`` (built on first use, under the lock)."""
    key = (name, json.dumps(config, sort_keys=True, default=repr))
    with LOCK:
        ds = _datasets.get(key)
        if ds is None:
            with global_rng(name, key[1], "build"):
                ds = _datasets[key] = reasoning_gym.create_dataset(name, **config)
        return ds


class ReasoningGymEnv(Env):
    """One reasoning-gym question, answered in one turn.

    - **kwargs**: ``dataset`` (a reasoning-gym name, set by the id), ``size`` (entries drawn from; default the
      dataset's own, usually 500), ``dataset_seed`` (the dataset config's ``seed``, default 0),
      ``system_prompt`` (a key of reasoning-gym's ``SYSTEM_PROMPTS``, default ``"default"``, or ``"none"``), any
      other kwarg is a field of the dataset's config (e.g. ``min_animals=2``); an unknown one is an error that
      lists the valid fields.
    - **Observation**: ``reset`` gives the system prompt (asking for ``<answer>...</answer>``) and the question;
      ``step`` gives a user message with the score and the expected answer.
    - **Action**: text whose last ``<answer>...</answer>`` block is the answer.
    - **Reward**: ``score_answer(answer, entry)`` of the dataset (None when there is no ``<answer>`` block, as
      reasoning-gym's own evaluation does; ``info["invalid_action"]`` is then set). A scorer that raises on the
      answer gives 0.0 and ``info["score_error"]``.
    - **Termination**: after the one step. **Info** of ``reset``: ``task_key``, ``dataset``, ``index``,
      ``question``.
    """

    description = "reasoning-gym dataset: one procedurally generated question, scored by reasoning-gym"

    def __init__(self, dataset: str, size: int | None = None, dataset_seed: int = 0, system_prompt: str = "default",
                 call_timeout_s: float = 60.0, **config: Any):
        super().__init__()
        self.call_timeout_s = timeout_arg(call_timeout_s, "ReasoningGymEnv")
        if dataset not in DATASETS:
            raise ValueError(f"ReasoningGymEnv: unknown dataset {dataset!r} (see reasoning_gym.factory.DATASETS)")
        fields = _config_fields(dataset)
        bad = sorted(k for k in config if k not in fields or k in ("seed", "size"))
        if bad:
            valid = sorted(k for k in fields if k not in ("seed", "size"))
            raise ValueError(f"ReasoningGymEnv({dataset}): unknown config field(s) {bad}; valid: {valid} "
                             "(and size, dataset_seed, system_prompt, call_timeout_s)")
        if system_prompt != "none" and system_prompt not in SYSTEM_PROMPTS:
            raise ValueError(f"ReasoningGymEnv: system_prompt must be 'none' or one of {sorted(SYSTEM_PROMPTS)}, "
                             f"got {system_prompt!r}")
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f"ReasoningGymEnv: size must be a positive int, got {size!r}")
        if not isinstance(dataset_seed, int):
            raise ValueError(f"ReasoningGymEnv: dataset_seed must be an int, got {dataset_seed!r}")
        self.name = dataset
        sized = {"size": size} if size is not None else {}
        self.config = {**_as_enums(dataset, config), "seed": dataset_seed, **sized}
        self.dataset = get_dataset(dataset, self.config)
        self.system_prompt = "" if system_prompt == "none" else SYSTEM_PROMPTS[system_prompt]
        self.index = 0
        self.entry: dict[str, Any] | None = None
        self.current_key = ""

    def entry_at(self, index: int) -> dict[str, Any]:
        """Entry ``index % size`` of the dataset (under the global-RNG lock)."""
        index %= len(self.dataset)
        return library_call(lambda: self.dataset[index], self.name, self.config.get("seed"), index)

    def index_of(self, seed: int) -> int:
        return seed % len(self.dataset)

    def _key(self, question: str) -> str:
        return f"reasoning_gym/{self.name}:{hashlib.sha256(question.encode()).hexdigest()[:16]}"

    def task_key(self, seed: int) -> str:
        """The content identity of the entry ``reset(seed=seed)`` shows: the dataset and its question's hash (the
        env contract's ``task_key``; two seeds on one entry, ``seed % size``, share it)."""
        return self._key(str(self.entry_at(self.index_of(seed))["question"]))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Shows entry ``seed % size`` (a random one from ``self.np_random`` when ``seed`` is None)."""
        super().reset(seed=seed)
        self.index = self.index_of(seed) if seed is not None else int(self.np_random.integers(len(self.dataset)))
        self.entry = self.entry_at(self.index)
        question = str(self.entry["question"])
        self.current_key = self._key(question)
        obs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": question}]
        return obs, {"task_key": self.current_key, "dataset": self.name, "index": self.index, "question": question}

    def step(self, action: str) -> StepResult:
        """Scores the answer; always terminates."""
        if self.entry is None:
            return [{"role": "user", "content": "The question is already answered. Call reset() for a new one."}], 0.0, True, False, {"invalid_action": True}
        entry, self.entry = self.entry, None
        answer = extract_answer(str(action))
        info: dict[str, Any] = {"task_key": self.current_key, "invalid_action": answer is None}
        refused = answer_refusal(self.name, answer, entry) if answer is not None else None
        if refused is not None:
            reward, info["score_error"] = 0.0, refused
        else:
            try:
                reward = float(library_call(lambda: self.dataset.score_answer(answer, entry), self.name,
                                            self.config.get("seed"), self.index, "score", bound_s=self.call_timeout_s))
            except Exception as e:  # the scorer choking on the model's text is the model's failure, not the env's
                reward, info["score_error"] = 0.0, describe(e)
        if not np.isfinite(reward):
            reward, info["score_error"] = 0.0, f"score_answer returned {reward!r}"
        info["correct"] = reward >= 1.0
        expected = str(entry["answer"])
        text = f"Score {reward:g}." + ("" if info["correct"] else f" The expected answer is {expected}.")
        if answer is None:
            text = "No <answer>...</answer> block found. " + text
        return [{"role": "user", "content": text}], reward, True, False, info

    # -- oracles: the gold answer is not in the conversation, so they read the entry -----------------------------
    def solve(self, conversation: list[Message]) -> str:
        """The gold answer of the current episode, as an action (for ``agentrl envs check``)."""
        entry = self.entry if self.entry is not None else self.entry_at(self.index)
        return f"<answer>{entry['answer']}</answer>"

    def oracle_policy(self) -> Any:
        """A :class:`agentrl.policy.ScriptedPolicy` answering each episode with its entry's gold answer (the entry
        from ``meta.seed``, for an env made with this env's kwargs)."""
        from agentrl.policy import ScriptedPolicy

        def act(conversation: list[Message], meta: Any) -> str:
            if meta.seed is None:
                raise ValueError("the reasoning-gym oracle needs the episode's seed (meta.seed is None)")
            return f"<answer>{self.entry_at(self.index_of(meta.seed))['answer']}</answer>"

        return ScriptedPolicy(act)
