"""What both sides of ``bench_vs_trl.py`` share: the tasks, the held-out set, the scorer and the summary maths.

The race is only fair if both frameworks are judged by one ruler, so nothing here depends on either framework's
training code: the held-out set is agentrl's content-keyed evaluation set (:class:`agentrl.controller.heldout.HeldOut`,
the tasks ``agentrl train`` withholds from training, which the trl side withholds too because it trains on
``train_seeds``), and :func:`score` plays a checkpoint (an HF model directory, from either framework) on it with one
greedy transformers loop over the agentrl env itself. Both frameworks' checkpoints are scored after their runs, by
the same process, so scoring never competes with training for the 2 cores and costs neither side wall time.

The pure part (:func:`crossing_time`, :func:`success_at`, :func:`cpu_at`, :func:`curve`, :func:`ratio`) turns timestamped scores into
the table's figures; ``tests/controller/test_bench_vs_trl.py`` covers it without trl installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class Task:
    """One race: the env both frameworks train on, agentrl's config for it and the per-episode limits."""

    name: str
    env_id: str
    config: str  # agentrl config (relative to the repository root) whose warm start, model, lr, group size are used
    max_turns: int
    max_tokens_per_turn: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)


TASKS = {
    # multi-turn tool use: trl reaches the env's tools through its environment_factory
    "tooluse": Task("tooluse", "agentrl/ToolLookup-v0", "configs/tooluse.yaml", max_turns=5, max_tokens_per_turn=32),
    # single-turn: one question, one answer scored by reasoning-gym (trl: a plain reward function over the env)
    "family": Task("family", "reasoning_gym/family_relationships", "configs/reasoning_gym.yaml", max_turns=1,
                   max_tokens_per_turn=12,
                   env_kwargs={"min_family_size": 3, "max_family_size": 3, "size": 100000, "system_prompt": "none"}),
    # single-turn and learnable by the tiny model (BENCHMARKS.md, "Learning on a bridged env"): reasoning-gym's aiw
    "aiw": Task("aiw", "reasoning_gym/aiw", "configs/reasoning_gym_aiw.yaml", max_turns=1, max_tokens_per_turn=12,
                env_kwargs={"task_types": ["siblings"], "task_type_weights": [1.0], "size": 100000,
                            "system_prompt": "none"}),
}


# --------------------------------------------------------------------------------------------------- held-out set
def heldout(task: Task, episodes: int) -> Any:
    """agentrl's held-out set for ``task`` with ``episodes`` distinct tasks (content-keyed), and its training map."""
    from agentrl.controller.config import EnvConfig
    from agentrl.controller.heldout import HeldOut

    return HeldOut(EnvConfig(id=task.env_id, kwargs=dict(task.env_kwargs)), episodes)


def train_seeds(task: Task, episodes: int, count: int, seed_start: int = 0) -> list[int]:
    """The first ``count`` training seeds agentrl would play from ``seed_start`` (none plays a held-out task)."""
    from agentrl.controller.config import EnvConfig
    from agentrl.controller.heldout import HeldOut

    held = HeldOut(EnvConfig(id=task.env_id, kwargs=dict(task.env_kwargs), seed_start=seed_start), episodes)
    try:
        return [held.train(i) for i in range(count)]
    finally:
        held.close()


# ------------------------------------------------------------------------------------------------------- scorer
def score(model_dir: str, tokenizer_dir: str, task: Task, seeds: Sequence[int], batch: int = 128) -> dict[str, float]:
    """Plays one greedy episode per seed of ``task`` with the model in ``model_dir`` (HF format; the tokenizer and
    chat template of ``tokenizer_dir``) and returns ``success`` (share of episodes with reward > 0, as agentrl's
    evaluation counts it), mean ``reward``, ``episodes`` and ``distinct_tasks`` (by the env's ``task_key``).
    Turns: at most ``task.max_turns`` actions of at most ``task.max_tokens_per_turn`` tokens, each ended by the
    template's end-of-turn token; the env's own messages are appended as the agent loop appends them."""
    import torch
    from transformers import AutoModelForCausalLM

    import agentrl
    from agentrl.chat import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rewards: list[float] = []
    keys: set[str] = set()
    for lo in range(0, len(seeds), batch):
        envs = [agentrl.make(task.env_id, **task.env_kwargs) for _ in seeds[lo:lo + batch]]
        convs, total, live = [], [0.0] * len(envs), list(range(len(envs)))
        for env, s in zip(envs, seeds[lo:lo + batch]):
            obs, _ = env.reset(seed=int(s))
            convs.append(list(obs))
            key = env.unwrapped.task_key(int(s)) if hasattr(env.unwrapped, "task_key") else None
            keys.add(str(key) if key is not None else f"seed:{s}")
            env.reset(seed=int(s))  # task_key re-drew the task: start the episode afresh
        for _ in range(task.max_turns):
            if not live:
                break
            texts = [tok.apply_chat_template(convs[i], add_generation_prompt=True, tokenize=False) for i in live]
            ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
            width = max(map(len, ids))
            inp = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            with torch.no_grad():
                out = model.generate(input_ids=inp, attention_mask=mask, max_new_tokens=task.max_tokens_per_turn,
                                     do_sample=False, eos_token_id=eos, pad_token_id=pad)
            still = []
            for row, i in zip(out[:, width:].tolist(), live):
                action = tok.decode(row[: row.index(eos)] if eos in row else row, skip_special_tokens=True)
                obs, r, term, trunc, _ = envs[i].step(action)
                total[i] += float(r)
                convs[i] += [{"role": "assistant", "content": action}, *obs]
                if not (term or trunc):
                    still.append(i)
            live = still
        rewards += total
        for env in envs:
            env.close()
    n = max(len(rewards), 1)
    return {"success": sum(r > 0 for r in rewards) / n, "reward": sum(rewards) / n, "episodes": float(len(rewards)),
            "distinct_tasks": float(len(keys))}


