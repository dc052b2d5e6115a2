"""``agentrl/SWE-v0``: fix a bug in a repository inside a sandbox, graded by the instance's tests.

Episode: ``reset`` picks an instance (``options={"instance_id": ...}`` or ``{"index": i}``, else one drawn with
``self.np_random``), prepares its image once (:mod:`agentrl.envs.swe.images`: the repository at ``base_commit`` as a
single-commit repository, with no later history, plus its test environment), starts a fresh sandbox of it, copies
the repository into the work dir inside the sandbox (nothing is uploaded per episode) and returns a system message
(the tools, the call format, how to run the tests) and a user message (the issue). Each ``step`` takes the model's
text, runs every ``<tool_call>`` in it in order (see :mod:`agentrl.tools` for the format) and returns one ``tool``
message per call:

- ``bash(command, timeout?)``: a shell command in the repository root; output capped (head and tail kept), exit
  code shown, killed after its timeout.
- ``view(path, start_line?, end_line?)``: a file with line numbers (a range optional), or a directory listing;
  files over 2 MiB are refused with a hint (their size is checked in the sandbox before anything is read).
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
``resolved``, ``grade`` (:meth:`GradeResult.to_dict`), ``exit_reason`` (``submitted``, ``max_turns``,
``time_limit``, ``output_limit`` or ``sandbox_error``) and ``integrity``: the commands that read git history
(``git log``, ``reflog``, ``.git/objects``...), the test files and start-up hooks the patch touched (reverted by
the grader), and ``flagged`` when either is non-empty (``agentrl eval`` counts flagged episodes).

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
from agentrl.envs.utils import cap_text
from agentrl.tools import ToolCall, format_tool_call, parse_tool_calls

from . import runners
from .actions import SandboxTools, read_bounded, tool_set
from .envspec import EnvSpecs
from .grader import SANDBOX_ENV, GradeResult, SandboxFactory, grade, make_sandbox
from .images import ImageBuilder, Runtime, materialize
from .instances import SWEInstance, load_instances
from .repos import SUITE_INSTANCES, RepoStore

PATCH_FILE = "/tmp/agentrl-submission.patch"
#: A submitted diff larger than this is not read (the episode is graded with an empty patch, and info says why).
MAX_PATCH_BYTES = 16 << 20


@dataclass
class SWEEnvConfig:
    """The env's settings (all are also constructor keywords of :class:`SWEEnv`).

    instances: JSONL file of SWE-bench-format instances (default: the shipped offline suite).
    instance_ids: restrict to these ids (file order kept).
    repos_dir: where repositories live (see :class:`agentrl.envs.swe.repos.RepoStore`; default: the suite's).
    env_specs: YAML/JSON file of env specs per repository and version (see :mod:`agentrl.envs.swe.envspec`).
    cache_dir: where repository exports are built (default ``~/.cache/agentrl/swe``).
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
    env_specs: str | None = None
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
in the current directory ({workdir}); commands run there. {tests} There is no network.

Call tools by writing a JSON object inside <tool_call></tool_call> tags, for example:
{example}
You may make several calls in one message; they run in order. Tools:
{tools}
Make the smallest change that resolves the issue, check it by running the tests, then call submit. Your changes \
are taken as `git diff` against the original commit; changes to test files are discarded when grading."""


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
    ``sandbox_factory`` any ``spec -> async context manager yielding a started sandbox``; ``images`` an
    :class:`~agentrl.envs.swe.images.ImageBuilder` to share between envs (else one is made from the config).
    ``self.instances`` lists the instances in file order (``reset(options={"instance_id": ...})`` picks one).
    See the module doc.
    """

    description = "SWE-bench-style bug fixing in a docker/bwrap sandbox (offline suite of 13 repos by default)"
    #: ``agentrl eval`` writes one SWE-bench prediction per instance (an empty patch when the episode errored).
    writes_predictions = True

    def __init__(
        self,
        instances: str | Path | Iterable[SWEInstance] | None = None,
        *,
        sandbox_factory: SandboxFactory | None = None,
        pool: Any = None,
        repo_store: RepoStore | None = None,
        images: ImageBuilder | None = None,
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
        if images is not None:
            self.images = images
            self.repo_store = images.repo_store
        else:
            self.repo_store = repo_store or RepoStore(self.config.repos_dir, self.config.cache_dir)
            self.images = ImageBuilder(self.spec_sandbox, self.repo_store, EnvSpecs.load(self.config.env_specs))
        if sandbox_factory is not None and pool is not None:
            raise ValueError("SWEEnv: give sandbox_factory or pool, not both")
        self.sandbox_factory = sandbox_factory or (pool.acquire if pool is not None else make_sandbox)
        self.tools = tool_set()
        self.instance: SWEInstance | None = None
        self.runtime: Runtime | None = None
        self._actions: SandboxTools | None = None
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

    def task_key(self, seed: int) -> str:
        """The instance ``reset(seed=seed)`` picks (a draw from the seed: seeds collide), without a sandbox."""
        from gymnasium.utils import seeding

        rng, _ = seeding.np_random(seed)
        return self.instances[int(rng.integers(len(self.instances)))].instance_id

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
        rt = await asyncio.to_thread(self.images.prepare, inst)
        self.runtime = rt
        self._stack = contextlib.AsyncExitStack()
        sb = await self._stack.enter_async_context(self.sandbox_factory(rt.sandbox))
        self._sb = sb
        await materialize(sb, rt)
        self._actions = SandboxTools(sb, rt.sandbox.workdir, self._exec)
        self._reset_state()
        tools = "\n".join(
            f"- {t.name}({', '.join(t.parameters['properties'])}): {t.description}" for t in self.tools.values()
        )
        system = SYSTEM_PROMPT.format(
            workdir=rt.sandbox.workdir,
            tests=runners.describe(rt.runner, rt.python, rt.env_spec.pythonpath, inst.PASS_TO_PASS[0] if inst.PASS_TO_PASS else None),
            example=format_tool_call("bash", {"command": "git status --short"}),
            tools=tools,
        )
        user = f"Repository: {inst.repo}\nInstance: {inst.instance_id}\n\n<issue>\n{inst.problem_statement.strip()}\n</issue>"
        info = {"instance_id": inst.instance_id, "repo": inst.repo, "base_commit": rt.base_commit, "tools": self.tool_schemas()}
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
                text = cap_text(text, self.config.max_output_chars)
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
        history = list(self._actions.git_history) if self._actions is not None else []
        if error is not None:
            await self._release()
            info.update(error=error, patch="", resolved=False, grade=None,
                        integrity={"git_history": history, "protected_touched": [], "flagged": bool(history)})
            msgs.append({"role": "user", "content": f"The sandbox failed: {error}. The episode ends."})
            return msgs, 0.0, False, True, info
        patch, patch_error = await self._diff()
        await self._release()
        result: GradeResult = await grade(
            self.instance, patch, images=self.images, sandbox_factory=self.sandbox_factory,
            timeout_s=self.config.grade_timeout_s, per_test_timeout_s=self.config.per_test_timeout_s,
        )
        reward = 1.0 if result.resolved else 0.0
        if not result.resolved and self.config.partial_credit and result.pass_to_pass_ok:
            reward = result.fail_to_pass_fraction
        info.update(patch=patch, resolved=result.resolved, grade=result.to_dict(),
                    integrity={"git_history": history, "protected_touched": list(result.protected_touched),
                               "flagged": bool(history or result.protected_touched)})
        if patch_error:
            info["patch_error"] = patch_error
        note = "Patch submitted." if exit_reason == "submitted" else f"Episode limit reached ({exit_reason}); the current changes were submitted."
        if exit_reason == "submitted":
            msgs.append({"role": "tool", "name": "submit", "content": note})
        else:
            msgs.append({"role": "user", "content": note})
        return msgs, reward, exit_reason == "submitted", exit_reason != "submitted", info

    async def _diff(self) -> tuple[str, str]:
        """The episode's changes against base_commit, new files included (from the live episode sandbox), and why
        the patch is empty when it could not be taken (``""`` otherwise). A diff over :data:`MAX_PATCH_BYTES` is
        not read into the driver."""
        assert self.runtime is not None and self._sb is not None
        from agentrl.sandboxes.base import SandboxError

        base = shlex.quote(self.runtime.base_commit)
        p = shlex.quote(PATCH_FILE)
        try:
            res = await self._sb.exec(
                f"git add -A && git diff --cached --binary {base} > {p} && stat -c %s {p}", timeout=120,
                env=SANDBOX_ENV,
            )
            size = res.output.strip().splitlines()[-1:] if res.ok else []
            if not size or not size[0].isdigit():
                return "", f"git diff failed: {res.output[-500:]}"
            if int(size[0]) > MAX_PATCH_BYTES:
                return "", f"the diff is {size[0]} bytes, over the {MAX_PATCH_BYTES}-byte limit"
            data = await read_bounded(self._sb, PATCH_FILE, MAX_PATCH_BYTES)
            return data.decode("utf-8", errors="replace"), ""
        except SandboxError as e:
            return "", f"the sandbox failed while taking the diff: {e}"

    async def aclose(self) -> None:
        """Stops the episode sandbox if one is alive; safe to call twice."""
        await self._release()

    async def _release(self) -> None:
        stack, self._stack, self._sb, self._actions = self._stack, None, None, None
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
        assert self._actions is not None
        from agentrl.sandboxes import BadCommand

        try:
            return await getattr(self._actions, call.name)(**call.arguments)
        except BadCommand as e:  # e.g. a NUL byte in a path or command: the call's error, the sandbox is fine
            return False, f"error: {call.name}: {e}"

    async def _exec(self, cmd: str, timeout: float | None = None) -> Any:
        remaining = self.config.max_time_s - (time.monotonic() - self._t0)
        limit = min(timeout or self.config.command_timeout_s, self.config.command_timeout_s, max(1.0, remaining))
        env = {**SANDBOX_ENV, **(self.runtime.env if self.runtime is not None else {})}
        return await self._sb.exec(cmd, timeout=limit, env=env, output_limit=self.config.max_output_chars * 4)

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


class GoldPatchError(RuntimeError):
    """The oracle's gold patch does not apply at ``base_commit``: a broken instance, not a failed episode."""


GOLD_FAILED = "@@agentrl:gold-patch-does-not-apply"


def oracle_policy_fn(instances: Iterable[SWEInstance]):
    """Returns ``fn(conversation, meta) -> str`` for :class:`agentrl.policy.ScriptedPolicy` that applies the gold
    patch through the tools: turn 1 ``create``s it as /tmp/agentrl-gold.patch, turn 2 runs ``git apply`` with
    ``bash``, turn 3 ``submit``s. The instance comes from ``meta.task`` (an id or a dict with ``instance_id``) or
    from the ``Instance:`` line of the env's first user message. When the gold patch does not apply, turn 3 raises
    :class:`GoldPatchError` with git's message (the episode is an error that says so, not a test failure)."""
    by_id = {i.instance_id: i for i in instances}

    def fn(conversation: list[Message], meta: Any) -> str:
        turn = sum(m.get("role") == "assistant" for m in conversation)
        iid = _instance_id(conversation, meta)
        if iid not in by_id:
            return format_tool_call("submit", {})
        if turn == 0:
            return "I will apply the fix.\n" + format_tool_call("create", {"path": "/tmp/agentrl-gold.patch", "file_text": by_id[iid].patch})
        if turn == 1:
            return format_tool_call("bash", {"command": f"git apply /tmp/agentrl-gold.patch 2>&1 || echo {GOLD_FAILED}"})
        last = next((m.get("content", "") for m in reversed(conversation) if m.get("role") == "tool"), "")
        if GOLD_FAILED in last:
            raise GoldPatchError(f"{iid}: the gold patch does not apply at base_commit: {last.replace(GOLD_FAILED, '').strip()[:800]}")
        return format_tool_call("submit", {})

    return fn


def empty_policy_fn(conversation: list[Message], meta: Any) -> str:
    """A ``ScriptedPolicy`` function that submits at once (an empty patch)."""
    return format_tool_call("submit", {})
