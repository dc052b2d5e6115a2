"""The driver's garbage collector while it serves: the start-up heap frozen, the young generation larger. Used by
the long-running drivers (``train``'s RL phase, ``agentrl gateway``) once their engine is up.

Why: the driver holds torch, vLLM's front end and transformers, ~0.7 M objects the cyclic collector tracks. With
CPython's default thresholds (700, 10, 10) it walks all of them in a full collection every second or two, 30-180 ms
on two cores, while every episode, engine output and gateway request on the event loop waits. ``gc.freeze()`` takes
the start-up heap out of its sight (vLLM does the same in its engine-core process, not in ours), and a young
generation of 20,000 allocations makes the young and middle passes rarer. Reference counting frees most objects as
before; cyclic garbage is still collected, later. BENCHMARKS.md ("Where the non-streamed gap comes from") has the
runs.

Invariant: this only tunes CPython's collector and changes no result. On exit the heap is unfrozen and the old
thresholds come back (as vLLM's engine core does at shutdown), so a process that goes on (a test session, a notebook)
can collect what the driver left.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

THRESHOLDS = (20_000, 20, 20)  # young generation, then collections of each generation before the next is collected


@contextlib.contextmanager
def settled() -> Iterator[int]:
    """Collects, freezes what survives and sets :data:`THRESHOLDS` for the block; yields the number of objects
    frozen."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()
        gc.set_threshold(*old)
