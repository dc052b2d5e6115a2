"""The viewer's data layer: JSON-lines files indexed by byte offset, read a line at a time.

A trajectories file of 100k lines (gigabytes) is never loaded whole. :class:`TrajectoryIndex` scans it once,
keeping per line only its byte offset, its length and the few fields the list filters on (columns of plain
arrays); opening a trajectory seeks to its offset and parses that one line. A growing file (a run in progress) is
indexed incrementally: ``refresh()`` reads only what was appended since the last call; a file that shrank or was
replaced (a resumed run cut its tail) is indexed again from the start.

Line formats (one trajectory per line, recognised per line):

- ``agentrl train``'s ``trajectories.jsonl`` (:mod:`agentrl.controller.runlog`): ``{"step", "summary", "trajectory"}``. The
  summary is read from the line's head with ``raw_decode`` (the token arrays are not parsed) when the line starts
  exactly as the writer writes it; any other line is parsed whole.
- ``agentrl eval``'s ``trajectories.jsonl``: ``{"env", "instance_id", "success", ..., "trajectory"}``.
- ``agentrl rollout``'s output: a :class:`~agentrl.trajectory.Trajectory` dict per line.

Threads: ``refresh()`` runs in a worker thread; the server reads the index (``row``, ``query``, ``locate``) only
while no refresh runs (one asyncio lock), and reads lines (``read_record``) by location outside it.

Bad input is reported, never fatal: a line that is not JSON, not an object, or not a trajectory record is counted
with its 1-based line number and reason (``problems()``); a last line without its newline is *pending* (a writer
may be in the middle of it) and is reported as such; a field of the wrong type shows as missing.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from agentrl.controller.runlog import summarize
from agentrl.tools import JSON_ERRORS, json_error

TERMINATIONS = ("terminated", "truncated", "error", "cancelled")
_FAST_RE = re.compile(rb'^\{"step": (-?\d+), "summary": ')
_LP_FAST_RE = re.compile(rb'^\{"step": -?\d+, "trajectory_id": ("(?:[^"\\]|\\.)*")')
_DECODER = json.JSONDecoder()
MAX_BAD_LINES_LISTED = 200
_HEAD = 16384  # bytes of a line's head that hold its summary


class UnsafePath(ValueError):
    """A path that leaves the served directory (through ``..`` or a symbolic link) or is not a regular file."""


def safe_file(root: Path, name: str) -> Path | None:
    """Returns ``root/name`` resolved, if it is a regular file whose real path is inside ``root``'s real path;
    ``None`` if it does not exist. Raises :class:`UnsafePath` for a link or name that leads outside ``root``."""
    if "/" in name or "\\" in name or name in ("", ".", "..") or "\x00" in name:
        raise UnsafePath(f"{name!r}: not a plain file name")
    p = root / name
    if not os.path.lexists(p):
        return None
    real = Path(os.path.realpath(p))
    if not real.is_relative_to(Path(os.path.realpath(root))):
        raise UnsafePath(f"{name}: a link to {real}, outside the served directory {root}")
    if not real.is_file():
        raise UnsafePath(f"{name}: not a regular file")
    return real


def open_nofollow(path: Path):
    """Opens ``path`` (already resolved by :func:`safe_file`) for binary reading, refusing a link planted since."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    return os.fdopen(fd, "rb")


@dataclass
class Problems:
    """What was wrong with a file's lines: ``count`` bad lines, the first of them as ``(line, reason)``."""

    count: int = 0
    lines: list[tuple[int, str]] = field(default_factory=list)
    pending_tail: bool = False  # the last line has no newline yet
    error: str | None = None  # the file could not be read at all

    def add(self, line_no: int, reason: str) -> None:
        self.count += 1
        if len(self.lines) < MAX_BAD_LINES_LISTED:
            self.lines.append((line_no, reason))

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "lines": [{"line": n, "reason": r} for n, r in self.lines],
                "pending_tail": self.pending_tail, "error": self.error}


