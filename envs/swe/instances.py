"""SWE-bench-format task instances: loading and validation.

One JSON object a line with (at least) the fields of :data:`REQUIRED_FIELDS`. ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` are lists of test ids, or a JSON string of such a list (as the SWE-bench datasets store them).
Other fields (``version``, ``hints_text``, ...) are kept in :attr:`SWEInstance.extra`. Every problem is reported as
:class:`InstanceError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from agentrl.tools import JSON_ERRORS, json_error

REQUIRED_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)

_TEXT_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")


class InstanceError(ValueError):
    """A malformed instance; the message starts with ``file:line:`` and names the field."""


@dataclass(frozen=True)
class SWEInstance:
    """One task: a repository at ``base_commit``, an issue, the gold ``patch``, the ``test_patch`` and the tests.

    Invariants: every text field is a string, ``instance_id``/``repo``/``base_commit`` are non-empty,
    ``FAIL_TO_PASS`` holds at least one test id, test ids are non-empty strings.
    """

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Returns the SWE-bench JSON object (test lists as lists, extra fields merged in)."""
        out: dict[str, Any] = dict(self.extra)
        for name in _TEXT_FIELDS:
            out[name] = getattr(self, name)
        out["FAIL_TO_PASS"] = list(self.FAIL_TO_PASS)
        out["PASS_TO_PASS"] = list(self.PASS_TO_PASS)
        return out


def _test_list(value: Any, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except JSON_ERRORS as e:
            raise InstanceError(f"{where}: field {name!r}: a string that is not a JSON list of test ids "
                                f"({json_error(e)})") from None
    if not isinstance(value, list):
        raise InstanceError(f"{where}: field {name!r}: expected a list of test ids, got {type(value).__name__}")
    for i, t in enumerate(value):
        if not isinstance(t, str) or not t.strip():
            raise InstanceError(f"{where}: field {name!r}[{i}]: expected a non-empty test id string, got {t!r}")
    return tuple(value)


def parse_instance(obj: Any, where: str = "<instance>") -> SWEInstance:
    """Builds an :class:`SWEInstance` from a decoded JSON object; ``where`` prefixes error messages."""
    if not isinstance(obj, dict):
        raise InstanceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in obj]
    if missing:
        raise InstanceError(f"{where}: missing field(s) {', '.join(repr(m) for m in missing)}")
    for name in _TEXT_FIELDS:
        if not isinstance(obj[name], str):
            raise InstanceError(f"{where}: field {name!r}: expected a string, got {type(obj[name]).__name__}")
    for name in ("instance_id", "repo", "base_commit"):
        if not obj[name].strip():
            raise InstanceError(f"{where}: field {name!r}: must not be empty")
    f2p = _test_list(obj["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    p2p = _test_list(obj["PASS_TO_PASS"], "PASS_TO_PASS", where)
    if not f2p:
        raise InstanceError(f"{where}: field 'FAIL_TO_PASS': must list at least one test (else nothing is graded)")
    return SWEInstance(
        instance_id=obj["instance_id"],
        repo=obj["repo"],
        base_commit=obj["base_commit"],
        patch=obj["patch"],
        test_patch=obj["test_patch"],
        problem_statement=obj["problem_statement"],
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        extra={k: v for k, v in obj.items() if k not in REQUIRED_FIELDS},
    )


def parse_lines(lines: Iterable[str], source: str = "<string>") -> list[SWEInstance]:
    """Parses JSONL text lines (blank lines skipped). Raises :class:`InstanceError` on the first bad line or on a
    duplicate ``instance_id`` (naming both lines)."""
    out: list[SWEInstance] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except JSON_ERRORS as e:
            raise InstanceError(f"{where}: invalid JSON ({json_error(e)})") from None
        inst = parse_instance(obj, where)
        if inst.instance_id in seen:
            raise InstanceError(f"{where}: field 'instance_id': duplicate {inst.instance_id!r} (first on line {seen[inst.instance_id]})")
        seen[inst.instance_id] = lineno
        out.append(inst)
    return out


def load_instances(path: str | Path, instance_ids: Iterable[str] | None = None) -> list[SWEInstance]:
    """Loads a JSONL file of instances, in file order.

    ``instance_ids``, when given, selects those instances (in file order); an id not in the file raises
    :class:`InstanceError`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InstanceError(f"{path}: cannot read instances file: {e}") from None
    instances = parse_lines(text.splitlines(), str(path))
    if instance_ids is not None:
        wanted = list(instance_ids)
        known = {i.instance_id for i in instances}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise InstanceError(f"{path}: unknown instance id(s): {', '.join(unknown)}")
        keep = set(wanted)
        instances = [i for i in instances if i.instance_id in keep]
    return instances
