"""The driver's collector settings (agentrl.gcheap): frozen and tuned inside the block, as before after it."""

from __future__ import annotations

import gc
import weakref

from agentrl import gcheap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_the_heap_is_frozen_inside_and_collectable_again_after():
    before = gc.get_threshold()
    cycle = Node()
    alive = weakref.ref(cycle)
    with gcheap.settled() as frozen:
        assert frozen > 0 and gc.get_freeze_count() > 0
        assert gc.get_threshold() == gcheap.THRESHOLDS
        del cycle
        gc.collect()
        assert alive() is not None  # frozen before the block: out of the collector's sight
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    gc.collect()
    assert alive() is None


def test_a_failure_inside_still_restores_the_collector():
    before = gc.get_threshold()
    try:
        with gcheap.settled():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
