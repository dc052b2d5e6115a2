"""Runs unittest test ids one at a time and reports one framed line per id. Standalone: stdlib only, Python 3.8+.

The grader copies this file into the grading sandbox and runs it from the repository root::

    python3 -I -B unittest_runner.py --nonce-file F [--per-test-timeout S] [--ids-file FILE] [--path DIR ...]
                                     [--guard-file LIST] [ID ...]
    python3 unittest_runner.py --list [--start tests]      # prints the discovered test ids, one a line

Each result is a stdout line ``@@agentrl:NONCE:result {"id": ID, "status": STATUS, "detail": TEXT}``, written and
flushed as soon as that id has run (so a run killed from outside keeps what finished), then ``@@agentrl:NONCE:end``.
STATUS is one of ``pass``, ``fail``, ``error``, ``skip``, ``timeout`` or ``missing`` (the id names no test: its
module, class or method does not exist). Only ``pass`` counts as passing.

Integrity: the nonce is read from a file deleted before any repository code runs (code under test cannot forge a
result line; there is no results file to overwrite), and the interpreter exits at once after the last line. The
files of ``--guard-file`` are hashed first and checked before each id is loaded and at the end: a change makes the
remaining results, and the final verdict, ``error``.

The per-test timeout is a SIGALRM armed around each test method; it interrupts pure-Python loops and sleeps. A test
blocked inside C code is left to the caller's overall timeout.
"""

import argparse
import hashlib
import io
import os
import json
import re
import signal
import sys
import unittest

DETAIL_CHARS = 2000


class _TestTimeout(BaseException):
    """Raised by the alarm inside a test; a BaseException so ``except Exception`` in the test cannot swallow it."""


class _TimedResult(unittest.TestResult):
    """A TestResult that arms a per-test alarm and remembers whether it fired."""

    def __init__(self, per_test_timeout):
        super().__init__()
        self.per_test_timeout = per_test_timeout
        self.timed_out = False
        self.buffer = True  # the tests' own prints must not reach our output

    def _fire(self, signum, frame):
        self.timed_out = True
        raise _TestTimeout("test exceeded %.1fs" % self.per_test_timeout)

    def startTest(self, test):
        super().startTest(test)
        if self.per_test_timeout > 0:
            signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.per_test_timeout)

    def stopTest(self, test):
        if self.per_test_timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
        super().stopTest(test)


def _load(test_id):
    """Returns (suite, None) or (None, (status, detail)) when the id cannot be loaded."""
    loader = unittest.TestLoader()
    try:
        suite = loader.loadTestsFromName(test_id)
    except Exception as e:  # e.g. an attribute that is not a test
        return None, ("missing", "%s: %s" % (type(e).__name__, e))
    errors = list(getattr(loader, "errors", []))
    if errors:
        text = "\n".join(errors)
        # "missing" only when the id's own module or attribute is absent; an import error inside it is "error"
        absent = re.findall(r"No module named '([^']+)'", text)
        missing = "has no attribute" in text or any(test_id == m or test_id.startswith(m + ".") for m in absent)
        return None, ("missing" if missing else "error", text[-DETAIL_CHARS:])
    if suite.countTestCases() == 0:
        return None, ("missing", "no test found for this id")
    return suite, None


def run_one(test_id, per_test_timeout):
    """Runs one id; returns (status, detail)."""
    suite, problem = _load(test_id)
    if problem is not None:
        return problem
    result = _TimedResult(per_test_timeout)
    try:
        suite.run(result)
    except _TestTimeout:  # fired outside a test part (e.g. a class fixture)
        result.timed_out = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if result.timed_out:
        return "timeout", "test exceeded the per-test timeout of %.1fs" % per_test_timeout
    if result.errors:
        return "error", result.errors[0][1][-DETAIL_CHARS:]
    if result.failures:
        return "fail", result.failures[0][1][-DETAIL_CHARS:]
    if result.unexpectedSuccesses:
        return "fail", "unexpected success"
    if result.testsRun == 0:
        return "missing", "no test ran"
    if len(result.skipped) == result.testsRun:
        return "skip", result.skipped[0][1][:DETAIL_CHARS]
    return "pass", ""


def list_tests(start):
    """Returns the ids of every test discovered under ``start`` (relative to the current directory)."""
    out = []

    def walk(suite):
        for item in suite:
            if isinstance(item, unittest.TestSuite):
                walk(item)
            else:
                out.append(item.id())

    walk(unittest.TestLoader().discover(start, top_level_dir="."))
    return out


def _digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*")
    ap.add_argument("--ids-file", help="file with more test ids, one a line (for long lists)")
    ap.add_argument("--nonce-file", help="file holding the nonce of the result lines (deleted once read)")
    ap.add_argument("--guard-file", help="file listing the graded files whose bytes must not change")
    ap.add_argument("--path", action="append", default=[], help="directory put first on sys.path (repeatable)")
    ap.add_argument("--per-test-timeout", type=float, default=30.0)
    ap.add_argument("--list", action="store_true", help="print the discovered test ids and exit")
    ap.add_argument("--start", default="tests")
    args = ap.parse_args(argv)
    sys.path[:0] = [os.path.abspath(p) for p in args.path] + [os.path.abspath(".")]
    sys.dont_write_bytecode = True
    if args.list:
        for test_id in list_tests(args.start):
            print(test_id)
        return 0
    if not args.nonce_file:
        ap.error("--nonce-file is required unless --list is given")
    with io.open(args.nonce_file, encoding="utf-8") as f:
        nonce = f.read().strip()
    os.unlink(args.nonce_file)
    ids = list(args.ids)
    if args.ids_file:
        with io.open(args.ids_file, encoding="utf-8") as f:
            ids += [line.strip() for line in f if line.strip()]
    guarded = []
    if args.guard_file:
        with io.open(args.guard_file, encoding="utf-8") as f:
            guarded = [line.rstrip("\n") for line in f if line.strip()]
    hashes = {p: _digest(p) for p in guarded}
    out = sys.stdout
    changed = []

    def intact():
        changed[:] = [p for p, h in hashes.items() if _digest(p) != h]
        return not changed

    def emit(test_id, status, detail):
        out.write("@@agentrl:%s:result %s\n" % (nonce, json.dumps({"id": test_id, "status": status, "detail": detail})))
        out.flush()

    for test_id in ids:
        if not intact():
            emit(test_id, "error", "graded files changed while the tests ran: %s" % ", ".join(changed))
            continue
        status, detail = run_one(test_id, args.per_test_timeout)
        emit(test_id, status, detail)
    if not intact():
        emit("<guard>", "error", "graded files changed while the tests ran: %s" % ", ".join(changed))
    out.write("@@agentrl:%s:end\n" % nonce)
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