class LineFile:
    """Incremental line scanner over one file: subclasses handle each complete line (``_line``)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.pos = 0  # byte offset after the last complete line handled
        self.line_no = 0
        self.problems = Problems()
        self._ident: tuple[int, int] | None = None
        self._clear()

    def refresh(self) -> bool:
        """Handles the lines appended since the last call; returns True if anything changed."""
        with self.lock:
            try:
                st = os.stat(self.path)
            except OSError as e:
                self.problems.error = f"cannot read: {e.strerror}"
                return False
            ident = (st.st_dev, st.st_ino)
            if self._ident is not None and (ident != self._ident or st.st_size < self.pos):
                self._reset()  # replaced or cut (a resumed run): start over
            self._ident = ident
            if st.st_size == self.pos:
                return False
            changed = False
            try:
                with open_nofollow(self.path) as f:
                    f.seek(self.pos)
                    pending = False
                    for line in f:
                        if not line.endswith(b"\n"):
                            pending = True
                            break
                        self.line_no += 1
                        if line.strip():
                            self._line(line, self.pos, self.line_no)
                        self.pos += len(line)
                        changed = True
                    self.problems.pending_tail = pending
            except OSError as e:
                self.problems.error = f"cannot read: {e.strerror}"
            return changed

    def read_line(self, offset: int, length: int) -> bytes:
        with open_nofollow(self.path) as f:
            f.seek(offset)
            return f.read(length)

    def _clear(self) -> None:  # pragma: no cover - overridden
        pass

    def _line(self, line: bytes, offset: int, line_no: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def _parse(line: bytes) -> tuple[Any, str | None]:
    try:
        return json.loads(line), None
    except JSON_ERRORS as e:  # UnicodeDecodeError is a ValueError
        return None, f"not JSON ({json_error(e)})"


def split_record(obj: Any) -> tuple[dict[str, Any] | None, dict[str, Any], str | None]:
    """Returns ``(trajectory, meta, error)`` of a parsed line in any of the module's formats: the trajectory dict,
    the record's other fields (``step``, eval's ``env``/``instance_id``/``success``...), or an error saying why the
    line is no trajectory record."""
    if not isinstance(obj, dict):
        return None, {}, f"not a JSON object ({type(obj).__name__})"
    if "trajectory" in obj:
        traj = obj["trajectory"]
        if not isinstance(traj, dict):
            return None, {}, "'trajectory' is not an object"
        return traj, {k: v for k, v in obj.items() if k != "trajectory"}, None
    if any(k in obj for k in ("token_ids", "messages", "loss_mask")):
        return obj, {}, None
    return None, {}, "no trajectory in the record (expected 'trajectory', or a Trajectory's fields)"


INT64 = 1 << 63


def _int_or(x: Any, default: int) -> int:
    """``x`` if it is an int that fits the index's 64-bit columns, else ``default`` (missing)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and -INT64 <= x < INT64 else default


