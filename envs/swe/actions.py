"""The SWE env's tools, run against a live sandbox: ``bash``, ``view``, ``str_replace``, ``create``.

Every tool returns ``(ok, observation)``; a bad argument or a missing file is an observation (``ok=False``), never
an exception (only a dead sandbox raises ``SandboxError``). Reads are bounded: the size of a file is checked inside
the sandbox (``stat``) before any byte of it reaches the driver, and a file over :data:`MAX_READ_BYTES` is refused
with a message that says how to read part of it, so a huge (or sparse) file costs the driver nothing.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Awaitable, Callable

from agentrl.tools import Tool

#: The largest file ``view``/``str_replace`` read into the driver (source files are far smaller).
MAX_READ_BYTES = 2 << 20
#: Commands that read git history (for the integrity metric; the export holds no history past base_commit).
GIT_HISTORY_RE = re.compile(
    r"\bgit\b[^|;&\n]*\b(log|reflog|show|fsck|cat-file|rev-list|for-each-ref|show-ref|fetch|pull|clone|ls-remote|"
    r"unpack-objects|verify-pack|whatchanged|shortlog|blame|describe|count-objects|gc|prune|stash\s+list)\b"
    r"|\.git/(objects|refs|logs|packed-refs|shallow|FETCH_HEAD|ORIG_HEAD)"
)

Exec = Callable[..., Awaitable[Any]]


def numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, first))


def tool_set() -> dict[str, Tool]:
    """The tools' schemas (validation by :class:`agentrl.tools.Tool`; dispatch by :class:`SandboxTools`)."""
    def t(name: str, description: str, props: dict[str, Any], required: list[str]) -> Tool:
        return Tool(name, description, {"type": "object", "properties": props, "required": required}, fn=lambda **_: "")

    s = {"type": "string"}
    i = {"type": "integer"}
    return {
        "bash": t("bash", "Run a shell command in the repository root; returns its output and exit code.",
                  {"command": dict(s, description="the command"), "timeout": dict(i, description="seconds")}, ["command"]),
        "view": t("view", "Show a file with line numbers (optionally lines start_line..end_line), or list a directory.",
                  {"path": s, "start_line": i, "end_line": i}, ["path"]),
        "str_replace": t("str_replace", "Replace the single occurrence of old_str in a file by new_str.",
                         {"path": s, "old_str": s, "new_str": s}, ["path", "old_str", "new_str"]),
        "create": t("create", "Create a new file with the given content.", {"path": s, "file_text": s}, ["path", "file_text"]),
        "submit": t("submit", "Submit the current changes as the final patch; ends the episode.", {}, []),
    }


async def read_bounded(sb: Any, path: str, max_bytes: int) -> bytes:
    """Reads at most ``max_bytes`` of ``path`` (the sandbox's own bound when it has one, else ``head -c``)."""
    try:
        return await sb.read_file(path, max_bytes=max_bytes)
    except TypeError:  # a sandbox without the bound: cut inside the sandbox
        res = await sb.exec(["head", "-c", str(max_bytes), "--", path], timeout=60, output_limit=max_bytes + 1024)
        return res.output.encode("utf-8", errors="surrogateescape")


