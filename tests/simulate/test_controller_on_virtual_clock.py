"""The real training controller (manager, admission, batch schedule, trainer feed) runs unchanged on the virtual
clock, and its timeline is the one worked out by hand from the cost of each part."""

from __future__ import annotations

import selectors
import sys
from pathlib import Path

import pytest

from agentrl.simulate import run_virtual

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controller"))
import test_schedulers as ts  # noqa: E402  (the controller's fake trainer and engine, and its run helper)


@pytest.mark.parametrize("alpha, expected", [
    # α = 0: each step rolls out (3 turns x 2 s) then trains (5 s): 4 x 11 s.
    (0, 44.0),
    # α = 1: groups 0-3 roll out at 0-6; step 1 trains 6-11 (v=1 admits groups 4,5: 11-17); step 2 trains 11-16
    # (v=2 admits 6,7: 16-22); step 3 trains 4,5 at 17-22; step 4 trains 6,7 at 22-27.
    (1, 27.0),
])
def test_the_controllers_timeline_is_the_one_computed_by_hand(tmp_path, monkeypatch, alpha, expected):
    # Never sleeps: every wait of the real selector underneath is a poll (timeout 0), never a block. Asserted on
    # the waits themselves, not on wall time, which a loaded machine stretches.
    waits: list[float | None] = []
    real_select = selectors.DefaultSelector.select

    def recording_select(self, timeout=None):
        waits.append(timeout)
        return real_select(self, timeout)

    monkeypatch.setattr(selectors.DefaultSelector, "select", recording_select)
    cfg = ts._cfg(tmp_path, {"turns": 3, "step_latency": 2.0}, steps=4, async_ratio=alpha,
                  manager=ts.ManagerConfig(num_groups=2, group_size=2, max_turns=8))
    trainer = ts.RecordingTrainer(train_s=5.0)
    (rows, _, _), took = run_virtual(ts._run(cfg, trainer))
    assert took == pytest.approx(expected, abs=1e-6)
    assert [len(r["tasks"]) for r in rows] == [2, 2, 2, 2] and trainer.max_staleness <= alpha
    assert waits and set(waits) == {0}
