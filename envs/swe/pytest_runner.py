"""Runs pytest node ids and reports one framed line per id. Standalone (stdlib + the env's pytest), Python 3.8+.

The grader copies this file into the grading sandbox and runs it from the repository root::

    python -I -B pytest_runner.py --nonce-file F --ids-file IDS [--per-test-timeout S] [--path DIR ...]
                                  [--guard-file LIST] [-- PYTEST_ARGS...]

Only the files of the ids are given to pytest; items that are not asked for are deselected, so an id that names no
test is reported ``missing`` instead of aborting the session. Output, on stdout:

- ``@@agentrl:NONCE:log-begin``, pytest's own ``-rA`` output, ``@@agentrl:NONCE:log-end RC``: the grader parses it
  with the official ``swebench`` pytest log parser;
- one ``@@agentrl:NONCE:result {"id", "status", "detail"}`` line per id, then ``@@agentrl:NONCE:end``.

STATUS: ``pass``, ``fail``, ``error`` (setup/teardown/collection failure), ``skip``, ``xfail`` (a failure the
test declares with an ``xfail`` marker), ``timeout`` or ``missing``. An imperative ``pytest.xfail()``/``pytest.skip()``
reached from the code under test is ``fail``/``skip``: neither passes.

Integrity: the nonce is read from a file that is deleted before any repository code runs, so code under test cannot
forge result lines; after the run the interpreter exits at once (no ``atexit`` output after the frame). The files
named in ``--guard-file`` (the graded test files) are hashed before anything runs and checked when each test module
is collected and at the end: a change makes every result ``error``.
"""

import hashlib
import io
import json
import os
import signal
import sys

DETAIL_CHARS = 2000


class _TestTimeout(BaseException):
    """Raised by the alarm inside a test; a BaseException so ``except Exception`` in the test cannot swallow it."""


def _digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


class Guard:
    """Hashes of the graded files, taken before any repository code runs."""

    def __init__(self, paths):
        self.hashes = {p: _digest(p) for p in paths}
        self.changed = []

    def check(self):
        for p, h in self.hashes.items():
            if _digest(p) != h and p not in self.changed:
                self.changed.append(p)
        return not self.changed


