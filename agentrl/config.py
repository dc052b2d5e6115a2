"""Typed configs: YAML files loaded into dataclasses, with validation that names the file and the key path.

Every config is a (nested) dataclass. ``load(cls, path, overrides)`` reads YAML, applies command-line overrides
(``key.sub=value``, the value parsed as YAML), and builds ``cls``. Unknown keys, wrong types, missing required
fields and values outside ``Literal`` choices raise :class:`ConfigError` with ``file: key.path: message``.
A dataclass may define ``validate(self)`` for cross-field checks; it raises ``ValueError``, which is reported
with the path of that dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A config that does not fit its schema. The message starts with ``source: key.path:``."""


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    if origin in (list, tuple):
        return f"a list of {_describe(get_args(tp)[0]) if get_args(tp) else 'values'}"
    if origin is dict:
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str, src: str) -> Any:
    def fail(msg: str | None = None) -> ConfigError:
        return ConfigError(f"{src}: {path or '<root>'}: {msg or f'expected {_describe(tp)}, got {type(value).__name__} {value!r}'}")

    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise fail()
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise fail()
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, path, src)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:  # an optional section (X | None): its own error names the bad key
            raise errors[0]
        raise fail()
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise fail()
        return _build(tp, value, path, src)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise fail()
        (item,) = get_args(tp)[:1] or (Any,)
        out = [_convert(v, item, f"{path}[{i}]", src) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise fail()
        kt, vt = get_args(tp) or (Any, Any)
        return {_convert(k, kt, path, src): _convert(v, vt, f"{path}.{k}", src) for k, v in value.items()}
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail()
        if value != value:  # NaN passes every "x < bound" check (all comparisons are False), then poisons the run
            raise fail("NaN is not a value a config can hold; give a number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail()
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise fail()
        return value
    if tp is str:
        if not isinstance(value, str):
            raise fail()
        return value
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise fail()
        return value
    return value


def _build(cls: type[T], data: dict[str, Any], path: str, src: str) -> T:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            # A dataclass may name keys that live elsewhere: ``CONFIG_HINTS = {"key": "where it is set"}``.
            moved = getattr(cls, "CONFIG_HINTS", {}).get(key)
            hint = f" ({moved})" if moved else f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{src}: {sub}: unknown key{hint}; {cls.__name__} has {', '.join(fields)}")
        kwargs[key] = _convert(value, hints[key], sub, src)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            sub = f"{path}.{name}" if path else name
            raise ConfigError(f"{src}: {sub}: required field is missing (expected {_describe(hints[name])})")
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if callable(check):
        try:
            check()
        except ValueError as e:
            raise ConfigError(f"{src}: {path or '<root>'}: {e}") from e
    return obj


def from_dict(cls: type[T], data: dict[str, Any] | None, source: str = "<dict>") -> T:
    """Builds ``cls`` from a plain mapping; raises :class:`ConfigError` on any mismatch."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: <root>: expected a mapping, got {type(data).__name__}")
    return _build(cls, data, "", source)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: PyYAML keeps the last silently, so a
    config with ``steps: 1`` and later ``steps: 2`` trained for 2 steps without a word. A key from a merge
    (``<<: *base``) may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class names it
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} twice (first on line {first + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (:class:`yaml.YAMLError` naming the key and both lines)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "<command line>") -> dict[str, Any]:
    """Returns ``data`` with each ``a.b.c=value`` applied (value parsed as YAML: ``3`` is an int, ``null`` is None)."""
    data = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: override {item!r} must look like key.sub=value")
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"{source}: override {item!r} has an empty key")
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"{source}: override {item!r}: value is not valid YAML: {e}") from e
        node = data
        for p in parts[:-1]:
            child = node.get(p)
            child = dict(child) if isinstance(child, dict) else {}
            node[p] = child
            node = child
        node[parts[-1]] = value
    return data


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in the YAML file at ``path`` (empty file: ``{}``); :class:`ConfigError` naming the file when it
    cannot be read, is not UTF-8 text, is not YAML or holds something other than a mapping."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}): a config is a YAML file") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: <root>: expected a mapping, got {type(data).__name__}")
    return data


def load(cls: type[T], path: str | os.PathLike, overrides: list[str] | None = None) -> T:
    """Reads the YAML file at ``path``, applies ``overrides``, and returns a validated ``cls``."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return from_dict(cls, data, str(Path(path)))


def to_dict(obj: Any) -> dict[str, Any]:
    """Returns a dataclass config as plain data (for saving next to checkpoints)."""
    return dataclasses.asdict(obj)
