"""What a training run writes for ``agentrl view``: the trained trajectories of every step and the trainer's
per-token log-probs of a sample of them.

Files in the run directory (both JSON lines, appended once per step, in step order):

- ``trajectories.jsonl``: one line per trained trajectory, ``{"step": v, "summary": {...}, "trajectory": {...}}``
  where ``v`` is the step of ``metrics.jsonl`` (the version after the update), ``trajectory`` is
  :meth:`Trajectory.to_dict` and ``summary`` is :func:`summarize` (what the viewer's list shows, so that the viewer
  indexes a 100k-line file without parsing the token arrays; ``"step"`` and ``"summary"`` come first on purpose).
- ``trainer_logprobs.jsonl``: ``{"step": v, "trajectory_id": str, "version": int, "logprobs": [float]}``, one
  line per trajectory the trainer recorded (``TrainerConfig.record_logprobs``); ``logprobs[t]`` is the trainer's
  log-prob of ``token_ids[t + 1]`` with the weights of ``version`` (those the step trained from).

Crash safety: each step's lines go out in one ``os.write`` per line on an ``O_APPEND`` descriptor, then one
``fsync``; a torn last line (a kill during a write) is cut off when the log is opened again. Opening also drops the
lines of steps after the run's resume point, so ``--resume`` repeats no step here either (like ``metrics.jsonl``).
Size: ``per_step`` bounds the trajectories kept per step (the first ones of the batch, so whole groups come
first), ``max_mb`` the size of ``trajectories.jsonl`` (once reached, later steps write nothing, with one warning).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger("agentrl.controller.runlog")

TRAJECTORIES = "trajectories.jsonl"
TRAINER_LOGPROBS = "trainer_logprobs.jsonl"


@dataclass
class TrajectoryLogConfig:
    """``per_step``: trajectories written per step (``null``: all, ``0``: none); ``max_mb``: stop writing
    trajectories once ``trajectories.jsonl`` holds this many MiB (``null``: no bound)."""

    per_step: int | None = 64
    max_mb: float | None = 4096.0

    def validate(self) -> None:
        if self.per_step is not None and self.per_step < 0:
            raise ValueError(f"per_step must be >= 0 or null, got {self.per_step}")
        if self.max_mb is not None and not self.max_mb > 0:
            raise ValueError(f"max_mb must be > 0 or null, got {self.max_mb}")


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def summarize(traj: dict[str, Any], step: int | None = None) -> dict[str, Any]:
    """Returns the list-view summary of a trajectory dict (fields as in :class:`Trajectory`; wrong types in a
    hand-edited or damaged record give ``None`` values, never an exception): ids, env, reward, termination, token
    counts, turns, the oldest and newest policy version of its generated tokens, and ``staleness`` (the trainer's
    version at step ``step``, i.e. ``step - 1``, minus the oldest token version; ``None`` without a step)."""
    ids = traj.get("token_ids") if isinstance(traj.get("token_ids"), list) else []
    mask = traj.get("loss_mask") if isinstance(traj.get("loss_mask"), list) else []
    versions = traj.get("versions") if isinstance(traj.get("versions"), list) else []
    gen_versions = [v for v, m in zip(versions, mask) if m == 1 and isinstance(v, int) and not isinstance(v, bool)]
    vmin = min(gen_versions) if gen_versions else None
    vmax = max(gen_versions) if gen_versions else None
    turns = traj.get("num_turns")
    return {
        "id": str(traj.get("id", "")),
        "group_id": str(traj.get("group_id", "")),
        "env_id": str(traj.get("env_id", "")),
        "reward": _num(traj.get("reward")),
        "termination": str(traj.get("termination", "")),
        "error": traj.get("error") is not None,
        "tokens": len(ids),
        "generated": sum(1 for m in mask if m == 1),
        "turns": turns if isinstance(turns, int) and not isinstance(turns, bool) else None,
        "min_version": vmin,
        "max_version": vmax,
        "staleness": (step - 1 - vmin) if step is not None and vmin is not None else None,
    }


class AppendLog:
    """An append-only JSON-lines file whose lines are complete or absent (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None

    def open(self, keep_steps_upto: int | None = None) -> None:
        """Opens for appending after cutting a torn last line and, if ``keep_steps_upto`` is given, every line
        from the first one whose ``step`` is greater (lines are in step order). A line that does not parse is
        kept (it is reported by the viewer, not silently deleted), unless it is the torn last one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut = None
        if self.path.exists():
            pos = 0
            with open(self.path, "rb") as f:
                for line in f:
                    if not line.endswith(b"\n"):
                        cut = pos  # torn last line
                        break
                    if keep_steps_upto is not None:
                        step = _step_of(line)
                        if step is not None and step > keep_steps_upto:
                            cut = pos
                            break
                    pos += len(line)
        if cut is not None:
            with open(self.path, "r+b") as f:
                f.truncate(cut)
                f.flush()
                os.fsync(f.fileno())
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, lines: Sequence[bytes]) -> None:
        """Appends complete lines (each ending in ``\\n``) and fsyncs."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: write() before open()")
        for data in lines:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        os.fsync(self._fd)

    def size(self) -> int:
        return os.fstat(self._fd).st_size if self._fd is not None else 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _step_of(line: bytes) -> int | None:
    """The ``step`` of a line written here (``{"step": N, ...``), else of any JSON object line, else None."""
    if line.startswith(b'{"step": '):
        end = line.find(b",", 9)
        try:
            return int(line[9:end])
        except ValueError:
            pass
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    step = obj.get("step") if isinstance(obj, dict) else None
    return step if isinstance(step, int) else None


