"""The shell side of the sandboxes: the scripts that run inside a sandbox around a command, and their argv.

Who ends a command is the host (see base.py); these scripts only report. Both dash and busybox ash run them.
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping, Sequence

# The exec wrapper, a POSIX sh script (dash and busybox ash both run it), run inside the sandbox as
#   sh -c EXEC_WRAPPER sh MARKER FLAGS COMMAND
# MARKER names the exec (the host finds the wrapper's pid by it); FLAGS: "g" waits for a "go" line on stdin first
# (docker: the host moves the wrapper into the exec's own cgroup, then says go, so that every process the command
# starts is in that cgroup), "p" (plain) passes the rest of stdin to the command and keeps its stderr apart, else the
# command's stdin is /dev/null and its stderr joins stdout. The command's exit status goes to fd 3 (the exec's
# stderr, a channel apart from the output) as "agentrl:done N"; the host then kills the exec's group. The wrapper
# enforces nothing: the sandbox user may kill it, and the host's timeout still ends the command's tree.
EXEC_WRAPPER = r"""
case $2 in *g*) IFS= read -r go && [ "$go" = go ] || exit 125;; esac
exec 3>&2
case $2 in
*p*) sh -c "$3" 3>&- ;;
*) sh -c "$3" </dev/null 2>&1 3>&- ;;
esac
echo "agentrl:done $?" >&3
"""

# The fallback wrapper for a docker engine whose cgroups the driver cannot reach, run as
#   sh -c WATCHDOG_WRAPPER sh MARKER TIMEOUT_S COMMAND
# It starts a new session (setsid) whose leader first forks a watchdog, waits until the watchdog's timer runs (a
# USR1 handshake, spinning on builtins), and only then execs the command: so the watchdog needs no new process to act
# even when a fork bomb holds every pid the sandbox may have. When the time is up the watchdog reports
# "agentrl:timeout" on fd 3 and SIGKILLs its whole process group with the `kill` builtin. When the command returns,
# the wrapper kills what is left of the group, then every process still carrying AGENTRL_EXEC_ID=MARKER in its
# environment, and reports "agentrl:done N". A command that kills the watchdog or clears its environment escapes
# this; the host-side groups above do not have that hole.
WATCHDOG_WRAPPER = r"""
m=$1; t=$2; c=$3
exec 3>&2
inner='
trap "ready=1" USR1
(
    trap - USR1
    sleep "$1" </dev/null >/dev/null 2>&1 3>&- &
    kill -USR1 $$
    wait $!
    echo agentrl:timeout >&3
    kill -KILL 0
) </dev/null >/dev/null 2>&1 &
n=0
while [ -z "$ready" ] && [ $n -lt 200000 ]; do n=$((n + 1)); done
trap - USR1
exec sh -c "$2" 3>&-
'
AGENTRL_EXEC_ID=$m setsid sh -c "$inner" sh "$t" "$c" </dev/null 2>&1 &
pid=$!
wait "$pid"; rc=$?
kill -KILL -"$pid" 2>/dev/null
i=0
while [ $i -lt 30 ]; do
    left=
    for f in $(grep -lszF "AGENTRL_EXEC_ID=$m" /proc/[0-9]*/environ 2>/dev/null); do
        f=${f#/proc/}; left="$left ${f%/environ}"
    done
    [ -n "$left" ] || break
    kill -STOP $left 2>/dev/null; kill -KILL $left 2>/dev/null
    i=$((i + 1))
done
echo "agentrl:done $rc" >&3
exit $rc
"""

# Empties the directories given as arguments. A command may have left a directory it made unreadable: a second pass
# makes everything the user's own again first. Exit 1 (naming what is left) if anything remains.
WIPE_SCRIPT = r"""
wipe() { for d in "$@"; do [ -d "$d" ] && find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; done 2>/dev/null; }
left() { for d in "$@"; do [ -d "$d" ] && find "$d" -mindepth 1 -maxdepth 1; done 2>/dev/null; }
wipe "$@"
[ -z "$(left "$@")" ] && exit 0
for d in "$@"; do [ -d "$d" ] && chmod -R u+rwX "$d"; done 2>/dev/null
wipe "$@"
l=$(left "$@")
[ -z "$l" ] || { echo "left after reset: $l"; exit 1; }
"""

TIMEOUT_EXIT = 124
STATUS_TIMEOUT = b"agentrl:timeout"
_DONE = re.compile(rb"agentrl:done (\d+)\n")


def done_code(status: bytes) -> int | None:
    """The command's exit status reported by a wrapper on its status channel, None if it reported none."""
    found = _DONE.findall(status)
    return int(found[-1]) if found else None


def command_string(cmd: str | Sequence[str]) -> str:
    """``cmd`` as one shell string (an argv list is shell-quoted, so it is not re-split)."""
    if isinstance(cmd, str):
        return cmd
    return shlex.join([str(c) for c in cmd])


# The kernel takes no single argument over MAX_ARG_STRLEN (32 pages, 131,072 bytes with its NUL), and the command
# is one argument of ``sh -c`` in every backend: past it bwrap cannot start and docker's exec fails with no output.
MAX_COMMAND_BYTES = 131_071
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class BadCommand(ValueError):
    """An exec's command, env, cwd or output limit, or a file operation's path, that no sandbox can take as given:
    the caller's input, not the sandbox's failure (the sandbox is untouched and stays usable)."""


def check_text(s: str, what: str) -> None:
    """BadCommand unless ``s`` can be a process argument: no NUL byte, no lone surrogate."""
    if "\x00" in s:
        raise BadCommand(f"{what} holds a NUL byte, which no process argument or environment can carry")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise BadCommand(f"{what} holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not Unicode text") from None


def check_exec(cmd: str | Sequence[str], timeout: float, cwd: str | None, env: Mapping[str, str] | None,
               output_limit: int | None) -> str:
    """The command as one shell string, once every argument of an exec is one a sandbox can run (the same answer
    from every backend); else :class:`BadCommand` (or ValueError for the timeout) naming what is wrong."""
    check_timeout(timeout)
    text = command_string(cmd)
    check_text(text, "the command")
    if (n := len(text.encode())) > MAX_COMMAND_BYTES:
        raise BadCommand(f"the command is {n:,} bytes; one command may be at most {MAX_COMMAND_BYTES:,} (the "
                         f"kernel's limit on one argument): send long content in parts, or with write_file")
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise BadCommand(f"env name {k!r} is not a variable name (letters, digits and _, not first a digit)")
        if not isinstance(v, str):
            raise BadCommand(f"env {k}: the value must be a string, got {type(v).__name__}")
        check_text(v, f"env {k}")
    if cwd is not None:
        check_text(cwd, "cwd")
    if output_limit is not None and not (isinstance(output_limit, int) and output_limit >= 1):
        raise BadCommand(f"output_limit must be a positive number of bytes, got {output_limit!r}")
    return text


def check_timeout(timeout: float) -> float:
    if not (timeout > 0):
        raise ValueError(f"exec timeout must be > 0 seconds, got {timeout!r}")
    return float(timeout)


def wrap_command(cmd: str | Sequence[str], marker: str, flags: str = "") -> list[str]:
    """The argv that runs ``cmd`` under :data:`EXEC_WRAPPER`."""
    return ["sh", "-c", EXEC_WRAPPER, "sh", marker, flags or "-", command_string(cmd)]


def watchdog_command(cmd: str | Sequence[str], timeout: float, marker: str) -> list[str]:
    """The argv that runs ``cmd`` under :data:`WATCHDOG_WRAPPER` (the in-sandbox timeout of the fallback)."""
    return ["sh", "-c", WATCHDOG_WRAPPER, "sh", marker, f"{check_timeout(timeout):.3f}", command_string(cmd)]