def finite_float(x: Any) -> float | None:
    """``x`` as a finite float, or None (not a number, NaN, infinite, or an int too large for a float)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _float_or_nan(x: Any) -> float:
    f = finite_float(x)
    return math.nan if f is None else f


class TrajectoryIndex(LineFile):
    """Columns of the list view, one entry per valid line (see the module docstring)."""

    def _clear(self) -> None:
        self.offsets = array("q")
        self.lengths = array("q")
        self.line_nos = array("q")
        self.steps = array("q")  # -1: none
        self.rewards = array("d")  # nan: none
        self.tokens = array("q")
        self.generated = array("q")
        self.turns = array("q")  # -1: unknown
        self.staleness = array("q")  # -1: unknown
        self.success = array("b")  # -1: unknown
        self.term_codes = bytearray()  # index into TERMINATIONS, 255: other
        self.errors = bytearray()  # 1 if the trajectory has an error message
        self.env_codes = array("l")
        self.envs: list[str] = []
        self._env_code: dict[str, int] = {}
        self.ids: list[str] = []
        self.groups: list[str] = []
        self.by_id: dict[str, int] = {}
        self.version = getattr(self, "version", 0) + 1  # bumped on every change: keys query caches

    def __len__(self) -> int:
        return len(self.offsets)

    def refresh(self) -> bool:
        changed = super().refresh()
        if changed:
            self.version += 1
        return changed

    def _summary(self, line: bytes) -> tuple[int | None, dict[str, Any] | None, str | None]:
        m = _FAST_RE.match(line)
        if m is not None and line.rstrip().endswith(b"}"):
            head = line[m.end(): m.end() + _HEAD].decode("utf-8", "replace")
            try:
                summary, _ = _DECODER.raw_decode(head)
                if isinstance(summary, dict):
                    return _int_or(int(m.group(1)), -1), summary, None
            except ValueError:
                pass  # an odd line: parse it whole below
        obj, err = _parse(line)
        if err:
            return None, None, err
        traj, meta, err = split_record(obj)
        if err:
            return None, None, err
        step = _int_or(meta.get("step"), -1)
        step = step if step >= 0 else None
        if isinstance(traj.get("reward"), int) and finite_float(traj["reward"]) is None:
            traj = {**traj, "reward": None}  # an int past float range: summarize's float() would raise
        summary = summarize(traj, step)
        if isinstance(meta.get("success"), bool):
            summary["success"] = meta["success"]
        if isinstance(meta.get("env"), str) and meta["env"]:
            summary["env_id"] = meta["env"]  # eval's label for the env entry
        return step, summary, None

    def _line(self, line: bytes, offset: int, line_no: int) -> None:
        step, s, err = self._summary(line)
        if err or s is None:
            self.problems.add(line_no, err or "no summary")
            return
        env = str(s.get("env_id") or "")
        code = self._env_code.get(env)
        if code is None:
            code = self._env_code[env] = len(self.envs)
            self.envs.append(env)
        term = s.get("termination")
        row = len(self.offsets)
        self.offsets.append(offset)
        self.lengths.append(len(line))
        self.line_nos.append(line_no)
        self.steps.append(step if step is not None and step >= 0 else -1)
        self.rewards.append(_float_or_nan(s.get("reward")))
        self.tokens.append(_int_or(s.get("tokens"), 0))
        self.generated.append(_int_or(s.get("generated"), 0))
        self.turns.append(_int_or(s.get("turns"), -1))
        self.staleness.append(_int_or(s.get("staleness"), -1))
        succ = s.get("success")
        self.success.append(-1 if not isinstance(succ, bool) else int(succ))
        self.term_codes.append(TERMINATIONS.index(term) if term in TERMINATIONS else 255)
        self.errors.append(1 if s.get("error") else 0)
        self.env_codes.append(code)
        tid = str(s.get("id") or "")
        self.ids.append(tid)
        self.groups.append(str(s.get("group_id") or ""))
        if tid:
            self.by_id[tid] = row

    def row(self, i: int) -> dict[str, Any]:
        """The list-view fields of row ``i`` (JSON-ready)."""
        r = self.rewards[i]
        t = self.term_codes[i]
        return {
            "row": i, "line": self.line_nos[i], "id": self.ids[i], "group_id": self.groups[i],
            "env": self.envs[self.env_codes[i]], "step": self.steps[i] if self.steps[i] >= 0 else None,
            "reward": None if math.isnan(r) else r, "termination": TERMINATIONS[t] if t < len(TERMINATIONS) else "?",
            "error": bool(self.errors[i]), "tokens": self.tokens[i], "generated": self.generated[i],
            "turns": self.turns[i] if self.turns[i] >= 0 else None,
            "staleness": self.staleness[i] if self.staleness[i] >= 0 else None,
            "success": None if self.success[i] < 0 else bool(self.success[i]),
        }

    def locate(self, i: int) -> tuple[int, int, int]:
        """``(offset, length, line number)`` of row ``i``: read with :meth:`read_record` without the index."""
        return self.offsets[i], self.lengths[i], self.line_nos[i]

    def read_record(self, loc: tuple[int, int, int]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reads and parses a located line: ``(trajectory, meta)``. Raises ``ValueError`` if the line changed into
        something unreadable since it was indexed (a resumed run cut the file)."""
        offset, length, line_no = loc
        obj, err = _parse(self.read_line(offset, length))
        if err:
            raise ValueError(f"line {line_no}: {err}")
        traj, meta, err = split_record(obj)
        if err or traj is None:
            raise ValueError(f"line {line_no}: {err}")
        return traj, meta

    def record(self, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Row ``i``'s ``(trajectory, meta)`` (see :meth:`read_record`)."""
        return self.read_record(self.locate(i))

    def group_rows(self, i: int) -> list[int]:
        """Rows of the same group and step as row ``i`` (a group's members are trained at the same step)."""
        g, step = self.groups[i], self.steps[i]
        if not g:
            return [i]
        return [j for j in range(len(self.groups)) if self.groups[j] == g and self.steps[j] == step]

    def query(self, f: "Filter") -> list[int]:
        """Rows matching ``f``, in ``f.sort`` order (file order by default)."""
        rows: Iterable[int] = range(len(self.offsets))
        if f.step_min is not None:
            rows = [i for i in rows if self.steps[i] >= f.step_min]
        if f.step_max is not None:
            rows = [i for i in rows if 0 <= self.steps[i] <= f.step_max]
        if f.env is not None:
            code = self._env_code.get(f.env, -1)
            rows = [i for i in rows if self.env_codes[i] == code]
        if f.reward_min is not None:
            rows = [i for i in rows if self.rewards[i] >= f.reward_min]
        if f.reward_max is not None:
            rows = [i for i in rows if self.rewards[i] <= f.reward_max]
        if f.termination is not None:
            code = TERMINATIONS.index(f.termination) if f.termination in TERMINATIONS else 254
            rows = [i for i in rows if self.term_codes[i] == code]
        if f.errors_only:
            rows = [i for i in rows if self.errors[i] or self.term_codes[i] == 2]
        if f.length_min is not None:
            rows = [i for i in rows if self.tokens[i] >= f.length_min]
        if f.length_max is not None:
            rows = [i for i in rows if self.tokens[i] <= f.length_max]
        if f.staleness_min is not None:
            rows = [i for i in rows if self.staleness[i] >= f.staleness_min]
        if f.staleness_max is not None:
            rows = [i for i in rows if 0 <= self.staleness[i] <= f.staleness_max]
        if f.group is not None:
            rows = [i for i in rows if self.groups[i] == f.group]
        if f.text:
            needle = f.text.lower()
            rows = [i for i in rows if needle in self.ids[i].lower() or needle in self.groups[i].lower()]
        rows = list(rows)
        if f.sort:
            col = {"reward": self.rewards, "tokens": self.tokens, "staleness": self.staleness, "step": self.steps,
                   "turns": self.turns}[f.sort]
            nan_last = math.inf if not f.desc else -math.inf
            rows.sort(key=lambda i: nan_last if col[i] != col[i] else col[i], reverse=f.desc)
        return rows


@dataclass(frozen=True)
class Filter:
    """The list view's filters (``None``: no bound). ``sort`` is a column name or ``None`` for file order."""

    step_min: int | None = None
    step_max: int | None = None
    env: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    termination: str | None = None
    errors_only: bool = False
    length_min: int | None = None
    length_max: int | None = None
    staleness_min: int | None = None
    staleness_max: int | None = None
    group: str | None = None
    text: str | None = None
    sort: str | None = None
    desc: bool = False

    SORTS = ("reward", "tokens", "staleness", "step", "turns")

    @classmethod
    def from_query(cls, q: dict[str, str]) -> "Filter":
        """Builds a filter from URL query parameters. Raises ``ValueError`` naming a bad parameter."""
        kw: dict[str, Any] = {}

        def num(name: str, kind: type) -> None:
            v = q.get(name, "").strip()
            if v:
                try:
                    kw[name] = kind(v)
                except ValueError:
                    raise ValueError(f"{name}: expected a number, got {v[:40]!r}") from None
                if kind is float and not math.isfinite(kw[name]):
                    raise ValueError(f"{name}: expected a finite number")

        for name in ("step_min", "step_max", "length_min", "length_max", "staleness_min", "staleness_max"):
            num(name, int)
        for name in ("reward_min", "reward_max"):
            num(name, float)
        for name in ("env", "termination", "group", "text"):
            if q.get(name):
                kw[name] = q[name][:500]
        kw["errors_only"] = q.get("errors_only") in ("1", "true", "on")
        sort = q.get("sort") or None
        if sort is not None and sort not in cls.SORTS:
            raise ValueError(f"sort: one of {', '.join(cls.SORTS)}, got {sort[:40]!r}")
        kw["sort"] = sort
        kw["desc"] = q.get("desc") in ("1", "true", "on")
        return cls(**kw)


class LogprobIndex(LineFile):
    """``trainer_logprobs.jsonl``: trajectory id -> (offset, length) of its newest record."""

    def _clear(self) -> None:
        self.where: dict[str, tuple[int, int]] = {}

    def _line(self, line: bytes, offset: int, line_no: int) -> None:
        m = _LP_FAST_RE.match(line)
        tid = None
        if m is not None and line.rstrip().endswith(b"}"):
            try:
                tid = json.loads(m.group(1))
            except JSON_ERRORS:
                tid = None
        if tid is None:
            obj, err = _parse(line)
            if err:
                self.problems.add(line_no, err)
                return
            if not isinstance(obj, dict) or not isinstance(obj.get("trajectory_id"), str):
                self.problems.add(line_no, "no 'trajectory_id' string")
                return
            tid = obj["trajectory_id"]
        self.where[tid] = (offset, len(line))

    def get(self, tid: str) -> dict[str, Any] | None:
        """The newest record of ``tid`` (``logprobs`` as a list of numbers, ``None`` where not finite), or None."""
        return self.read(self.where.get(tid))

    def read(self, loc: tuple[int, int] | None) -> dict[str, Any] | None:
        """The record at ``loc`` (a value of ``where``), as :meth:`get` returns it."""
        if loc is None:
            return None
        obj, err = _parse(self.read_line(*loc))
        if err or not isinstance(obj, dict) or not isinstance(obj.get("logprobs"), list):
            return None
        lps = [x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None
               for x in obj["logprobs"]]
        version = obj.get("version")
        return {"version": version if isinstance(version, int) and not isinstance(version, bool) else None,
                "step": obj.get("step") if isinstance(obj.get("step"), int) else None, "logprobs": lps}


class MetricsFile(LineFile):
    """``metrics.jsonl``: one row per step, only the finite numbers of each row kept."""

    def _clear(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.keys: dict[str, None] = {}  # insertion-ordered set

    def _line(self, line: bytes, offset: int, line_no: int) -> None:
        obj, err = _parse(line)
        if err:
            self.problems.add(line_no, err)
            return
        if not isinstance(obj, dict):
            self.problems.add(line_no, f"not a JSON object ({type(obj).__name__})")
            return
        row = {str(k): f for k, f in ((k, finite_float(v)) for k, v in obj.items()) if f is not None}
        if "step" not in row:
            self.problems.add(line_no, "no numeric 'step'")
            return
        for k in row:
            self.keys.setdefault(k, None)
        self.rows.append(row)

    def columns(self, keys: list[str]) -> dict[str, list[float | None]]:
        """``{"step": [...], key: [...]}`` aligned by row, ``None`` where a row lacks the key."""
        out: dict[str, list[float | None]] = {"step": [r["step"] for r in self.rows]}
        for k in keys:
            if k in self.keys:
                out[k] = [r.get(k) for r in self.rows]
        return out
