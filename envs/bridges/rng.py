"""The process-global random generators, kept per owner: what lets in-process libraries that draw from (or seed)
Python's ``random`` and ``numpy.random`` run as concurrent, reproducible envs (TextArena, reasoning-gym).

Flow: ``with_states(states, fn)`` holds :data:`LOCK`, puts ``states`` (an env's :class:`RNGStates`) in the place of
the process's generators, runs ``fn``, takes what ``fn`` left (the owner's next states) and puts the process's
generators back. ``replayable(kind, seed, fn)`` gives what ``fn`` gives seeded with ``seed()``, for pure calls (a
dataset's entry, a score): it runs ``fn`` unseeded first and seeds only a call that moved a generator.

Invariants:

- One lock for every bridge in the process: a call of one library never runs while another's generators are in
  place, whichever bridge made either call. A call given a bound cannot keep it longer (:mod:`.deadline`).
- Exact: the process's generators, and an owner's, come back bit for bit, including the cached second normal of
  ``random.gauss`` and of numpy's legacy ``RandomState`` (``has_gauss``).
- Cheap: ``random.getstate`` / ``numpy.random.get_state`` build a 625-number tuple (~10 µs and ~40 µs here) and a
  swap needs four of each: ~0.2 ms per library call, 10-40x the library's own step. The Mersenne Twister states are
  copied instead as their 2,500 raw bytes, through byte views of their memory (~6 µs a guarded call in all): numpy's
  at its bit generator's public ``ctypes.state_address``, Python's in CPython's ``RandomObject`` struct right after
  the object header (not a public API). Each way is
  checked against ``get_state`` / ``getstate`` at import and left unused (the tuple way kept) if they differ.
  numpy's cached normal cannot be read cheaply, so the slow, exact way is taken whenever one may be cached: a
  state is known to hold none while its bytes equal those last read with ``has_gauss == 0`` (a normal is cached only
  by drawing, which moves the bytes).
"""

from __future__ import annotations

import ctypes
import random
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from agentrl.envs.bridges.deadline import LibraryTimeout, bounded

T = TypeVar("T")
LOCK = threading.RLock()
_MT_BYTES = 2500  # both Mersenne Twisters: 624 uint32 words and an int index (numpy: key then pos; Python: index first)


_GET_BG = getattr(np.random, "get_bit_generator", None)  # None before numpy 1.25


def _bit_generator() -> Any:
    """numpy's global legacy generator's bit generator (None before numpy 1.25, which has no ``get_bit_generator``)."""
    return _GET_BG() if _GET_BG is not None else None


def _np_address(bg: Any) -> int | None:
    """The raw state's address of the bit generator ``bg``, or None when it is not an MT19937."""
    return bg.ctypes.state_address if type(bg).__name__ == "MT19937" else None


def _view(address: int) -> memoryview:
    """The ``_MT_BYTES`` at ``address`` as a writable byte view: reading it with ``bytes()`` and assigning to it cost
    ~0.2-0.4 µs here, against ~1.2 µs for ``ctypes.string_at`` / ``memmove`` (four of each per swap)."""
    return memoryview((ctypes.c_char * _MT_BYTES).from_address(address)).cast("B")


_np_seen: tuple[Any, memoryview | None] = (None, None)  # the bit generator last in place (held) and its state's view


def _np_view() -> memoryview | None:
    """:func:`_view` of numpy's global MT19937 state (None: not an MT19937), made again only when another bit
    generator is in place (``set_bit_generator``); holding the last one keeps its memory, and its identity."""
    global _np_seen
    bg = _GET_BG()  # type: ignore[misc]  (only called where _NP_RAW, which needs it)
    if bg is not _np_seen[0]:
        addr = _np_address(bg)
        _np_seen = (bg, None if addr is None else _view(addr))
    return _np_seen[1]


def _py_address() -> int:
    return id(random._inst) + object.__basicsize__  # type: ignore[attr-defined]  (the module's one generator)


