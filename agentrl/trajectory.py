"""The trajectory record: the one data type that the manager, the agent loop, the buffer and the trainer pass.

Token-level fields are aligned: ``len(token_ids) == len(loss_mask) == len(logprobs) == len(versions)``.
``loss_mask[i] == 1`` exactly on tokens the policy generated; on those, ``logprobs[i]`` is the behavior
log-probability reported by the engine and ``versions[i]`` the policy version that produced the token. On every
other token (prompt, chat template, env messages) ``logprobs[i] == 0.0`` and ``versions[i] == -1``.
A trajectory may span weight updates, so versions can differ within one trajectory; the version range is derived
from them, never stored instead of them.

Segments: when the chat template rewrites history (``rollout.chat.template_mode: split``), one episode is several
training samples, each with exactly the context its tokens were generated in. ``segments`` then holds their lengths
(summing to ``len(token_ids)``) and ``token_ids`` their concatenation; the trainer treats each segment as its own
sequence with the trajectory's advantage (:meth:`Trajectory.segment_slices`). Empty ``segments``: one sample.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

TerminationReason = Literal["terminated", "truncated", "error", "cancelled"]
TERMINATION_REASONS: tuple[str, ...] = ("terminated", "truncated", "error", "cancelled")


def check_aligned(token_ids: list[int], loss_mask: list[int], logprobs: list[float], versions: list[int],
                  who: str) -> None:
    """Raises ``ValueError`` (naming ``who``) unless the four per-token arrays hold the invariants of the module
    docstring; generated tokens must also have a finite log-prob (a NaN from an engine run past its limits would
    poison every ratio it enters)."""
    n = len(token_ids)
    for name, arr in (("loss_mask", loss_mask), ("logprobs", logprobs), ("versions", versions)):
        if len(arr) != n:
            raise ValueError(f"{who}: len({name})={len(arr)} != len(token_ids)={n}")
    for i, (m, v, lp) in enumerate(zip(loss_mask, versions, logprobs)):
        if m not in (0, 1):
            raise ValueError(f"{who}: loss_mask[{i}]={m} is not 0/1")
        if m == 1 and v < 0:
            raise ValueError(f"{who}: generated token {i} has no policy version")
        if m == 1 and not math.isfinite(lp):
            raise ValueError(f"{who}: generated token {i} has a non-finite log-prob ({lp})")
        if m == 0 and v != -1:
            raise ValueError(f"{who}: non-generated token {i} has version {v} (must be -1)")


@dataclass
class TokenTape:
    """The one home of the four aligned per-token arrays while they are being recorded (the agent loop's session,
    a gateway segment, a policy's token record); :class:`Trajectory` stores them. Appending keeps them aligned:
    :meth:`add_fixed` for tokens the policy did not sample (prompt, template, env messages), :meth:`add_generated`
    for sampled ones, refused unless every token has a version and a finite log-prob."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def add_fixed(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_generated(self, token_ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        n = len(token_ids)
        if len(logprobs) != n or len(versions) != n:
            raise ValueError(f"misaligned generation: {n} tokens, {len(logprobs)} logprobs, {len(versions)} versions")
        if any(v < 0 for v in versions):
            raise ValueError(f"a generated token without a version: {versions!r:.200}")
        bad = [i for i, x in enumerate(logprobs) if not math.isfinite(x)]
        if bad:
            raise ValueError(f"generated token {bad[0]} has a non-finite log-prob ({logprobs[bad[0]]}): the engine "
                             f"sampled outside its valid range (e.g. past the model's positions)")
        self.token_ids += token_ids
        self.loss_mask += [1] * n
        self.logprobs += [float(x) for x in logprobs]
        self.versions += [int(v) for v in versions]

    def check(self, who: str = "tokens") -> None:
        check_aligned(self.token_ids, self.loss_mask, self.logprobs, self.versions, who)


@dataclass
class Trajectory:
    id: str
    group_id: str
    env_id: str
    seed: int | None = None
    task: Any = None
    # Token-level, aligned (see module docstring). Empty for text-only policies.
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_len: int = 0  # tokens of the opening messages (always loss_mask 0)
    segments: list[int] = field(default_factory=list)  # lengths of the training samples (empty: one)
    messages: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # one per env step
    reward: float = 0.0  # final (episode) reward used for advantages
    termination: TerminationReason = "terminated"
    error: str | None = None
    num_turns: int = 0
    # Seconds: env_s (in reset/step), policy_s (waiting for actions), queue_s (created -> first reset),
    # total_s (created -> finished).
    timings: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.termination not in TERMINATION_REASONS:
            raise ValueError(f"termination must be one of {TERMINATION_REASONS}, got {self.termination!r}")

    def validate(self) -> None:
        """Raises ``ValueError`` if the token-level fields break the alignment invariants."""
        n = len(self.token_ids)
        check_aligned(self.token_ids, self.loss_mask, self.logprobs, self.versions, f"trajectory {self.id}")
        if self.segments and (sum(self.segments) != n or any(s < 1 for s in self.segments)):
            raise ValueError(f"trajectory {self.id}: segments {self.segments!r:.100} must be positive lengths "
                             f"summing to len(token_ids)={n}")

    def segment_slices(self) -> list[tuple[int, int]]:
        """Returns ``(start, end)`` of each training sample in ``token_ids`` (one slice when not segmented)."""
        if not self.segments:
            return [(0, len(self.token_ids))]
        out, at = [], 0
        for n in self.segments:
            out.append((at, at + n))
            at += n
        return out

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    def version_range(self) -> tuple[int, int] | None:
        """Returns (oldest, newest) version over the generated tokens, or None if none was generated."""
        vs = [v for v, m in zip(self.versions, self.loss_mask) if m]
        return (min(vs), max(vs)) if vs else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown trajectory fields: {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_json(cls, line: str) -> "Trajectory":
        return cls.from_dict(json.loads(line))


@dataclass
class Group:
    """``group_size`` finished trajectories that share a task and seed (for group-relative advantages)."""

    id: str
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]
