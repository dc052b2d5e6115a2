"""agentrl.childwatch: asyncio's children watched by a pidfd on the loop that started them, with no thread each."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import warnings

import pytest

from agentrl import childwatch

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12+ watches children by pidfd itself")


async def _both(a, b):
    return list(await asyncio.gather(a, b))


PIDS: list[int] = []


async def _run(*argv: str) -> tuple[int, bytes]:
    p = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    PIDS.append(p.pid)
    out, _ = await p.communicate()
    return p.returncode, out


def test_children_of_loops_in_two_threads_are_reaped_with_their_exit_codes_and_no_thread_each(
        default_watcher, started_threads):
    assert childwatch.install()
    PIDS.clear()
    results: dict[str, object] = {}

    def in_thread():  # a loop outside the main thread: 3.11's own PidfdChildWatcher would watch it on the wrong loop
        results["thread"] = asyncio.run(_both(_run("sh", "-c", "echo t; exit 3"), _run("true")))

    t = threading.Thread(target=in_thread, name="loop-thread")
    t.start()
    results["main"] = asyncio.run(_both(_run("sh", "-c", "kill -TERM $$"), _run("echo", "m")))
    t.join(60)
    assert results["thread"] == [(3, b"t\n"), (0, b"")]
    assert results["main"] == [(-15, b""), (0, b"m\n")]
    assert [n for n in started_threads if "waitpid" in n] == [], started_threads
    assert len(PIDS) == 4
    for pid in PIDS:  # every child reaped: none left to wait for
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_without_it_the_default_watcher_starts_a_thread_per_child(default_watcher, started_threads):
    """The cost the module removes, shown on the same fixture (and that the fixture really is the default)."""
    assert asyncio.run(_run("true")) == (0, b"")
    assert [n for n in started_threads if "waitpid" in n], started_threads


def test_a_watcher_the_user_set_is_kept(default_watcher):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mine = asyncio.SafeChildWatcher()
        default_watcher._watcher = mine
    assert not childwatch.install()
    assert default_watcher._watcher is mine
