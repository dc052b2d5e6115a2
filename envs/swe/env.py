"""``agentrl/SWE-v0``: fix a bug in a repository inside a sandbox, graded by the instance's tests.

Episode: ``reset`` picks an instance (``options={"instance_id": ...}`` or ``{"index": i}``, else one drawn with
``self.np_random``), starts a fresh sandbox, uploads the repository at ``base_commit`` into the work dir and returns
a system message (the tools and the call format) and a user message (the issue). Each ``step`` takes the model's
text, runs every ``<tool_call>`` in it in order (see :mod:`agentrl.tools` for the format) and returns one ``tool``
message per call:

- ``bash(command, timeout?)``: a shell command in the repository root; output capped (head and tail kept), exit
  code shown, killed after its timeout.
- ``view(path, start_line?, end_line?)``: a file with line numbers (a range optional), or a directory listing.
- ``str_replace(path, old_str, new_str)``: replaces the one occurrence of ``old_str``; an error if there are none
  or several.
- ``create(path, file_text)``: creates a new file (an error if it exists; parents are created).
- ``submit()``: ends the episode. Calls after it in the same message are ignored.

On submit the patch is ``git add -A && git diff --cached --binary <base_commit>`` (new files included), the episode
sandbox is stopped and the patch is graded in a fresh sandbox (:func:`agentrl.envs.swe.grader.grade`).
Reward: 1.0 if resolved else 0.0; with ``partial_credit=True`` an unresolved patch that keeps every PASS_TO_PASS
test passing earns the fraction of FAIL_TO_PASS tests that pass. Every other step has reward 0.

Limits: ``max_turns`` (steps), ``max_time_s`` (wall time since reset) and ``max_episode_output_chars`` (total tool
output). When one is reached the episode is *truncated* and the current diff is graded exactly as on submit, so
the final step's reward and info have the same meaning either way. The final step's info holds ``patch``,
``resolved``, ``grade`` (:meth:`GradeResult.to_dict`) and ``exit_reason`` (``submitted``, ``max_turns``,
``time_limit``, ``output_limit`` or ``sandbox_error``).

Invalid actions (no tool call, malformed JSON, unknown tool, bad arguments, a missing file) give an observation
that says what was wrong, reward 0, and the episode goes on; ``info["invalid_calls"]`` counts them. If the episode
sandbox dies (e.g. the agent killed its processes) the episode ends as truncated with reward 0 and
``exit_reason="sandbox_error"``. Failures to start a sandbox or to grade raise ``SandboxError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from agentrl.core import Env, Message, Observation, StepResult
from agentrl.tools import Tool, ToolCall, format_tool_call, parse_tool_calls

from .grader import SANDBOX_ENV, GradeResult, SandboxFactory, grade, make_sandbox
from .instances import SWEInstance, load_instances
from .repos import SUITE_INSTANCES, RepoStore

PATCH_FILE = "/tmp/agentrl-submission.patch"


@dataclass
class SWEEnvConfig:
    """The env's settings (all are also constructor keywords of :class:`SWEEnv`).

    instances: JSONL file of SWE-bench-format instances (default: the shipped offline suite).
    instance_ids: restrict to these ids (file order kept).
    repos_dir: where repositories live (see :class:`agentrl.envs.swe.repos.RepoStore`; default: the suite's).
    cache_dir: where working copies are built (default ``~/.cache/agentrl/swe``).
    sandbox: ``SandboxSpec`` fields (``backend``: ``docker``, ``bwrap`` or ``auto`` = docker if reachable, else
        bwrap; ``image``, ``memory_mb``...). The same spec is used for the episode and the grading sandboxes.
    max_turns / max_time_s / max_episode_output_chars: episode bounds (truncation, then grading).
    command_timeout_s: default and maximum timeout of one ``bash`` call.
    max_output_chars: cap on one tool observation (head and tail kept).
    grade_timeout_s / per_test_timeout_s: test-run bounds while grading.
    partial_credit: reward the FAIL_TO_PASS fraction of unresolved patches that break no PASS_TO_PASS test.
    """

    instances: str | None = None
    instance_ids: list[str] | None = None
    repos_dir: str | None = None
    cache_dir: str | None = None
    sandbox: Any = None  # a dict of SandboxSpec fields, or a SandboxSpec
    max_turns: int = 30
    max_time_s: float = 1800.0
    max_episode_output_chars: int = 400_000
    command_timeout_s: float = 120.0
    max_output_chars: int = 10_000
    grade_timeout_s: float = 900.0
    per_test_timeout_s: float = 120.0
    partial_credit: bool = False

    def validate(self) -> None:
        for name in ("max_turns", "max_episode_output_chars", "max_output_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("max_time_s", "command_timeout_s", "grade_timeout_s", "per_test_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


SYSTEM_PROMPT = """You are a software engineer fixing an issue in a Python repository. The repository is checked out \
in the current directory ({workdir}); commands run there. Tests use unittest: \
`python3 -m unittest tests.test_module.TestClass.test_name` (pytest is not installed). There is no network.

Call tools by writing a JSON object inside <tool_call></tool_call> tags, for example:
{example}
You may make several calls in one message; they run in order. Tools:
{tools}
Make the smallest change that resolves the issue, check it by running the tests, then call submit. Your changes \
are taken as `git diff` against the original commit; do not edit the existing tests."""


def _cap(text: str, limit: int) -> str:
    """Returns ``text`` with at most ``limit`` characters: its head and tail around a marker."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters truncated ...]\n{text[-tail:]}"


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, first))


