"""The sandboxes a fleet needs at once follow from the manager's rules, not from a hand-set number:
``EnvManager.sandbox_demand`` is max_concurrency capped by the admission rule's open groups (async_ratio, batch
size) times their members, or by a batch round's groups; ``warm_sandboxes`` keeps that fleet ready in a pool (the
real pool with real sandboxes: tests/sandboxes/test_fleet_manager.py)."""

from __future__ import annotations

import pytest

from agentrl.manager import EnvManager, ManagerConfig
from agentrl.manager.admission import Admission
from agentrl.testing.manager_envs import EchoPolicy


@pytest.mark.parametrize("kw,want", [
    # α=1, B=8, group 4 (+1 extra member): ⌊2·8/4⌋ = 4 groups open at most, 5 members each
    (dict(async_ratio=1, num_groups=2, group_size=4, extra_per_group=1, max_concurrency=64), 20),
    (dict(async_ratio=1, num_groups=2, group_size=4, extra_per_group=1, max_concurrency=12), 12),
    # α=0: one batch ahead only; batch_size overrides num_groups·group_size
    (dict(async_ratio=0, batch_size=32, num_groups=1, group_size=8, max_concurrency=1024), 32),
    (dict(async_ratio=3, batch_size=256, group_size=8, max_concurrency=4096), 1024),
    # no admission rule: a batch round's groups (num_groups + extra_groups)
    (dict(num_groups=16, extra_groups=4, group_size=2, max_concurrency=256), 40),
    (dict(num_groups=256, group_size=8, max_concurrency=256), 256),
])
def test_sandbox_demand_follows_the_admission_rule(kw, want):
    assert EnvManager(ManagerConfig(**kw), EchoPolicy()).sandbox_demand() == want


def test_max_open_groups_is_the_admission_bound():
    assert Admission(None, 8).max_open_groups(4) is None
    assert Admission(2, 8).max_open_groups(4) == 6
    assert Admission(0, 2).max_open_groups(4) == 1  # a group larger than B still gets one slot


class FakePool:
    def __init__(self):
        self.calls = []

    async def keep_warm(self, spec, n, **kw):
        self.calls.append((spec, n, kw))


async def test_warm_sandboxes_asks_the_pool_for_the_fleet():
    m = EnvManager(ManagerConfig(async_ratio=1, num_groups=2, group_size=4, max_concurrency=64), EchoPolicy())
    pool = FakePool()
    assert await m.warm_sandboxes(pool, "SPEC", wait=True) == 16
    assert pool.calls == [("SPEC", 16, {"wait": True, "snapshot": None, "fleet": True})]
