"""The router shared by the remote backend and engine replicas: sticky sessions, least-in-flight choice, failover,
bounded session table. Pure unit tests (no engine)."""

from __future__ import annotations

import pytest

from agentrl.inference.router import Router


def test_new_sessions_go_to_least_loaded_and_stay_there():
    r = Router(3)
    picks = []
    for k in range(6):
        i = r.pick(f"s{k}")
        r.started(i)
        picks.append(i)
    assert picks == [0, 1, 2, 0, 1, 2]  # by in-flight count, ties by list order
    # A pinned session returns to its backend however busy it is.
    for _ in range(5):
        r.started(0)
    assert r.pick("s0") == 0 and r.pick("s3") == 0
    assert r.pick("new") in (1, 2)


def test_ties_broken_by_pinned_sessions():
    r = Router(2)
    assert r.pick("a") == 0  # nothing in flight anywhere: backend 0, now holds one session
    assert r.pick("b") == 1  # both idle; backend 1 has fewer sessions
    assert r.pick(None) == 0  # no session: least loaded, ties by sessions then order; pins nothing
    assert r.backend_for("a") == 0 and r.backend_for("b") == 1
    assert r.sessions == [1, 1]


def test_unhealthy_backend_moves_its_sessions_once():
    r = Router(2)
    assert r.pick("s") == 0
    r.mark_unhealthy(0)
    assert r.pick("s") == 1
    r.mark_healthy(0)
    assert r.pick("s") == 1  # moved for good, not back
    assert r.sessions == [0, 1]


def test_all_unhealthy_tries_everyone_again():
    r = Router(2)
    r.mark_unhealthy(0)
    r.mark_unhealthy(1)
    assert r.pick("s") == 0
    assert r.healthy == [True, True]


def test_session_table_is_bounded_and_counts_stay_consistent():
    r = Router(2, max_sessions=3)
    for k in range(10):
        r.pick(f"s{k}")
    assert sum(r.sessions) == 3
    assert r.backend_for("s0") is None and r.backend_for("s9") is not None
    r.end_session("s9")
    r.end_session("s9")  # idempotent
    assert sum(r.sessions) == 2


def test_inflight_counts():
    r = Router(2)
    r.started(1)
    r.started(1)
    assert r.pick(None) == 0
    r.finished(1)
    r.finished(1)
    assert r.inflight == [0, 0]


def test_bad_sizes_rejected():
    with pytest.raises(ValueError):
        Router(0)
    with pytest.raises(ValueError):
        Router(1, max_sessions=0)