def _tools() -> dict[str, Tool]:
    # fn is unused: the env dispatches to its own async methods; Tool gives the schema and the validation.
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


def _sandbox_spec(sandbox: Any) -> Any:
    from agentrl.sandboxes.base import SandboxSpec

    if isinstance(sandbox, SandboxSpec):
        return sandbox
    opts = dict(sandbox or {})
    known = {f.name for f in fields(SandboxSpec)}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ValueError(f"sandbox: unknown field(s) {unknown}; SandboxSpec fields are {sorted(known)}")
    if opts.get("backend", "docker") == "auto":
        from agentrl.sandboxes.docker import docker_available

        opts["backend"] = "docker" if docker_available()[0] else "bwrap"
    return SandboxSpec(**opts)


class SWEEnv(Env):
    """Fix a GitHub-style issue in a sandboxed repository; reward 1 if the instance's tests then pass.

    ``SWEEnv(instances=None, *, sandbox_factory=None, pool=None, repo_store=None, **SWEEnvConfig fields)``:
    ``instances`` is a JSONL path or a list of :class:`SWEInstance` (default: the shipped suite);
    ``pool`` an ``agentrl.sandboxes.SandboxPool`` to take sandboxes from (else each is created and destroyed);
    ``sandbox_factory`` any ``spec -> async context manager yielding a started sandbox``. ``self.instances`` lists
    the instances in file order (``reset(options={"instance_id": ...})`` picks one). See the module doc.
    """

    description = "SWE-bench-style bug fixing in a docker/bwrap sandbox (offline suite of 13 repos by default)"

    def __init__(
        self,
        instances: str | Path | Iterable[SWEInstance] | None = None,
        *,
        sandbox_factory: SandboxFactory | None = None,
        pool: Any = None,
        repo_store: RepoStore | None = None,
        **config: Any,
    ):
        super().__init__()
        if instances is not None and not isinstance(instances, (str, Path)):
            self.instances: list[SWEInstance] = list(instances)
            config_instances = None
        else:
            config_instances = str(instances) if instances is not None else None
        unknown = sorted(set(config) - {f.name for f in fields(SWEEnvConfig)})
        if unknown:
            raise ValueError(f"SWEEnv: unknown option(s) {unknown}; see SWEEnvConfig")
        self.config = SWEEnvConfig(instances=config_instances, **config)
        self.config.validate()
        if instances is None or isinstance(instances, (str, Path)):
            self.instances = load_instances(self.config.instances or SUITE_INSTANCES, self.config.instance_ids)
        elif self.config.instance_ids is not None:
            keep = set(self.config.instance_ids)
            self.instances = [i for i in self.instances if i.instance_id in keep]
        if not self.instances:
            raise ValueError("SWEEnv: no instances")
        self._by_id = {i.instance_id: i for i in self.instances}
        self.spec_sandbox = _sandbox_spec(self.config.sandbox)
        self.repo_store = repo_store or RepoStore(self.config.repos_dir, self.config.cache_dir)
        if sandbox_factory is not None and pool is not None:
            raise ValueError("SWEEnv: give sandbox_factory or pool, not both")
        self.sandbox_factory = sandbox_factory or (pool.acquire if pool is not None else make_sandbox)
        self.tools = _tools()
        self.instance: SWEInstance | None = None
        self._sb: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self._turns = 0
        self._t0 = time.monotonic()
        self._output_chars = 0
        self._done = False
        self._invalid = 0

    # ---------------------------------------------------------------------------------------------- episode
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools in OpenAI function format (for chat templates that take ``tools``)."""
        return [t.schema() for t in self.tools.values()]

    def _pick(self, seed: int | None, options: Mapping[str, Any] | None) -> SWEInstance:
        options = options or {}
        if "instance_id" in options:
            iid = options["instance_id"]
            if iid not in self._by_id:
                raise ValueError(f"SWEEnv.reset: unknown instance_id {iid!r}")
            return self._by_id[iid]
        if "index" in options:
            return self.instances[int(options["index"]) % len(self.instances)]
        return self.instances[int(self.np_random.integers(len(self.instances)))]

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Starts an episode on a fresh sandbox; returns ``([system, user], info)`` with ``info`` holding
        ``instance_id``, ``repo``, ``base_commit`` and ``tools`` (the schemas)."""
        super().reset(seed=seed)  # seeds self.np_random
        await self._release()
        inst = self._pick(seed, options)
        self.instance = inst
        local = await asyncio.to_thread(self.repo_store.checkout, inst.repo, inst.base_commit)
        self._stack = contextlib.AsyncExitStack()
        sb = await self._stack.enter_async_context(self.sandbox_factory(self.spec_sandbox))
        self._sb = sb
        await sb.upload(local, self.spec_sandbox.workdir)
        self._reset_state()
        tools = "\n".join(
            f"- {t.name}({', '.join(t.parameters['properties'])}): {t.description}" for t in self.tools.values()
        )
        system = SYSTEM_PROMPT.format(
            workdir=self.spec_sandbox.workdir,
            example=format_tool_call("bash", {"command": "python3 -m unittest discover -s tests -t ."}),
            tools=tools,
        )
        user = f"Repository: {inst.repo}\nInstance: {inst.instance_id}\n\n<issue>\n{inst.problem_statement.strip()}\n</issue>"
        info = {"instance_id": inst.instance_id, "repo": inst.repo, "base_commit": inst.base_commit, "tools": self.tool_schemas()}
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], info

    async def astep(self, action: str) -> StepResult:
        """Runs the tool calls in ``action``; see the module doc for observations, rewards and termination."""
        if self.instance is None or self._sb is None or self._done:
            msg = "the episode is over; call reset" if self._done else "call reset before step"
            return [{"role": "user", "content": f"error: {msg}"}], 0.0, True, False, {"error": msg}
        self._turns += 1
        info: dict[str, Any] = {"instance_id": self.instance.instance_id, "turn": self._turns}
        msgs: list[Message] = []
        parsed = parse_tool_calls(action if isinstance(action, str) else "")
        invalid = len(parsed.errors)
        if parsed.errors:
            msgs.append({"role": "user", "content": "Invalid tool call(s):\n" + "\n".join(f"- {e}" for e in parsed.errors)})
        elif not parsed.calls:
            invalid += 1
            msgs.append({"role": "user", "content": "No tool call found. Call a tool like this:\n"
                         + format_tool_call("view", {"path": "."}) + "\nand call submit() when your fix is done."})
        submitted = False
        from agentrl.sandboxes.base import SandboxError

        try:
            for call in parsed.calls:
                if call.name == "submit" and not call.arguments:
                    submitted = True
                    break
                ok, text = await self._call(call)
                invalid += not ok
                text = _cap(text, self.config.max_output_chars)
                self._output_chars += len(text)
                msgs.append({"role": "tool", "name": call.name, "content": text})
        except SandboxError as e:
            self._invalid += invalid
            info["invalid_calls"] = invalid
            return await self._finish(msgs, info, "sandbox_error", error=str(e))
        self._invalid += invalid
        info["invalid_calls"] = invalid
        if submitted:
            return await self._finish(msgs, info, "submitted")
        if self._turns >= self.config.max_turns:
            return await self._finish(msgs, info, "max_turns")
        if time.monotonic() - self._t0 >= self.config.max_time_s:
            return await self._finish(msgs, info, "time_limit")
        if self._output_chars >= self.config.max_episode_output_chars:
            return await self._finish(msgs, info, "output_limit")
        return msgs, 0.0, False, False, info

    async def _finish(self, msgs: list[Message], info: dict[str, Any], exit_reason: str, error: str | None = None) -> StepResult:
        """Ends the episode: takes the diff, releases the episode sandbox, grades in a fresh one."""
        assert self.instance is not None
        self._done = True
        info.update(exit_reason=exit_reason, turns=self._turns, invalid_calls_total=self._invalid,
                    episode_time_s=time.monotonic() - self._t0)
        if error is not None:
            await self._release()
            info.update(error=error, patch="", resolved=False, grade=None)
            msgs.append({"role": "user", "content": f"The sandbox failed: {error}. The episode ends."})
            return msgs, 0.0, False, True, info
        patch = await self._diff()
        await self._release()
        result: GradeResult = await grade(
            self.instance, patch, spec=self.spec_sandbox, repo_store=self.repo_store,
            sandbox_factory=self.sandbox_factory, timeout_s=self.config.grade_timeout_s,
            per_test_timeout_s=self.config.per_test_timeout_s,
        )
        reward = 1.0 if result.resolved else 0.0
        if not result.resolved and self.config.partial_credit and result.pass_to_pass_ok:
            reward = result.fail_to_pass_fraction
        info.update(patch=patch, resolved=result.resolved, grade=result.to_dict())
        note = "Patch submitted." if exit_reason == "submitted" else f"Episode limit reached ({exit_reason}); the current changes were submitted."
        if exit_reason == "submitted":
            msgs.append({"role": "tool", "name": "submit", "content": note})
        else:
            msgs.append({"role": "user", "content": note})
        return msgs, reward, exit_reason == "submitted", exit_reason != "submitted", info

    async def _diff(self) -> str:
        """The episode's changes against base_commit, new files included (from the live episode sandbox)."""
        assert self.instance is not None and self._sb is not None
        from agentrl.sandboxes.base import SandboxError

        base = shlex.quote(self.instance.base_commit)
        try:
            res = await self._sb.exec(
                f"git add -A && git diff --cached --binary {base} > {PATCH_FILE}", timeout=120, env=SANDBOX_ENV
            )
            if not res.ok:
                return ""
            return (await self._sb.read_file(PATCH_FILE)).decode("utf-8", errors="replace")
        except SandboxError:
            return ""

    async def aclose(self) -> None:
        """Stops the episode sandbox if one is alive; safe to call twice."""
        await self._release()

    async def _release(self) -> None:
        stack, self._stack, self._sb = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    # ------------------------------------------------------------------------------------------------ tools
    async def _call(self, call: ToolCall) -> tuple[bool, str]:
        """Runs one tool call; returns ``(ok, observation)``. Raises SandboxError only if the sandbox is dead."""
        tool = self.tools.get(call.name)
        if tool is None:
            return False, f"error: unknown tool {call.name!r}; available tools: {', '.join(self.tools)}"
        problem = tool.validate(call.arguments)
        if problem:
            return False, f"error: {problem}"
        if call.name == "submit":
            return False, "error: submit takes no arguments"
        return await getattr(self, f"_tool_{call.name}")(**call.arguments)

    async def _exec(self, cmd: str, timeout: float | None = None) -> Any:
        remaining = self.config.max_time_s - (time.monotonic() - self._t0)
        limit = min(timeout or self.config.command_timeout_s, self.config.command_timeout_s, max(1.0, remaining))
        return await self._sb.exec(cmd, timeout=limit, env=SANDBOX_ENV, output_limit=self.config.max_output_chars * 4)

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec_sandbox.workdir.rstrip('/')}/{path}"

    async def _kind(self, path: str) -> str:
        q = shlex.quote(self._path(path))
        res = await self._exec(f"if [ -d {q} ]; then echo dir; elif [ -f {q} ]; then echo file; "
                               f"elif [ -e {q} ]; then echo other; else echo missing; fi", timeout=30)
        return res.output.strip() or "missing"

    async def _read_text(self, path: str) -> tuple[str | None, str]:
        """Returns ``(text, "")`` or ``(None, error)`` for a missing, non-regular or non-UTF-8 file."""
        kind = await self._kind(path)
        if kind != "file":
            what = {"dir": "is a directory", "missing": "does not exist", "other": "is not a regular file"}.get(kind, kind)
            return None, f"error: {path} {what}"
        data = await self._sb.read_file(self._path(path))
        try:
            return data.decode("utf-8"), ""
        except UnicodeDecodeError:
            return None, f"error: {path} is not UTF-8 text"

    async def _tool_bash(self, command: str, timeout: int | None = None) -> tuple[bool, str]:
        if not command.strip():
            return False, "error: bash: empty command"
        if timeout is not None and timeout <= 0:
            return False, "error: bash: timeout must be a positive number of seconds"
        res = await self._exec(command, timeout)
        out = res.output
        tail = f"[exit code: {res.exit_code}]"
        if res.timed_out:
            tail = f"[timed out: the command was killed after its timeout] {tail}"
        if res.truncated:
            tail = f"[output truncated] {tail}"
        return True, (out.rstrip("\n") + "\n" + tail) if out.strip() else tail

    async def _tool_view(self, path: str, start_line: int | None = None, end_line: int | None = None) -> tuple[bool, str]:
        kind = await self._kind(path)
        if kind == "dir":
            q = shlex.quote(self._path(path))
            res = await self._exec(f"find {q} -maxdepth 2 -not -path '*/.git' -not -path '*/.git/*' "
                                   "-not -path '*/__pycache__*' | sort | head -500", timeout=30)
            return True, res.output
        text, err = await self._read_text(path)
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
        return True, _numbered(lines[start - 1 : end], start)

    async def _tool_str_replace(self, path: str, old_str: str, new_str: str) -> tuple[bool, str]:
        if not old_str:
            return False, "error: str_replace: old_str must not be empty"
        text, err = await self._read_text(path)
        if text is None:
            return False, err
        count = text.count(old_str)
        if count == 0:
            return False, f"error: str_replace: old_str not found in {path} (it must match exactly, whitespace included)"
        if count > 1:
            starts = [m.start() for m in re.finditer(re.escape(old_str), text)]
            lines = ", ".join(str(text.count("\n", 0, s) + 1) for s in starts[:10])
            return False, f"error: str_replace: old_str occurs {count} times in {path} (lines {lines}); include more context to make it unique"
        mode = await self._exec(f"stat -c %a {shlex.quote(self._path(path))}", timeout=30)
        perm = int(mode.output.strip(), 8) if re.fullmatch(r"[0-7]{3,4}", mode.output.strip()) else 0o644
        at = text.index(old_str)
        new_text = text[:at] + new_str + text[at + len(old_str):]
        await self._sb.write_file(self._path(path), new_text, mode=perm)
        first = text.count("\n", 0, at) + 1
        lines = new_text.split("\n")
        lo, hi = max(1, first - 3), min(len(lines), first + new_str.count("\n") + 3)
        return True, f"Edited {path}. Lines {lo}-{hi} now read:\n" + _numbered(lines[lo - 1 : hi], lo)

    async def _tool_create(self, path: str, file_text: str) -> tuple[bool, str]:
        if not path.strip() or path.endswith("/"):
            return False, f"error: create: invalid path {path!r}"
        kind = await self._kind(path)
        if kind != "missing":
            return False, f"error: create: {path} already exists; use str_replace to edit it"
        await self._sb.write_file(self._path(path), file_text)
        return True, f"Created {path} ({len(file_text.splitlines())} lines)."

    # --------------------------------------------------------------------------------------- sync wrappers
    def _run(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("SWEEnv: use areset/astep/aclose inside an event loop")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Blocking :meth:`areset` (runs a private event loop; not for use inside one)."""
        return self._run(self.areset(seed=seed, options=options))

    def step(self, action: str) -> StepResult:
        """Blocking :meth:`astep`."""
        return self._run(self.astep(action))

    def close(self) -> None:
        """Blocking :meth:`aclose`; also closes the private event loop."""
        if self._stack is not None:
            self._run(self.aclose())
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()


# -------------------------------------------------------------------------------------------- scripted policies
_INSTANCE_RE = re.compile(r"^Instance: (\S+)", re.MULTILINE)


def _instance_id(conversation: list[Message], meta: Any) -> str | None:
    task = getattr(meta, "task", None)
    if isinstance(task, str):
        return task
    if isinstance(task, Mapping) and isinstance(task.get("instance_id"), str):
        return task["instance_id"]
    for m in conversation:
        if m.get("role") == "user":
            found = _INSTANCE_RE.search(m.get("content", ""))
            if found:
                return found.group(1)
    return None


def oracle_policy_fn(instances: Iterable[SWEInstance]):
    """Returns ``fn(conversation, meta) -> str`` for :class:`agentrl.policy.ScriptedPolicy` that applies the gold
    patch through the tools: turn 1 ``create``s it as /tmp/agentrl-gold.patch, turn 2 runs ``git apply`` with
    ``bash``, turn 3 ``submit``s. The instance comes from ``meta.task`` (an id or a dict with ``instance_id``) or
    from the ``Instance:`` line of the env's first user message."""
    by_id = {i.instance_id: i for i in instances}

    def fn(conversation: list[Message], meta: Any) -> str:
        turn = sum(m.get("role") == "assistant" for m in conversation)
        iid = _instance_id(conversation, meta)
        if iid not in by_id:
            return format_tool_call("submit", {})
        if turn == 0:
            return "I will apply the fix.\n" + format_tool_call("create", {"path": "/tmp/agentrl-gold.patch", "file_text": by_id[iid].patch})
        if turn == 1:
            return format_tool_call("bash", {"command": "git apply /tmp/agentrl-gold.patch && git status --short"})
        return format_tool_call("submit", {})

    return fn


def empty_policy_fn(conversation: list[Message], meta: Any) -> str:
    """A ``ScriptedPolicy`` function that submits at once (an empty patch)."""
    return format_tool_call("submit", {})
