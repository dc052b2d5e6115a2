"""Registering and making environments, on top of gymnasium's registry.

``agentrl.register`` adds to ``gymnasium.registry`` (so ``gymnasium.make(id)`` works too) but refuses duplicate
ids; ``agentrl.make`` instantiates without gymnasium's passive checker and returns an env whose async methods work
through the (async-aware) :class:`agentrl.core.OrderEnforcing` and :class:`agentrl.core.TimeLimit`.

Third-party packages make their envs available by declaring an entry point in the group ``agentrl.envs``::

    [project.entry-points."agentrl.envs"]
    mypkg = "mypkg.envs:register_envs"     # a callable, called with no arguments, or a module to import

Every such entry point is loaded once, when agentrl is imported.

A *family* names many envs without registering each one up front: ``register_family("reasoning_gym", ...)`` makes
every id ``reasoning_gym/<name>`` resolvable, registered on first use (``spec``/``make``) with the kwarg
``{name_kwarg: "<name>"}``. Its list of valid names comes from a ``"module:function"`` imported only then, so a
family whose library is an optional extra costs nothing at import and fails with a clear error naming the extra
when the library is missing.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec, load_env_creator, parse_env_id

from agentrl.core import OrderEnforcing, TimeLimit

ENTRY_POINT_GROUP = "agentrl.envs"


class RegistrationError(ValueError):
    """Raised for a duplicate or unknown env id, or a bad entry point."""


def register(
    id: str,
    entry_point: str | Any,
    *,
    kwargs: dict[str, Any] | None = None,
    max_episode_steps: int | None = None,
    description: str | None = None,
) -> EnvSpec:
    """Registers an env id and returns its gymnasium ``EnvSpec``.

    ``entry_point`` is ``"package.module:Class"`` (imported lazily) or a callable. Raises
    :class:`RegistrationError` if ``id`` is already registered.
    """
    if id in gymnasium.registry:
        raise RegistrationError(f"env id {id!r} is already registered (entry point {gymnasium.registry[id].entry_point!r})")
    if isinstance(entry_point, str) and ":" not in entry_point:
        raise RegistrationError(f"entry_point for {id!r} must look like 'package.module:Class', got {entry_point!r}")
    gymnasium.register(
        id=id,
        entry_point=entry_point,
        kwargs=dict(kwargs or {}),
        max_episode_steps=max_episode_steps,
        disable_env_checker=True,
        order_enforce=False,
        additional_wrappers=(),
    )
    _agentrl_ids.add(id)
    if description is not None:
        _descriptions[id] = description
    return gymnasium.registry[id]


_descriptions: dict[str, str] = {}
_agentrl_ids: set[str] = set()


@dataclass(frozen=True)
class Family:
    """Ids ``<namespace>/<name>`` made by one entry point, ``name`` passed as the kwarg ``name_kwarg``."""

    namespace: str
    entry_point: str
    name_kwarg: str
    names: str
    """``"module:function"`` returning the valid names (imported lazily: the library may be an optional extra)."""
    extra: str | None = None
    """The pip extra that brings the library, named in the error when it is missing."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None
    description: str = ""


_families: dict[str, Family] = {}
_family_lock = threading.Lock()


def register_family(namespace: str, entry_point: str, *, name_kwarg: str, names: str, extra: str | None = None,
                    kwargs: dict[str, Any] | None = None, max_episode_steps: int | None = None,
                    description: str = "") -> Family:
    """Makes every id ``<namespace>/<name>`` (``name`` one of those ``names`` returns) resolvable by
    :func:`spec` and :func:`make`, registered on first use. Raises :class:`RegistrationError` if the namespace
    already has a family, or if ``entry_point``/``names`` are not ``"module:attr"`` strings."""
    if namespace in _families:
        raise RegistrationError(f"env family {namespace!r} is already registered ({_families[namespace].entry_point!r})")
    for what, value in (("entry_point", entry_point), ("names", names)):
        if not isinstance(value, str) or ":" not in value:
            raise RegistrationError(f"{what} of family {namespace!r} must look like 'package.module:attr', got {value!r}")
    fam = Family(namespace, entry_point, name_kwarg, names, extra, dict(kwargs or {}), max_episode_steps, description)
    _families[namespace] = fam
    return fam


def families() -> list[Family]:
    """The registered families, sorted by namespace."""
    return [_families[n] for n in sorted(_families)]


def family_names(namespace: str) -> list[str]:
    """Returns the names the family ``namespace`` accepts (imports its library): those of its library's names that
    make an id gymnasium parses (TextArena has a ``Taboo-v0-city/country``; a second '/' is not one). Raises
    :class:`RegistrationError` naming the pip extra when the library is missing."""
    fam = _families.get(namespace)
    if fam is None:
        raise RegistrationError(f"no env family {namespace!r}; families: {sorted(_families)}")
    module, _, attr = fam.names.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
        return sorted(n for n in fn() if _is_id(f"{namespace}/{n}"))
    except ImportError as e:
        hint = f" (pip install 'agentrl[{fam.extra}]')" if fam.extra else ""
        raise RegistrationError(f"env family {namespace!r} needs a library that is not installed{hint}: {e}") from e


def _is_id(id: str) -> bool:
    try:
        parse_env_id(id)
    except gymnasium.error.Error:
        return False
    return True


