"""Any MCP server's tools as a multi-turn tool env: ``agentrl.make("mcp/Tools-v0", server=..., tasks=...)``.

Flow: ``reset(seed)`` starts the server on first use (a stdio command, or a streamable HTTP ``url``), lists its
tools and shows task ``seed % len(tasks)`` of the task file; the tool schemas go to ``info["tools"]`` (the agent loop
passes them to the model's chat template) and the system prompt names them. Each ``step`` runs the message's tool
calls (the :mod:`agentrl.tools` format) through the MCP client and returns one tool message per call, until the
message holds ``<answer>...</answer>``: the checker scores it and the episode terminates.

Task file (JSONL, one task a line): ``prompt`` (the user message) or ``messages`` (opening messages), and what the
checker needs: ``answer`` for the ``exact`` checker, ``check_arguments`` for an ``mcp:TOOL`` checker, anything for a
Python checker; optional ``id`` and ``actions`` (a scripted demonstration: the assistant messages that solve it,
played by :meth:`MCPToolEnv.solve` and :meth:`MCPToolEnv.oracle_policy`).

Checkers: ``"exact"`` (default: the answer equals ``task["answer"]``, numbers by value, words case-insensitively),
``"module:function"`` (``function(task, answer, conversation) -> float``, the episode's messages so far), or ``"mcp:TOOL"`` (a final call of the
server's ``TOOL`` with ``check_arguments`` and ``answer``; its text read as the reward; ``TOOL`` is hidden from the
model and refused if called).

Invariants: a tool's own error is an observation (``error: ...``), the episode goes on; a server that does not start,
times out, exits or breaks the protocol raises :class:`~agentrl.envs.bridges.mcp_client.MCPServerError` (a failed
episode in the manager, with that message), and the server process is ended. ``task_key(seed)`` (also ``info["task_key"]`` of
``reset``) is ``mcp/<task file stem>:<sha256 of the opening messages>``, computed without a server.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import os
import sys
import weakref
from pathlib import Path
from typing import Any, Callable

from agentrl.core import Env, Message, StepResult, run_sync
from agentrl.envs.bridges.mcp_client import MCPConnection, MCPServerError, ToolSpec
from agentrl.envs.calc import parse_number
from agentrl.envs.utils import cap_text, extract_answer, preview
from agentrl.tools import parse_tool_calls

DEMO_TASKS = Path(__file__).parent / "data" / "mcp_demo_tasks.jsonl"
DEMO_SERVER = Path(__file__).parent / "mcp_demo_server.py"  # run as a file: it imports only the mcp SDK

log = logging.getLogger(__name__)
_WARNED: set[tuple[str, ...]] = set()
SYSTEM_PROMPT = (
    "Solve the task with the tools. Call a tool as <tool_call>{{\"name\": TOOL, \"arguments\": {{...}}}}</tool_call> "
    "and give the final answer as <answer>...</answer>. Tools: {tools}."
)


def load_tasks(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Reads a JSONL task file; raises ``ValueError`` naming the file and line of a bad task."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except JSON_ERRORS as e:
                raise ValueError(f"{path}:{n}: not JSON ({json_error(e)})") from None
            if not isinstance(task, dict) or not (isinstance(task.get("prompt"), str) or isinstance(task.get("messages"), list)):
                raise ValueError(f"{path}:{n}: a task needs a 'prompt' string or a 'messages' list")
            tasks.append(task)
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


def exact_checker(task: dict[str, Any], answer: str, conversation: list[Message]) -> float:
    """1.0 if ``answer`` equals ``task["answer"]`` (numbers by value, text case-insensitively), else 0.0."""
    if "answer" not in task:
        raise ValueError("the exact checker needs an 'answer' in every task")
    want, got = str(task["answer"]).strip(), answer.strip(" .!\"'`")
    if parse_number(want) is not None:
        return float(parse_number(got) == parse_number(want))
    return float(got.lower() == want.lower())


class MCPToolEnv(Env):
    """The tools of one MCP server; tasks from a JSONL file; the reward from a checker (see the module docstring).

    kwargs: ``server`` (a stdio command: a list, or a string split on spaces; default: the bundled demo server
    written with the ``mcp`` SDK), ``url`` (a streamable HTTP server instead), ``server_env`` (extra environment
    variables of a stdio server), ``tasks`` (JSONL path; default the demo tasks), ``checker``, ``tools`` (names to
    expose; default all but the checker's), ``max_calls_per_turn`` (4), ``invalid_reward`` (0.0, the reward of a
    step with an invalid action), ``start_timeout_s`` (30), ``call_timeout_s`` (30), ``sandbox`` (``"bwrap"``: the
    stdio server runs in a bubblewrap sandbox, :mod:`agentrl.envs.bridges.mcp_sandbox`; default none),
    ``sandbox_binds`` (more host paths it may read), ``sandbox_network`` (False), ``max_output_chars`` (16,384: a
    tool's answer past it keeps its head and tail around a marker).
    """

    description = "MCP server's tools as a multi-turn tool env (kwargs server= or url=, tasks=, checker=)"

    def __init__(self, server: list[str] | str | None = None, url: str | None = None,
                 server_env: dict[str, str] | None = None, tasks: str | None = None, checker: str | Callable = "exact",
                 tools: list[str] | None = None, max_calls_per_turn: int = 4, invalid_reward: float = 0.0,
                 start_timeout_s: float = 30.0, call_timeout_s: float = 30.0, sandbox: str | None = None,
                 sandbox_binds: list[str] | None = None, sandbox_network: bool = False,
                 max_output_chars: int = 16_384):
        super().__init__()
        if sandbox not in (None, "bwrap"):
            raise ValueError(f"MCPToolEnv: sandbox must be 'bwrap' or None, got {sandbox!r}")
        if sandbox is not None and url is not None:
            raise ValueError("MCPToolEnv: sandbox applies to a stdio server (server=), not to url=")
        if server is not None and url is not None:
            raise ValueError("MCPToolEnv: give server (a stdio command) or url (streamable HTTP), not both")
        if server is None and url is None:
            server = [sys.executable, str(DEMO_SERVER)]
        if isinstance(server, str):
            server = server.split()
        if server is not None and (not server or not all(isinstance(a, str) for a in server)):
            raise ValueError(f"MCPToolEnv: server must be a non-empty command (list of strings), got {server!r}")
        for name, value in (("start_timeout_s", start_timeout_s), ("call_timeout_s", call_timeout_s)):
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"MCPToolEnv: {name} must be in (0, 3600] seconds, got {value!r}")
        if not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ValueError(f"MCPToolEnv: max_calls_per_turn must be a positive int, got {max_calls_per_turn!r}")
        if not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise ValueError(f"MCPToolEnv: max_output_chars must be a positive int, got {max_output_chars!r}")
        self.max_output_chars = max_output_chars
        self.server, self.url = server, url
        self.server_env = dict(server_env) if server_env else None  # added to the SDK's minimal default environment
        self.sandbox, self.sandbox_binds, self.sandbox_network = sandbox, list(sandbox_binds or ()), bool(sandbox_network)
        self.tasks_path = Path(tasks) if tasks is not None else DEMO_TASKS
        self.tasks = load_tasks(self.tasks_path)
        self.checker_name = checker if isinstance(checker, str) else getattr(checker, "__name__", repr(checker))
        self.check_tool: str | None = None
        self.check_fn: Callable | None = None
        if callable(checker):
            self.check_fn = checker
        elif checker == "exact":
            self.check_fn = exact_checker
        elif isinstance(checker, str) and checker.startswith("mcp:") and len(checker) > 4:
            self.check_tool = checker[4:]
        elif isinstance(checker, str) and ":" in checker:
            module, _, attr = checker.partition(":")
            try:
                self.check_fn = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise ValueError(f"MCPToolEnv: cannot load checker {checker!r}: {e}") from e
        else:
            raise ValueError(f"MCPToolEnv: checker must be 'exact', 'module:function', 'mcp:TOOL' or a callable, got {checker!r}")
        self.tool_names = list(tools) if tools is not None else None
        self.max_calls_per_turn, self.invalid_reward = max_calls_per_turn, float(invalid_reward)
        self.start_timeout_s, self.call_timeout_s = float(start_timeout_s), float(call_timeout_s)
        self.conn: MCPConnection | None = None
        # Ends the server when the env is dropped unclosed (its connection's own thread keeps it alive otherwise,
        # until the process exits); holds the connection, never the env.
        self._finalizer: weakref.finalize | None = None
        self.tools: list[ToolSpec] = []
        self.index, self.task, self.current_key, self.done = 0, self.tasks[0], "", True
        self.history: list[Message] = []  # the episode so far, for checkers

    # -- the server -----------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        if self.conn is not None and not self.conn.dead:
            return
        self.close()
        command, env = self.server, self.server_env
        if self.sandbox == "bwrap" and command is not None:
            from agentrl.envs.bridges.mcp_sandbox import bwrap_command

            # bwrap clears the environment: the server's variables are set inside instead
            command, env = bwrap_command(command, binds=self.sandbox_binds, env=self.server_env,
                                         network=self.sandbox_network), None
        self.conn = MCPConnection(command=command, url=self.url, env=env,
                                  start_timeout_s=self.start_timeout_s, call_timeout_s=self.call_timeout_s)
        if command is not self.server:  # errors name the server, not the sandbox's launcher line
            self.conn.label = " ".join(self.server) + " (in bwrap)"  # type: ignore[arg-type]
        self._finalizer = weakref.finalize(self, self.conn.close)
        listed = self.conn.start()
        names = {t.name for t in listed}
        problem = None
        if self.check_tool is not None and self.check_tool not in names:
            problem = f"has no checker tool {self.check_tool!r} (tools: {sorted(names)})"
        missing = sorted(set(self.tool_names or ()) - names)
        if missing:
            problem = f"has no tool(s) {missing} (tools: {sorted(names)})"
        task_only = sorted(t.name for t in listed if t.task_only)
        named = sorted(set(task_only) & {self.check_tool, *(self.tool_names or ())})
        if named:
            problem = f"runs {named} only as a task (taskSupport 'required'), which this MCP client cannot call"
        if problem is not None:  # a server this env cannot use: end it now, not when the env is closed
            label = self.conn.label
            self.close()
            raise MCPServerError(f"MCP server {label!r} {problem}")
        self.tools = [t for t in listed if not t.task_only and t.name != self.check_tool
                      and (self.tool_names is None or t.name in self.tool_names)]
        if task_only and (self.conn.label, *task_only) not in _WARNED:  # once per server, not per episode
            _WARNED.add((self.conn.label, *task_only))
            log.warning("MCP server %r: %s not offered to the model: the server runs them only as tasks "
                        "(taskSupport 'required'), which this client cannot call", self.conn.label, task_only)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    @staticmethod
    def _opening(task: dict[str, Any]) -> list[Message]:
        return [{"role": "user", "content": task["prompt"]}] if "prompt" in task else [dict(m) for m in task["messages"]]

    def task_key(self, seed: int) -> str:
        """The content identity of task ``seed % len(tasks)``: the task file's name and its opening messages' hash
        (the env contract's ``task_key``; starts no server)."""
        opening = self._opening(self.tasks[seed % len(self.tasks)])
        return f"mcp/{self.tasks_path.stem}:{hashlib.sha256(json.dumps(opening, sort_keys=True).encode()).hexdigest()[:16]}"

    # -- gymnasium API --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Shows task ``seed % len(tasks)`` (drawn from ``self.np_random`` when ``seed`` is None)."""
        super().reset(seed=seed)
        self._connect()
        self.index = seed % len(self.tasks) if seed is not None else int(self.np_random.integers(len(self.tasks)))
        self.task, self.done = self.tasks[self.index], False
        listing = ", ".join(f"{t.name} ({preview(t.description, 80)})" if t.description else t.name for t in self.tools)
        opening = self._opening(self.task)
        obs = [{"role": "system", "content": SYSTEM_PROMPT.format(tools=listing or "none")}] + opening
        self.history = list(obs)
        self.current_key = self.task_key(self.index)
        return obs, {"tools": self.tool_schemas(), "task_key": self.current_key, "task_id": self.task.get("id", self.index)}

    def step(self, action: str) -> StepResult:
        """Runs the tool calls of ``action`` through the server, or scores its answer (then terminates)."""
        if self.done or self.conn is None:
            return [{"role": "user", "content": "The task is over. Call reset() for a new one."}], 0.0, True, False, {"invalid_action": True}
        text = str(action)
        self.history.append({"role": "assistant", "content": text})
        answer = extract_answer(text)
        if answer is not None:
            self.done = True
            reward = self._score(answer)
            msg = f"Answer received; score {reward:g}."
            return [{"role": "user", "content": msg}], reward, True, False, self._info(reward >= 1.0, False, 0)
        parsed = parse_tool_calls(text)
        if not parsed.calls and not parsed.errors:
            msg = (f"No tool call or answer in {preview(text)!r}. Call a tool with <tool_call>{{...}}</tool_call> "
                   "or answer with <answer>...</answer>.")
            self.history.append({"role": "user", "content": msg})
            return [{"role": "user", "content": msg}], self.invalid_reward, False, False, self._info(False, True, 0)
        out: list[Message] = []
        invalid = bool(parsed.errors)
        exposed = {t.name for t in self.tools}
        for i, call in enumerate(parsed.calls):
            if i >= self.max_calls_per_turn:
                out.append({"role": "tool", "name": call.name, "content": f"error: at most {self.max_calls_per_turn} calls per message"})
                invalid = True
                continue
            if call.name not in exposed:
                out.append({"role": "tool", "name": call.name,
                            "content": f"error: unknown tool {call.name!r}; available tools: {', '.join(sorted(exposed))}"})
                invalid = True
                continue
            is_error, result = self.conn.call(call.name, call.arguments)
            result = cap_text(result, self.max_output_chars)
            invalid |= is_error
            out.append({"role": "tool", "name": call.name, "content": f"error: {result}" if is_error else result})
        out.extend({"role": "tool", "content": f"error: {e}"} for e in parsed.errors)
        self.history.extend(out)
        return out, self.invalid_reward if invalid else 0.0, False, False, self._info(False, invalid, len(parsed.calls))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return await run_sync(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> StepResult:
        # Tool calls wait on the connection's own loop; the thread pool keeps them off the caller's loop.
        return await run_sync(self.step, action)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # closes the connection, once
            self._finalizer = None
        self.conn = None

    # -- scoring --------------------------------------------------------------------------------------------------
    def _score(self, answer: str) -> float:
        if self.check_tool is not None:
            args = {**dict(self.task.get("check_arguments") or {}), "answer": answer}
            is_error, result = self.conn.call(self.check_tool, args)  # type: ignore[union-attr]
            if is_error:
                raise MCPServerError(f"checker tool {self.check_tool!r} failed: {preview(result, 200)}")
            try:
                reward = float(result.strip())
            except ValueError:
                raise MCPServerError(f"checker tool {self.check_tool!r} returned {preview(result, 80)!r}, not a number") from None
        else:
            reward = float(self.check_fn(self.task, answer, list(self.history)))  # type: ignore[misc]
        if not math.isfinite(reward):
            raise ValueError(f"checker {self.checker_name!r} returned a non-finite reward {reward!r}")
        return reward

    def _info(self, correct: bool, invalid: bool, calls: int) -> dict[str, Any]:
        return {"correct": correct, "invalid_action": invalid, "tool_calls": calls, "task_key": self.current_key}

    # -- scripted demonstrations ---------------------------------------------------------------------------------
    def _demo_action(self, task: dict[str, Any], conversation: list[Message]) -> str:
        actions = task.get("actions")
        if not actions:
            raise LookupError(f"task {task.get('id', '?')!r} of {self.tasks_path} has no scripted 'actions'")
        turn = sum(1 for m in conversation if m.get("role") == "assistant")
        return str(actions[min(turn, len(actions) - 1)])

    def solve(self, conversation: list[Message]) -> str:
        """The current task's scripted action for this point of the conversation (its ``actions``)."""
        return self._demo_action(self.task, conversation)

    def oracle_policy(self) -> Any:
        """A :class:`agentrl.policy.ScriptedPolicy` playing each episode's task ``actions`` (the task from
        ``meta.seed``, for an env made with this env's task file)."""
        from agentrl.policy import ScriptedPolicy

        def act(conversation: list[Message], meta: Any) -> str:
            if meta.seed is None:
                raise ValueError("the MCP task oracle needs the episode's seed (meta.seed is None)")
            return self._demo_action(self.tasks[meta.seed % len(self.tasks)], conversation)

        return ScriptedPolicy(act)
