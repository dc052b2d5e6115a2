"""A NeMo Gym tool + ``/verify`` resources server as an agentrl env:
``agentrl.make("nemo_gym/Tools-v0", url="http://HOST:PORT", tasks="rows.jsonl")``.

Most of the 145 resources servers in the nemo-gym 0.7.0 wheel are of this kind. Their wire is the one NeMo Gym's
simple agent speaks (``responses_api_agents/simple_agent/app.py``; the server side in
``nemo_gym/base_resources_server.py``), spoken here without importing nemo-gym (it needs Python >= 3.13 and pins
that cannot share agentrl's venv):

- A task row is ``{"responses_create_params": {"input": [...], "tools": [...]}, ...extra fields}``; each tool is a
  Responses-API function (``{"type": "function", "name", "description", "parameters", "strict"}``); the extra fields
  are what the server's ``/seed_session`` and ``/verify`` read (an expected answer, an initial state).
- ``POST /seed_session`` with the row opens the episode; the server's session middleware answers with a cookie (a
  fresh cookie jar per episode), and every later request carries it, so per-episode state lives on the server.
- A tool call is ``POST /<tool name>`` with the call's JSON arguments; whatever the server answers, an HTTP error
  status included (FastAPI's 422 for arguments outside the tool's schema), is the tool's output the model sees.
- ``POST /verify`` with the row plus ``"response"``, an OpenAI Responses object whose ``output`` is the whole
  episode after the input (per turn: the assistant ``message``, then a ``function_call`` per call, then a
  ``function_call_output`` per call, the shape NeMo Gym's vLLM model server and simple agent build), answers the
  row, ``reward`` and the server's own verdict fields (``mask_sample``, ``failure_kind``, metrics).

Flow: ``reset(seed)`` takes row ``seed % len(rows)``, seeds the session and shows the row's input messages; the row's
tools go to ``info["tools"]`` in the chat-template (OpenAI chat) form, so the model sees them in its family's tool
format. Each ``step`` reads the model's tool calls in :mod:`agentrl.tools`' format, runs them against the server and
returns one tool message per call, as NeMo Gym's agent does. A turn with no tool call ends the episode: ``/verify``
gives the reward (terminated). After ``max_steps`` turns the episode ends the same way, truncated, as the simple
agent's ``max_steps`` does (it verifies what it has).

Bad tool calls are the model's business, as in NeMo Gym's agent: a malformed call (no JSON, arguments that are not
an object) gets ``{"error": "Invalid tool call ..."}`` as its tool message, the episode goes on, and its text stays in
the turn's message (a chat-template tool parser leaves it as text). A name that is not one of the row's tools gets
``{"error": "unknown tool ..."}`` without a request: NeMo Gym's agent would POST it and show the server's 404, but a
tool name is a URL path, and the model must not reach ``/verify`` or ``/seed_session`` through one. More than
``max_calls_per_turn`` calls in a turn: the rest get an error.

Invariants: every request is bounded (``call_timeout_s`` per read, replies up to
:data:`~agentrl.envs.bridges.nemo_gym_client.MAX_REPLY_BYTES`); a server that is unreachable, times out or cuts a
reply, a ``/seed_session`` or ``/verify`` that answers an HTTP error or anything but a JSON object, a ``/verify``
without a finite ``reward``, and a ``/verify`` that sets ``mask_sample`` (NeMo Gym's word for "the environment
failed, this reward measures nothing") raise :class:`~agentrl.envs.bridges.nemo_gym_client.NeMoGymError` naming the
server and the request: a failed episode in the manager, never a hung one. ``task_key(seed)`` is the rows file's name
and the row's hash, as for ``nemo_gym/Gymnasium-v0``. NeMo Gym's simple agent never closes a resources session (its
servers keep per-session state until they exit); neither does this env.
"""

from __future__ import annotations

import http.cookiejar
import json
import math
import re
import urllib.request
from pathlib import Path
from typing import Any

from agentrl.core import Env, Message, StepResult
from agentrl.envs.bridges.nemo_gym_client import (NeMoGymError, check_endpoint, input_messages, load_rows, post,
                                                  post_json, response_object, row_key)
from agentrl.tools import TOOL_CALL_RE, ParsedToolCalls, parse_tool_calls