def _dumps(obj: Any) -> bytes:
    # allow_nan: a NaN log-prob must not lose the line; the viewer's parser reads NaN/Infinity.
    return (json.dumps(obj, ensure_ascii=False, default=str) + "\n").encode()


def trajectory_line(step: int, traj_dict: dict[str, Any]) -> bytes:
    """Returns the ``trajectories.jsonl`` line of a trajectory (as :meth:`Trajectory.to_dict`) trained at ``step``."""
    return _dumps({"step": step, "summary": summarize(traj_dict, step), "trajectory": traj_dict})


def logprob_line(step: int, record: dict[str, Any]) -> bytes:
    """Returns the ``trainer_logprobs.jsonl`` line of one ``Trainer.take_logprob_records()`` record."""
    return _dumps({"step": step, "trajectory_id": str(record["trajectory_id"]), "version": int(record["version"]),
                   "logprobs": [float(x) for x in record["logprobs"]]})


class TrajectoryLog:
    """The two files of the module docstring for one run directory. ``open(step0)`` before the first step
    (``step0``: the step training resumes after, 0 for a fresh run), ``write_step`` after each train step."""

    def __init__(self, run_dir: str | os.PathLike, cfg: TrajectoryLogConfig | None = None):
        self.cfg = cfg or TrajectoryLogConfig()
        self.trajectories = AppendLog(Path(run_dir) / TRAJECTORIES)
        self.logprobs = AppendLog(Path(run_dir) / TRAINER_LOGPROBS)
        self._full_warned = False

    def open(self, step0: int = 0) -> "TrajectoryLog":
        self.trajectories.open(keep_steps_upto=step0)
        self.logprobs.open(keep_steps_upto=step0)
        return self

    def write_trajectories(self, step: int, trajectories: Sequence[Any]) -> int:
        """Appends the step's trajectories (``Trajectory`` objects or dicts) within the size bounds; returns how
        many were written."""
        cfg = self.cfg
        todo = list(trajectories) if cfg.per_step is None else list(trajectories)[: cfg.per_step]
        if not todo:
            return 0
        if cfg.max_mb is not None and self.trajectories.size() >= cfg.max_mb * 2**20:
            if not self._full_warned:
                log.warning("%s reached trajectory_log.max_mb=%s: later steps' trajectories are not written",
                            self.trajectories.path, cfg.max_mb)
                self._full_warned = True
            return 0
        lines = [trajectory_line(step, t if isinstance(t, dict) else t.to_dict()) for t in todo]
        self.trajectories.write(lines)
        return len(lines)

    def write_logprobs(self, step: int, records: Sequence[dict[str, Any]]) -> int:
        if not records:
            return 0
        self.logprobs.write([logprob_line(step, r) for r in records])
        return len(records)

    async def write_step(self, step: int, trajectories: Sequence[Any], trainer: Any = None) -> None:
        """Writes the step's trajectories and, when ``trainer`` (a trainer actor handle) is given, the log-prob
        records it took during the step. File writes run in a thread (a large batch is tens of MB of JSON)."""
        import asyncio

        records = await trainer.take_logprob_records.remote() if trainer is not None else []
        await asyncio.to_thread(self.write_trajectories, step, trajectories)
        await asyncio.to_thread(self.write_logprobs, step, records)

    def close(self) -> None:
        self.trajectories.close()
        self.logprobs.close()
