"""Per-instance test environments: what an instance's image holds and how its tests run.

An :class:`EnvSpec` says which Python runs the repository, which pip requirements are installed (wheels fetched on
the host, installed offline while the image is built), which command installs the repository itself, which
directories go on ``sys.path`` (src-layout without an install) and which runner grades the tests.

Where an instance's spec comes from, first match wins:

1. the instance's own ``env_spec`` field (an agentrl extension of the SWE-bench format: a mapping of EnvSpec fields);
2. an env-specs file (``--env-specs``, YAML or JSON) keyed by repository, then by the instance's ``version``
   (``"*"`` matches any version), as SWE-bench keys its own specs::

       pallets/jinja:
         "3.1":
           python: "3.11"
           pip: [pytest==8.3.3, MarkupSafe==2.1.5, setuptools==69.5.1, wheel==0.43.0]
           install: pip install --no-build-isolation --no-deps -e .
           runner: pytest

3. the default: the base image's Python 3.11, nothing installed, the runner inferred from the test ids.

``runner: auto`` picks ``pytest`` for pytest-style ids (``path.py::name``, parametrised ``name[a-b]``) and ``unittest``
for dotted ids (``tests.test_x.TestY.test_z``); a mix is an error. ``runner: command`` runs ``test_cmd`` with the ids
as arguments and parses its output with one of the official ``swebench`` log parsers (``log_parser``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from agentrl.config import ConfigError, from_dict

#: Python versions an image can be built for, and the Debian suite that ships each as its ``python3``.
PYTHON_SUITES: dict[str, str] = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
#: The version of the base image (``agentrl-base:latest``, Debian bookworm).
DEFAULT_PYTHON = "3.11"


class EnvSpecError(ValueError):
    """An env spec that cannot be used; the message names the source, the field and what would work."""


@dataclass(frozen=True)
class EnvSpec:
    """One repository/version's test environment (see the module doc).

    python: ``"3.9"``, ``"3.11"`` (the base image) or ``"3.13"``.
    pip: requirement strings (``name==version`` pins keep images reproducible), installed into ``/agentrl/venv``.
    install: a shell command run in the repository (``/workspace``) when the image is built, with the venv on
        ``PATH`` and pip offline (``PIP_NO_INDEX=1``, ``PIP_FIND_LINKS`` = the downloaded wheels), e.g.
        ``pip install --no-build-isolation --no-deps -e .`` (list the build backend, e.g. setuptools, in ``pip``).
        It must not modify tracked files.
    pythonpath: repository-relative directories put first on ``sys.path`` for the tests (``["src"]`` for a
        src-layout package that is not installed).
    runner: ``auto``, ``pytest``, ``unittest`` or ``command``.
    pytest_args: extra pytest arguments (e.g. ``["-p", "no:randomly"]``).
    test_cmd / log_parser: for ``runner: command``: the command (test ids are appended) and the name of a parser
        in ``swebench``'s ``PARSER_REGISTRY`` (e.g. ``parse_log_pytest``, ``parse_log_django``).
    env: extra environment variables for the agent's commands and the tests.
    """

    python: str = DEFAULT_PYTHON
    pip: list[str] = field(default_factory=list)
    install: str = ""
    pythonpath: list[str] = field(default_factory=list)
    runner: Literal["auto", "pytest", "unittest", "command"] = "auto"
    pytest_args: list[str] = field(default_factory=list)
    test_cmd: str = ""
    log_parser: str = "parse_log_pytest"
    env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.python not in PYTHON_SUITES:
            known = ", ".join(f"{v} (Debian {s})" for v, s in PYTHON_SUITES.items())
            raise ValueError(f"python {self.python!r} cannot be built: the versions available are {known}")
        from packaging.requirements import InvalidRequirement, Requirement

        for i, req in enumerate(self.pip):
            try:
                Requirement(req)
            except (InvalidRequirement, TypeError) as e:
                raise ValueError(f"pip[{i}]: {req!r} is not a requirement like 'name==1.2.3' ({e})") from None
        for i, p in enumerate(self.pythonpath):
            if p.startswith("/") or ".." in Path(p).parts:
                raise ValueError(f"pythonpath[{i}]: {p!r} must be a path inside the repository")
        if self.runner == "command" and not self.test_cmd.strip():
            raise ValueError("runner 'command' needs test_cmd")
        if self.runner == "pytest" and not self.has_pytest:
            raise ValueError("runner 'pytest' needs pytest in pip (e.g. 'pytest==8.3.3'); the base image has none")
        for k in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"env: {k!r} is not a variable name")

    @property
    def has_pytest(self) -> bool:
        return any(re.match(r"^pytest\b(?![-_.])", r.strip(), re.IGNORECASE) for r in self.pip)

    @property
    def has_venv(self) -> bool:
        """Whether the image has ``/agentrl/venv`` (it does when anything is pip-installed)."""
        return bool(self.pip)

    def env_key(self, arch: str) -> str:
        """Identifies the built environment layer (Python and wheels; the repository is not part of it)."""
        blob = json.dumps({"python": self.python, "pip": sorted(self.pip), "arch": arch}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def runner_for(spec: EnvSpec, test_ids: Iterable[str], where: str = "instance") -> str:
    """Returns the runner that grades ``test_ids`` under ``spec``: ``spec.runner`` unless ``auto``, else inferred
    from the ids. Raises :class:`EnvSpecError` for a mix of styles or a pytest id without pytest installed."""
    if spec.runner != "auto":
        return spec.runner
    styles = {("pytest" if is_pytest_id(t) else "unittest") for t in test_ids}
    if len(styles) > 1:
        raise EnvSpecError(f"{where}: the test ids mix pytest ids (path.py::name) and unittest ids (module.Class.test); "
                           "set runner in the env spec")
    style = styles.pop() if styles else "unittest"
    if style == "pytest" and not spec.has_pytest:
        raise EnvSpecError(f"{where}: pytest-style test ids need pytest in the env spec's pip list "
                           "(e.g. pip: ['pytest==8.3.3']), or runner: command")
    return style


def is_pytest_id(test_id: str) -> bool:
    """True for pytest node ids (``tests/x.py::T::test[a-b]``, ``tests/x.py``), False for dotted unittest ids."""
    head = test_id.split("[", 1)[0]
    return "::" in head or "/" in head or head.endswith(".py")


def parse_spec(data: Any, where: str) -> EnvSpec:
    """Builds an EnvSpec from a mapping; raises :class:`EnvSpecError` naming ``where`` and the field."""
    if isinstance(data, EnvSpec):
        return data
    if not isinstance(data, Mapping):
        raise EnvSpecError(f"{where}: expected a mapping of env spec fields, got {type(data).__name__}")
    try:
        return from_dict(EnvSpec, dict(data), where)
    except ConfigError as e:
        raise EnvSpecError(str(e)) from None


class EnvSpecs:
    """The env specs of a run: ``{repo: {version or "*": EnvSpec}}`` (see the module doc)."""

    def __init__(self, specs: Mapping[str, Mapping[str, Any]] | None = None, source: str = "<env specs>"):
        self.source = source
        self.by_repo: dict[str, dict[str, EnvSpec]] = {}
        if specs is None:
            return
        if not isinstance(specs, Mapping):
            raise EnvSpecError(f"{source}: expected a mapping repo -> version -> spec, got {type(specs).__name__}")
        for repo, versions in specs.items():
            if not isinstance(versions, Mapping):
                raise EnvSpecError(f"{source}: {repo}: expected a mapping version -> spec, got {type(versions).__name__}")
            self.by_repo[str(repo)] = {str(v): parse_spec(s, f"{source}: {repo}.{v}") for v, s in versions.items()}

    @classmethod
    def load(cls, path: str | Path | None) -> "EnvSpecs":
        """Reads a YAML or JSON env-specs file (None: no specs)."""
        if path is None:
            return cls()
        import yaml

        from agentrl.config import load_yaml

        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise EnvSpecError(f"{path}: cannot read env specs: {e.strerror}") from None
        try:
            data = load_yaml(text) or {}
        except yaml.YAMLError as e:
            raise EnvSpecError(f"{path}: invalid YAML/JSON: {e}") from None
        return cls(data, str(path))

    def for_instance(self, instance: Any) -> EnvSpec:
        """Returns the EnvSpec of an :class:`~agentrl.envs.swe.instances.SWEInstance` (see the module doc)."""
        own = instance.extra.get("env_spec")
        if own is not None:
            return parse_spec(own, f"instance {instance.instance_id}: env_spec")
        versions = self.by_repo.get(instance.repo, {})
        version = str(instance.extra.get("version", ""))
        if version in versions:
            return versions[version]
        if "*" in versions:
            return versions["*"]
        return EnvSpec()