class SandboxTools:
    """The tools over one sandbox. ``exec(cmd, timeout=None)`` runs a command in the episode's environment."""

    def __init__(self, sb: Any, workdir: str, exec_fn: Exec):
        self.sb = sb
        self.workdir = workdir
        self.exec = exec_fn
        self.git_history: list[str] = []

    def path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    async def kind(self, path: str) -> tuple[str, int]:
        """``("dir"|"file"|"other"|"missing", size in bytes of a regular file)``, from inside the sandbox."""
        q = shlex.quote(self.path(path))
        res = await self.exec(f"if [ -d {q} ]; then echo dir; elif [ -f {q} ]; then echo file $(stat -L -c %s {q}); "
                              f"elif [ -e {q} ]; then echo other; else echo missing; fi", timeout=30)
        parts = (res.output.strip() or "missing").split()
        size = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        return parts[0], size

    async def read_text(self, path: str) -> tuple[str | None, str]:
        """Returns ``(text, "")`` or ``(None, error)`` for a missing, non-regular, too large or non-UTF-8 file."""
        kind, size = await self.kind(path)
        if kind != "file":
            what = {"dir": "is a directory", "missing": "does not exist", "other": "is not a regular file"}.get(kind, kind)
            return None, f"error: {path} {what}"
        if size > MAX_READ_BYTES:
            return None, (f"error: {path} is {size} bytes; view and str_replace read files up to {MAX_READ_BYTES} "
                          "bytes. Read parts of it with bash (head, sed -n 'A,Bp', grep -n) and edit it with bash.")
        data = await read_bounded(self.sb, self.path(path), MAX_READ_BYTES)
        try:
            return data.decode("utf-8"), ""
        except UnicodeDecodeError:
            return None, f"error: {path} is not UTF-8 text"

    async def bash(self, command: str, timeout: int | None = None) -> tuple[bool, str]:
        if not command.strip():
            return False, "error: bash: empty command"
        if timeout is not None and timeout <= 0:
            return False, "error: bash: timeout must be a positive number of seconds"
        if GIT_HISTORY_RE.search(command):
            self.git_history.append(command[:200])
        res = await self.exec(command, timeout)
        out = res.output
        tail = f"[exit code: {res.exit_code}]"
        if res.timed_out:
            tail = f"[timed out: the command was killed after its timeout] {tail}"
        if res.truncated:
            tail = f"[output truncated] {tail}"
        return True, (out.rstrip("\n") + "\n" + tail) if out.strip() else tail

    async def view(self, path: str, start_line: int | None = None, end_line: int | None = None) -> tuple[bool, str]:
        if path.rstrip("/").endswith(".git") or "/.git/" in f"/{path}/":
            self.git_history.append(f"view {path}"[:200])
        kind, _ = await self.kind(path)
        if kind == "dir":
            q = shlex.quote(self.path(path))
            res = await self.exec(f"find {q} -maxdepth 2 -not -path '*/.git' -not -path '*/.git/*' "
                                  "-not -path '*/__pycache__*' | sort | head -500", timeout=30)
            return True, res.output
        text, err = await self.read_text(path)
        if text is None:
            return False, err
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if not lines:
            return True, f"{path} is empty"
        start = start_line if start_line is not None else 1
        end = end_line if end_line is not None else len(lines)
        if end == -1:
            end = len(lines)
        if start < 1 or start > len(lines) or end < start:
            return False, f"error: view: invalid range [{start_line}, {end_line}] for {path} ({len(lines)} lines)"
        return True, numbered(lines[start - 1 : end], start)

    async def str_replace(self, path: str, old_str: str, new_str: str) -> tuple[bool, str]:
        if not old_str:
            return False, "error: str_replace: old_str must not be empty"
        text, err = await self.read_text(path)
        if text is None:
            return False, err
        count = text.count(old_str)
        if count == 0:
            return False, f"error: str_replace: old_str not found in {path} (it must match exactly, whitespace included)"
        if count > 1:
            starts = [m.start() for m in re.finditer(re.escape(old_str), text)]
            lines = ", ".join(str(text.count("\n", 0, s) + 1) for s in starts[:10])
            return False, f"error: str_replace: old_str occurs {count} times in {path} (lines {lines}); include more context to make it unique"
        mode = await self.exec(f"stat -c %a {shlex.quote(self.path(path))}", timeout=30)
        perm = int(mode.output.strip(), 8) if re.fullmatch(r"[0-7]{3,4}", mode.output.strip()) else 0o644
        at = text.index(old_str)
        new_text = text[:at] + new_str + text[at + len(old_str):]
        await self.sb.write_file(self.path(path), new_text, mode=perm)
        first = text.count("\n", 0, at) + 1
        lines = new_text.split("\n")
        lo, hi = max(1, first - 3), min(len(lines), first + new_str.count("\n") + 3)
        return True, f"Edited {path}. Lines {lo}-{hi} now read:\n" + numbered(lines[lo - 1 : hi], lo)

    async def create(self, path: str, file_text: str) -> tuple[bool, str]:
        if not path.strip() or path.endswith("/"):
            return False, f"error: create: invalid path {path!r}"
        kind, _ = await self.kind(path)
        if kind != "missing":
            return False, f"error: create: {path} already exists; use str_replace to edit it"
        await self.sb.write_file(self.path(path), file_text)
        return True, f"Created {path} ({len(file_text.splitlines())} lines)."