# ---------------------------------------------------------------------------------------------- pure summaries
def curve(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``(seconds, success)`` points sorted by time (ties keep their order); non-finite points are dropped."""
    return sorted(((float(t), float(s)) for t, s in points if math.isfinite(t) and math.isfinite(s)),
                  key=lambda p: p[0])


def crossing_time(points: Sequence[tuple[float, float]], threshold: float | None) -> float | None:
    """The first time at which a scored checkpoint reaches ``success >= threshold``, or None if none does (or
    there is no threshold: no run beat the warm start)."""
    if threshold is None:
        return None
    for t, s in curve(points):
        if s >= threshold:
            return t
    return None


def success_at(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """The held-out success of the newest checkpoint scored at or before ``t`` (a step function: what the run had
    to show at that time), or None before its first checkpoint."""
    best = None
    for tt, s in curve(points):
        if tt > t:
            break
        best = s
    return best


def cpu_at(timeline: Sequence[tuple[float, float]], t: float | None) -> float | None:
    """The CPU seconds a run had used by wall time ``t``, interpolated in its ``(wall, cpu)`` samples (the last
    sample's CPU past its end); None for ``t`` None or no samples."""
    if t is None or not timeline:
        return None
    pts = curve(timeline)
    if t <= pts[0][0]:
        return pts[0][1] * (t / pts[0][0]) if pts[0][0] > 0 else pts[0][1]
    for (t1, c1), (t2, c2) in zip(pts, pts[1:]):
        if t1 <= t <= t2:
            return c1 + (c2 - c1) * ((t - t1) / (t2 - t1) if t2 > t1 else 0.0)
    return pts[-1][1]


def ratio(trl_s: float | None, agentrl_s: float | None) -> float | None:
    """How many times sooner agentrl got there (trl time / agentrl time); None when either never got there."""
    if trl_s is None or agentrl_s is None or agentrl_s <= 0:
        return None
    return trl_s / agentrl_s


def mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values, or None if any is None (a seed that never reached the threshold has no time)."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)  # type: ignore[arg-type]


def grid_pick(checkpoints: Sequence[tuple[float, str, int]], grid_s: float) -> list[str]:
    """The checkpoints scored first: for each multiple of ``grid_s`` seconds, the first checkpoint at or after it,
    and the last one. Scoring every checkpoint of a fast run (hundreds) would take longer than the race; the same
    grid for both frameworks keeps their curves equally fine."""
    cks = sorted(checkpoints, key=lambda c: c[0])
    if not cks:
        return []
    picked, k = [], 1
    for t, d, _ in cks:
        if t >= k * grid_s:
            picked.append(d)
            k = int(t // grid_s) + 1
    if cks[-1][1] not in picked:
        picked.append(cks[-1][1])
    return picked


def refine_pick(checkpoints: Sequence[tuple[float, str, int]], scored: dict[str, float],
                threshold: float | None) -> str | None:
    """The next checkpoint to score to find when a run first reached ``threshold``: between the last scored
    checkpoint below it and the first scored one at or above it (in time order), the middle unscored one (a
    bisection); None when they are adjacent or the run never reached it."""
    if threshold is None:
        return None
    cks = sorted(checkpoints, key=lambda c: c[0])
    below = -1
    for j, (_, d, _) in enumerate(cks):
        if d not in scored:
            continue
        if scored[d] >= threshold:
            gap = [i for i in range(below + 1, j) if cks[i][1] not in scored]
            return cks[gap[len(gap) // 2]][1] if gap else None
        below = j
    return None


def default_threshold(warm_start: float, best: float) -> float | None:
    """Halfway from the warm start's held-out success to the best any run reached; None when no run beat the warm
    start (a threshold at the warm start would be "reached" by every run's first checkpoint)."""
    if not best > warm_start:
        return None
    # Not rounded: halfway between two success rates of one held-out set can be a rate of it (k/N), and rounding
    # it up asked for k+1 right answers; the 1e-9 keeps float noise from doing the same.
    return warm_start + 0.5 * (best - warm_start) - 1e-9