def _check_raw() -> tuple[bool, bool]:
    """Whether the raw byte ways read the same states as ``get_state`` / ``getstate`` on this interpreter."""
    np_ok = py_ok = False
    addr = _np_address(_bit_generator())
    if addr is not None:
        key, pos = np.random.get_state()[1:3]
        raw = ctypes.string_at(addr, _MT_BYTES)
        np_ok = raw == key.astype("<u4").tobytes() + int(pos).to_bytes(4, "little", signed=True)
    if sys.implementation.name == "cpython" and hasattr(random._inst, "gauss_next"):  # type: ignore[attr-defined]
        # Only read here: a header of another size (a free-threaded build) reads other bytes and fails the check.
        words = random.getstate()[1]
        raw = ctypes.string_at(_py_address(), _MT_BYTES)
        py_ok = raw == words[-1].to_bytes(4, "little", signed=True) + np.array(words[:-1], "<u4").tobytes()
    return np_ok, py_ok


_NP_RAW, _PY_RAW = _check_raw()
_PY_VIEW = _view(_py_address()) if _PY_RAW else None  # the module's one generator lives as long as the process


class _Np:
    """numpy's global state as taken: ``raw``, the MT19937 state's bytes; ``full``, get_state()'s tuple (a dict for
    another bit generator) when a normal may be cached, None when known to hold none. (Slotted classes, not
    dataclasses: a guarded call makes four of these objects, and their construction was a tenth of its cost.)"""

    __slots__ = ("raw", "full")

    def __init__(self, raw: bytes, full: Any = None):
        self.raw, self.full = raw, full


class RNGStates:
    """The states of both global generators that one owner (an env) draws from."""

    __slots__ = ("py", "np")

    def __init__(self, py: Any, np: Any):
        self.py, self.np = py, np

    @classmethod
    def current(cls) -> "RNGStates":
        """The states in place now (hold :data:`LOCK`)."""
        return cls(_py_take(), _np_take())

    @classmethod
    def seeded(cls, seed: int) -> "RNGStates":
        """Both generators seeded with ``seed`` (:func:`seed_globals`)."""
        with seeded(seed):
            return cls.current()

    def put_over(self, in_place: "RNGStates") -> None:
        """Puts these states in place of ``in_place``, the states in place now (just taken or put; hold
        :data:`LOCK`)."""
        _py_put(self.py)
        _np_put(self.np, in_place.np)


def seed_globals(seed: int) -> None:
    """``random.seed(seed)`` and ``numpy.random.seed(seed % 2**32)`` (hold :data:`LOCK`); what this module knows of
    numpy's state follows (a seeded legacy generator caches no normal), so the next swap copies bytes."""
    global _np_clean
    random.seed(seed)
    np.random.seed(seed % 2**32)
    view = _np_view() if _NP_RAW else None
    _np_clean = None if view is None else bytes(view)


@contextmanager
def seeded(seed: int, bound_s: float | None = None, what: str = "a library call") -> Iterator[None]:
    """Holds :data:`LOCK` with both generators seeded with ``seed`` (:func:`seed_globals`); the process's states
    are back in place on exit. ``bound_s``: the body is interrupted past it, as in :func:`with_states`."""
    with LOCK:
        saved = RNGStates.current()
        seed_globals(seed)
        try:
            with bounded(bound_s, what):
                yield
        finally:
            saved.put_over(RNGStates.current())


def with_states(states: RNGStates | None, fn: Callable[[], T], bound_s: float | None = None,
                what: str = "a library call") -> tuple[T, RNGStates]:
    """Runs ``fn`` with ``states`` in place of the process's generators (None: the process's own, for a first call
    that seeds them itself) under :data:`LOCK`; returns ``fn``'s result and the states it left. The process's states
    are back in place afterwards, also when ``fn`` raises. ``bound_s``: ``fn`` is interrupted past it with
    :class:`~.deadline.LibraryTimeout` naming ``what``, so that no endless call keeps the lock."""
    with LOCK:
        saved = RNGStates.current()
        try:
            if states is not None:
                states.put_over(saved)
            with bounded(bound_s, what):
                result = fn()
        finally:
            left = RNGStates.current()
            saved.put_over(left)
        return result, left


_DRAWS: set[Any] = set()  # kinds of replayable calls seen to move a global generator: they go seeded at once