# A tool name is a path segment of the server's URL. The reserved ones are the resources server's own endpoints
# (nemo_gym.base_resources_server.RESERVED_MCP_TOOL_NAMES, plus the Gymnasium servers' and FastAPI's).
TOOL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
RESERVED_NAMES = frozenset({"verify", "seed_session", "close_session", "aggregate_metrics", "mcp", "reverify_mode",
                            "reset", "step", "close", "docs", "openapi.json"})


def row_tools(row: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The row's Responses-API function tools, checked; raises ``ValueError`` naming ``where`` and the bad tool."""
    tools = row["responses_create_params"].get("tools") or []
    if not isinstance(tools, list):
        raise ValueError(f"{where}: responses_create_params.tools must be a list, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(name, str):
            raise ValueError(f"{where}: tools[{i}] must be a Responses function tool "
                             '({"type": "function", "name": ..., "parameters": ...})')
        if not TOOL_NAME_RE.fullmatch(name) or name in RESERVED_NAMES:
            raise ValueError(f"{where}: tools[{i}] name {name!r} cannot be a tool endpoint of a resources server")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise ValueError(f"{where}: tools[{i}] ({name}) parameters must be a JSON schema object")
    return tools


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool in the chat-completions form chat templates take (``agentrl.tools`` schemas)."""
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                             "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}}


def tool_error(message: str) -> str:
    """A tool output saying what was wrong, in the JSON shape NeMo Gym's agent gives a call it cannot run."""
    return json.dumps({"error": message})


def message_text(text: str) -> str:
    """The turn's text without its well-formed tool calls (a malformed one stays, as text)."""
    kept, last = [], 0
    for m in TOOL_CALL_RE.finditer(text):
        if parse_tool_calls(m.group(0)).calls:
            kept.append(text[last:m.start()])
            last = m.end()
    kept.append(text[last:])
    return "".join(kept).strip()


class NeMoGymToolsEnv(Env):
    """An episode of a NeMo Gym tool + ``/verify`` resources server (see the module docstring).

    kwargs: ``url``, ``tasks`` (JSONL rows), ``max_steps`` (16: model turns before the episode is verified
    truncated), ``max_calls_per_turn`` (8), ``call_timeout_s`` (60, per request read).
    """

    description = "A NeMo Gym tool + /verify resources server (kwargs url=, tasks=rows.jsonl)"

    def __init__(self, url: str, tasks: str, max_steps: int = 16, max_calls_per_turn: int = 8,
                 call_timeout_s: float = 60.0):
        super().__init__()
        self.url, self.call_timeout_s = check_endpoint("NeMoGymToolsEnv", url, call_timeout_s)
        for name, value, top in (("max_steps", max_steps, 1000), ("max_calls_per_turn", max_calls_per_turn, 256)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"NeMoGymToolsEnv: {name} must be an int in [1, {top}], got {value!r}")
        self.max_steps, self.max_calls_per_turn = max_steps, max_calls_per_turn
        self.tasks_path = Path(tasks)
        self.rows = load_rows(self.tasks_path)
        self.tools = [row_tools(row, f"{self.tasks_path}: row {i}") for i, row in enumerate(self.rows)]
        for i, row in enumerate(self.rows):
            if not input_messages(row["responses_create_params"]["input"]):
                raise ValueError(f"{self.tasks_path}: row {i}: responses_create_params.input has no message with text")
        self._opener: urllib.request.OpenerDirector | None = None
        self.index, self.row, self.current_key, self.turns = 0, self.rows[0], "", 0
        #: the episode after its input, as Responses output items (what ``/verify`` gets as ``response.output``)
        self.output: list[dict[str, Any]] = []
        #: the last ``/verify`` request's ``response`` (for inspection; None before the first verified episode)
        self.verified_response: dict[str, Any] | None = None

    def task_key(self, seed: int) -> str:
        return row_key(self.tasks_path, self.rows[seed % len(self.rows)])

    # -- gymnasium API --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Seeds a server session for row ``seed % len(rows)`` (drawn from ``self.np_random`` when ``seed`` is None)
        and shows the row's input messages."""
        super().reset(seed=seed)
        self.close()
        self.index = seed % len(self.rows) if seed is not None else int(self.np_random.integers(len(self.rows)))
        self.row, self.turns, self.output = self.rows[self.index], 0, []
        self.current_key = self.task_key(self.index)
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        post_json(opener, self.url, "/seed_session", self.row, self.call_timeout_s)  # sets the session cookie
        self._opener = opener
        obs = input_messages(self.row["responses_create_params"]["input"])
        info = {"tools": [chat_tool(t) for t in self.tools[self.index]], "task_key": self.current_key, "row": self.index}
        return obs, info

    def step(self, action: str) -> StepResult:
        """Runs the turn's tool calls against the server; a turn without one (or the ``max_steps``-th) is verified."""
        if self._opener is None:
            raise NeMoGymError(f"NeMo Gym server {self.url}: no open episode (call reset first)")
        self.turns += 1
        text = str(action)
        parsed = parse_tool_calls(text)
        content = message_text(text)
        if content or not parsed.calls:  # as NeMo Gym's model server: a message item unless the turn is only calls
            self.output.append({"id": f"msg_{self.turns}", "type": "message", "role": "assistant", "status": "completed",
                                "content": [{"type": "output_text", "text": content, "annotations": []}]})
        if not parsed.calls and not parsed.errors:
            return self._finish(terminated=True, out=[], info={"tool_calls": 0, "invalid_action": False})
        out, invalid = self._run_calls(parsed)
        info = {"tool_calls": len(parsed.calls), "invalid_action": invalid}
        if self.turns >= self.max_steps:
            return self._finish(terminated=False, out=out, info=info)
        return out, 0.0, False, False, {**info, "task_key": self.current_key}

    def close(self) -> None:
        self._opener = None  # the session is the cookie jar; the server keeps its state (see the module docstring)

    # -- the episode ----------------------------------------------------------------------------------------------
    def _run_calls(self, parsed: ParsedToolCalls) -> tuple[list[Message], bool]:
        """The tool messages of the turn's calls, and whether any call was refused or answered an HTTP error. The
        transcript gets the turn's ``function_call`` items, then their outputs (the simple agent's order)."""
        assert self._opener is not None
        names = {t["name"] for t in self.tools[self.index]}
        out: list[Message] = []
        results: list[dict[str, Any]] = []
        invalid = bool(parsed.errors)
        for i, call in enumerate(parsed.calls):
            call_id = f"call_{self.turns}_{i}"
            self.output.append({"id": call_id, "type": "function_call", "call_id": call_id, "name": call.name,
                                "arguments": json.dumps(call.arguments), "status": "completed"})
            if i >= self.max_calls_per_turn:
                result, invalid = tool_error(f"at most {self.max_calls_per_turn} tool calls per turn"), True
            elif call.name not in names:
                available = ", ".join(sorted(names)) or "none"
                result, invalid = tool_error(f"unknown tool {call.name!r}; available tools: {available}"), True
            else:  # any answer is the tool's output, an error status included (as NeMo Gym's agent)
                status, raw = post(self._opener, self.url, "/" + call.name, call.arguments, self.call_timeout_s)
                result, invalid = raw.decode("utf-8", errors="replace"), invalid or status >= 400
            results.append({"type": "function_call_output", "call_id": call_id, "output": result})
            out.append({"role": "tool", "name": call.name, "content": result})
        self.output.extend(results)
        out.extend({"role": "tool", "content": tool_error(f"Invalid tool call: {e}")} for e in parsed.errors)
        return out, invalid

    def response(self) -> dict[str, Any]:
        """The episode as the Responses object ``/verify`` validates (``NeMoGymResponse``): the row's tools, the
        output items so far."""
        params = self.row["responses_create_params"]
        model = params.get("model") if isinstance(params.get("model"), str) else "agentrl"
        return {**response_object("", model=model), "output": list(self.output), "tools": list(self.tools[self.index]),
                "parallel_tool_calls": params.get("parallel_tool_calls", True) is not False}

    def _finish(self, *, terminated: bool, out: list[Message], info: dict[str, Any]) -> StepResult:
        opener, where = self._opener, f"NeMo Gym server {self.url}: /verify"
        assert opener is not None
        self.close()  # the episode is over, verified or failed
        self.verified_response = self.response()
        reply = post_json(opener, self.url, "/verify", {**self.row, "response": self.verified_response},
                          self.call_timeout_s)
        reward = reply.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise NeMoGymError(f"{where} answered reward {reward!r}, not a finite number")
        if reply.get("mask_sample") is True:
            raise NeMoGymError(f"{where} masked the sample (failure_kind {reply.get('failure_kind')!r}: "
                               f"{reply.get('failure_reason')}): its reward measures nothing")
        verdict = {k: v for k, v in reply.items() if k not in self.row and k not in ("response", "reward")}
        return out, float(reward), terminated, not terminated, {**info, "verify": verdict, "task_key": self.current_key}