def _resolve_family(id: str) -> bool:
    """Registers ``id`` if it names a member of a family; returns whether it did. Raises
    :class:`RegistrationError` for an unknown member, naming the closest names."""
    namespace, sep, name = id.partition("/")
    fam = _families.get(namespace) if sep else None
    if fam is None:
        return False
    valid = family_names(namespace)
    with _family_lock:  # env workers may resolve the same id on several threads at once
        if id in gymnasium.registry:
            return True
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(f'{namespace}/{c}') for c in close)}?" if close else ""
            raise RegistrationError(f"unknown env id {id!r}: {name!r} is not one of the {len(valid)} names of family "
                                    f"{namespace!r}{hint}")
        register(id, fam.entry_point, kwargs={**fam.kwargs, fam.name_kwarg: name},
                 max_episode_steps=fam.max_episode_steps,
                 description=f"{fam.description} ({name})" if fam.description else None)
        return True


def spec(id: str) -> EnvSpec:
    """Returns the ``EnvSpec`` of ``id`` (registering a family member on first use); raises
    :class:`RegistrationError` naming the closest ids if unknown."""
    if id not in gymnasium.registry and not _resolve_family(id):
        close = difflib.get_close_matches(id, list(gymnasium.registry), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        fams = f"; families: {', '.join(f'{n}/<name>' for n in sorted(_families))}" if _families else ""
        raise RegistrationError(f"unknown env id {id!r}{hint} (see `agentrl envs list`{fams})")
    return gymnasium.registry[id]


def load_entry_point(entry_point: Any) -> Any:
    """The callable an entry point names: a ``"package.module:attr"`` string is imported with gymnasium's own
    ``load_env_creator``; anything else is returned as it is. Raises ImportError, AttributeError or ValueError."""
    if isinstance(entry_point, str):
        if entry_point.count(":") != 1:
            raise ValueError(f"entry point {entry_point!r} must be 'package.module:attr'")
        return load_env_creator(entry_point)
    return entry_point


def make(id: str, **kwargs: Any) -> gymnasium.Env:
    """Instantiates the env registered as ``id`` with the registered kwargs updated by ``kwargs``.

    The env is wrapped in :class:`agentrl.core.TimeLimit` given ``max_episode_steps`` (a kwarg, or the registered
    value), else in :class:`agentrl.core.OrderEnforcing`; either refuses a step before the first reset
    (``gymnasium.error.ResetNeeded``, as gymnasium's ``make`` does). ``env.unwrapped`` is the env itself; its
    ``areset``/``astep``/``aclose`` work through the wrapper.
    """
    s = spec(id)
    max_steps = kwargs.pop("max_episode_steps", s.max_episode_steps)
    try:
        ep = load_entry_point(s.entry_point)
    except (ImportError, AttributeError, ValueError) as e:
        raise RegistrationError(f"cannot load entry point {s.entry_point!r} of {id!r}: {e}") from e
    env = ep(**{**s.kwargs, **kwargs})
    if getattr(env, "spec", None) is None:
        try:
            # The spec records the kwargs this env was made with (as gymnasium.make's does), so that
            # ``env.spec.make()`` (gymnasium's check_env uses it) rebuilds this env, not the registered default.
            env.spec = dataclasses.replace(s, kwargs={**s.kwargs, **kwargs}) if kwargs else s
        except AttributeError:
            pass
    return TimeLimit(env, max_steps) if max_steps else OrderEnforcing(env)


def check_make(id: str, kwargs: dict[str, Any] | None = None) -> None:
    """Makes one env of ``id`` with ``kwargs`` and closes it, so that a config's env fails when it is loaded, not in
    every episode after minutes of engine start-up. Raises ``ValueError`` ("cannot make ID with kwargs {...}: TypeError:
    ...") whatever the constructor raised: an unknown keyword, a value the env refuses, a library that validates with
    ``assert`` (reasoning-gym), a missing extra. ``RegistrationError`` for an unknown id, as :func:`make`."""
    kwargs = dict(kwargs or {})
    try:
        env = make(id, **kwargs)
    except RegistrationError:
        raise
    except Exception as e:
        with_kwargs = f" with kwargs {kwargs}" if kwargs else ""
        raise ValueError(f"cannot make {id!r}{with_kwargs}: {type(e).__name__}: {e}") from e
    env.close()


def description(id: str) -> str:
    """Returns the one-line description of ``id``: the registered one, else the class's ``description`` or the
    first line of its docstring (the class is imported)."""
    if id in _descriptions:
        return _descriptions[id]
    try:
        ep = load_entry_point(spec(id).entry_point)
        text = getattr(ep, "description", "") or (ep.__doc__ or "")
    except Exception as e:  # a broken plugin must not break the listing
        return f"<cannot import: {e}>"
    return text.strip().splitlines()[0] if text.strip() else ""


def registered_ids(namespace: str | None = None) -> list[str]:
    """Returns the sorted ids registered through agentrl (built-in and plugins), or those of ``namespace``."""
    ids = sorted(i for i in gymnasium.registry if i in _agentrl_ids)
    if namespace is not None:
        ids = [i for i in ids if gymnasium.registry[i].namespace == namespace]
    return ids


_plugins_loaded = False


def load_plugins() -> list[str]:
    """Loads every ``agentrl.envs`` entry point once; returns the names loaded. A broken plugin warns, never
    raises, so one bad package cannot make agentrl unimportable."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj):
                obj()
            loaded.append(ep.name)
        except Exception as e:
            warnings.warn(f"agentrl: env plugin {ep.name!r} ({ep.value}) failed to load: {e}", RuntimeWarning, stacklevel=2)
    return loaded