def replayable(kind: Any, seed: Callable[[], int], fn: Callable[[], T], bound_s: float | None = None,
               what: str = "a library call") -> T:
    """``fn()``'s result as ``with seeded(seed()): fn()`` gives it, for a call whose result depends only on its
    inputs and on what it draws from the global generators, and which changes nothing else (making a dataset's
    entry, scoring an answer), at a fraction of the cost when it draws nothing.

    Under :data:`LOCK`, ``fn`` first runs with the process's generators as they are, and their bytes are compared
    before and after (~2 µs against ~15 µs for seeding both and swapping them back). A call that moved neither drew
    nothing, so its result is the seeded one. A call that moved one (or used a cached normal) has them put back and
    runs again seeded, and its ``kind`` goes seeded at once from then on. Where a cached numpy normal could be used
    without moving bytes (one is cached in the process's state now), or the raw ways are off, it runs seeded."""
    if kind not in _DRAWS and _PY_RAW and _NP_RAW:
        with LOCK:
            view = _np_view()
            raw = None if view is None else bytes(view)
            if raw is not None and (raw == _np_clean or _np_take().full is None):
                inst = random._inst  # type: ignore[attr-defined]
                py, gauss = bytes(_PY_VIEW), inst.gauss_next  # type: ignore[arg-type]
                failed: BaseException | None = None
                try:
                    with bounded(bound_s, what):
                        result = fn()
                except BaseException as e:
                    if isinstance(e, LibraryTimeout) or not isinstance(e, Exception):  # interrupted: not rerun
                        RNGStates((py, gauss), _Np(raw)).put_over(RNGStates.current())
                        raise
                    failed = e  # the same error seeded, unless it drew
                if (_np_view() is view and bytes(view) == raw and bytes(_PY_VIEW) == py  # type: ignore[arg-type]
                        and inst.gauss_next is gauss):
                    if failed is not None:
                        raise failed
                    return result
                RNGStates((py, gauss), _Np(raw)).put_over(RNGStates.current())
                _DRAWS.add(kind)
    with seeded(seed(), bound_s, what):
        return fn()


# -- Python's random: raw bytes plus gauss_next, or getstate()'s tuple ---------------------------------------------
def _py_take() -> Any:
    if _PY_RAW:
        return bytes(_PY_VIEW), random._inst.gauss_next  # type: ignore[arg-type, attr-defined]
    return random.getstate()


def _py_put(state: Any) -> None:
    if _PY_RAW:
        raw, gauss_next = state
        _PY_VIEW[:] = raw  # type: ignore[index]
        random._inst.gauss_next = gauss_next  # type: ignore[attr-defined]
    else:
        random.setstate(state)


# -- numpy's legacy global RandomState ------------------------------------------------------------------------------
_np_clean: bytes | None = None  # the bytes of the state in place when it was last known to cache no normal


def _np_take() -> _Np:
    global _np_clean
    view = _np_view() if _NP_RAW else None
    if view is None:
        # Not an MT19937 (or its bytes unread): the bit generator's own state as a dict, exact, and without the
        # warning a legacy read of another generator gives at every call.
        return _Np(b"", np.random.get_state(legacy=False))
    raw = bytes(view)
    if raw == _np_clean:
        return _Np(raw)
    full = np.random.get_state()
    if full[3] == 0:
        _np_clean = raw
        return _Np(raw)
    return _Np(raw, full)


def _np_put(state: _Np, in_place: _Np) -> None:
    global _np_clean
    view = _np_view() if _NP_RAW else None
    if state.full is None and in_place.full is None and view is not None and in_place.raw:
        view[:] = state.raw  # neither caches a normal: the bytes are the whole state
        _np_clean = state.raw
    elif state.full is not None:
        np.random.set_state(state.full)
        _np_clean = None  # a normal may be cached in what is in place now
    else:
        key = np.frombuffer(state.raw[:-4], "<u4")
        np.random.set_state(("MT19937", key, int.from_bytes(state.raw[-4:], "little", signed=True), 0, 0.0))
        _np_clean = state.raw