class Plugin:
    """Selects the wanted items, arms the per-test alarm and records one status per node id."""

    def __init__(self, wanted, per_test_timeout, guard):
        self.wanted = list(wanted)
        self.wanted_set = set(wanted)
        self.timeout = per_test_timeout
        self.guard = guard
        self.status = {}
        self.detail = {}
        self.collect_errors = {}
        self.timed_out = set()
        self.declared_xfail = set()

    # selection ------------------------------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, session, config, items):
        keep, drop = [], []
        for item in items:
            (keep if item.nodeid in self.wanted_set else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors[report.nodeid] = str(report.longreprtext)[-DETAIL_CHARS:]

    def pytest_collectstart(self, collector):
        self.guard.check()  # a test module may be about to be imported: its bytes must still be the graded ones

    # timing ---------------------------------------------------------------------------------------------------
    def _fire(self, signum, frame):
        raise _TestTimeout("test exceeded %.1fs" % self.timeout)

    def pytest_runtest_protocol(self, item, nextitem):
        if self.timeout > 0:
            signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
        return None

    def pytest_runtest_logfinish(self, nodeid, location):
        signal.setitimer(signal.ITIMER_REAL, 0)

    # outcomes -------------------------------------------------------------------------------------------------
    def pytest_runtest_makereport(self, item, call):
        if call.excinfo is not None and call.excinfo.errisinstance(_TestTimeout):
            self.timed_out.add(item.nodeid)
        if item.get_closest_marker("xfail") is not None:
            self.declared_xfail.add(item.nodeid)
        return None

    def _set(self, nodeid, status, detail=""):
        order = ["pass", "xfail", "skip", "fail", "error", "timeout"]
        old = self.status.get(nodeid)
        if old is None or order.index(status) > order.index(old):
            self.status[nodeid] = status
            if detail:
                self.detail[nodeid] = detail[-DETAIL_CHARS:]

    def pytest_runtest_logreport(self, report):
        nid = report.nodeid
        text = str(getattr(report, "longreprtext", "") or "")
        if nid in self.timed_out:
            self._set(nid, "timeout", "test exceeded the per-test timeout of %.1fs" % self.timeout)
            return
        xfailed = hasattr(report, "wasxfail")
        if report.when == "call":
            if report.passed and not xfailed:
                self._set(nid, "pass")
            elif report.skipped and xfailed:
                if nid in self.declared_xfail:
                    self._set(nid, "xfail", "xfail: %s" % report.wasxfail)
                else:
                    self._set(nid, "fail", "pytest.xfail() called while the test ran: %s" % report.wasxfail)
            elif report.skipped:
                self._set(nid, "skip", text)
            else:  # failed, or an unexpected pass of an xfail test
                self._set(nid, "fail", text or "XPASS(strict)")
        elif report.failed:
            self._set(nid, "error", "%s failed: %s" % (report.when, text))
        elif report.skipped and report.when == "setup":
            self._set(nid, "skip", text)


def _files(ids):
    out = []
    for t in ids:
        path = t.split("::", 1)[0]
        if path not in out:
            out.append(path)
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    opts = {"--nonce-file": None, "--ids-file": None, "--per-test-timeout": "60", "--guard-file": None}
    paths = []
    it = iter(argv)
    for a in it:
        if a == "--path":
            paths.append(next(it))
        elif a in opts:
            opts[a] = next(it)
        else:
            sys.stderr.write("pytest_runner: unknown argument %r\n" % a)
            return 2
    with io.open(opts["--nonce-file"], encoding="utf-8") as f:
        nonce = f.read().strip()
    os.unlink(opts["--nonce-file"])
    with io.open(opts["--ids-file"], encoding="utf-8") as f:
        ids = [line.rstrip("\n") for line in f if line.strip()]
    guarded = []
    if opts["--guard-file"]:
        with io.open(opts["--guard-file"], encoding="utf-8") as f:
            guarded = [line.rstrip("\n") for line in f if line.strip()]
    guard = Guard(guarded)
    sys.path[:0] = [os.path.abspath(p) for p in paths]
    sys.dont_write_bytecode = True
    out = sys.stdout
    import pytest

    plugin = Plugin(ids, float(opts["--per-test-timeout"]), guard)
    out.write("@@agentrl:%s:log-begin\n" % nonce)
    out.flush()
    args = ["-rA", "--tb=short", "-p", "no:cacheprovider", "-o", "console_output_style=classic", "--continue-on-collection-errors",
            "--rootdir", os.getcwd()] + extra + _files(ids)
    try:
        rc = int(pytest.main(args, plugins=[plugin]))
    except BaseException as e:  # pytest itself died: every id without a status reports it
        rc = -1
        plugin.collect_errors["<session>"] = "%s: %s" % (type(e).__name__, e)
    sys.stdout = out
    out.write("\n@@agentrl:%s:log-end %d\n" % (nonce, rc))
    intact = guard.check()
    for t in ids:
        if not intact:
            status, detail = "error", "graded files changed while the tests ran: %s" % ", ".join(guard.changed)
        elif t in plugin.status:
            status, detail = plugin.status[t], plugin.detail.get(t, "")
        else:
            errs = [v for k, v in plugin.collect_errors.items() if k == "<session>" or t.startswith(k + "::") or k == t.split("::")[0]]
            status, detail = ("error", errs[0]) if errs else ("missing", "no test collected for this id")
        out.write("@@agentrl:%s:result %s\n" % (nonce, json.dumps({"id": t, "status": status, "detail": detail})))
    out.write("@@agentrl:%s:end\n" % nonce)
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
