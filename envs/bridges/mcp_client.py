"""One MCP client connection, owned by a thread of its own: what :mod:`agentrl.envs.bridges.mcp_tools` talks through.

The official ``mcp`` SDK's client is a stack of anyio context managers (``stdio_client`` or
``streamable_http_client``, then ``ClientSession``) that must be entered and left by one task. An env is called from
many tasks and, in ``agentrl envs check``, from several event loops. So each connection runs an owner task on a
private event loop in a daemon thread; callers submit requests to it and wait on a concurrent future (sync) or its
asyncio wrapper (async).

Invariants: every wait is bounded (``start_timeout_s`` for the handshake and tool listing, ``call_timeout_s`` per
call); a timeout, a server that exits, or a reply that breaks the protocol raises :class:`MCPServerError` naming the
server and the request, and marks the connection dead (its server process is ended, never left behind). ``close``
is idempotent and ends the server process through the SDK's own shutdown.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from agentrl import childwatch

try:
    import mcp.shared.exceptions
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.types import PaginatedRequestParams
except ImportError as e:  # an optional extra: say which
    raise ImportError(f"MCP envs need the official MCP SDK: pip install 'agentrl[mcp]' ({e})") from e


# A JSON-RPC error answer (the session goes on); named McpError before mcp 2.
_RPC_ERROR = getattr(mcp.shared.exceptions, "MCPError", None) or getattr(mcp.shared.exceptions, "McpError")
_GROUP = getattr(builtins, "BaseExceptionGroup", ())
_SPAWN_LOCK = threading.Lock()
_CONNECTION_CLOSED = -32000  # the SDK's code for requests cut off by a closed connection
MAX_TOOL_PAGES = 1000


def _rpc_code(e: BaseException) -> int | None:
    error = getattr(e, "error", None)
    return getattr(error, "code", None)


class MCPServerError(RuntimeError):
    """The MCP server failed: it did not start, timed out, exited, or answered outside the protocol."""


@dataclass
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    task_only: bool = False
    """The server runs it only as a task (MCP 2025-11-25 ``execution.taskSupport: "required"``): the SDK's client
    has no task calls (tasks left the core spec in 2026-07-28), so it can never be called from here."""

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


class MCPConnection:
    """A started MCP server (stdio ``command`` list, or a streamable HTTP ``url``) and its client session."""

    def __init__(self, *, command: list[str] | None = None, url: str | None = None, env: dict[str, str] | None = None,
                 cwd: str | None = None, start_timeout_s: float = 30.0, call_timeout_s: float = 30.0):
        if (command is None) == (url is None):
            raise ValueError("MCPConnection: give exactly one of command (stdio) or url (streamable HTTP)")
        self.command, self.url, self.env, self.cwd = command, url, env, cwd
        self.start_timeout_s, self.call_timeout_s = start_timeout_s, call_timeout_s
        self.label = " ".join(command) if command else str(url)
        self.tools: list[ToolSpec] = []
        self.dead: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentrl-mcp", daemon=True)
        self._thread.start()
        self._requests: asyncio.Queue | None = None
        self._owner: concurrent.futures.Future | None = None
        self._finished = threading.Event()  # set when the owner task has really ended (its server process too)
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> list[ToolSpec]:
        """Starts the server, handshakes and lists its tools (blocking; bounded by ``start_timeout_s``)."""
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._owner = asyncio.run_coroutine_threadsafe(self._own(ready), self._loop)
        try:
            self.tools = ready.result(self.start_timeout_s)
        except concurrent.futures.TimeoutError:
            self._fail(f"MCP server {self.label!r} did not complete initialize + tools/list within "
                       f"{self.start_timeout_s:g} s (not an MCP server on stdout, or too slow to start)")
        except MCPServerError as e:
            self._fail(str(e))
        return self.tools

    async def _own(self, ready: concurrent.futures.Future) -> None:
        self._requests = asyncio.Queue()
        try:
            async with contextlib.AsyncExitStack() as stack:
                # One spawn at a time in the process: uvloop (Ray's workers run it) refuses to spawn from two loops
                # at once ("Racing with another loop to spawn a process"), and every connection has its own loop.
                # Blocking this private loop's thread while waiting is harmless: nothing else runs on it.
                with _SPAWN_LOCK:
                    streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                ready.set_result(await _list_all_tools(session, self.label))
                while True:
                    method, args, fut = await self._requests.get()
                    if method == "close":
                        fut.set_result(None)
                        return
                    try:
                        result = await session.call_tool(method, args)
                    except _RPC_ERROR as e:
                        if not fut.done():
                            fut.set_exception(e)
                        if _rpc_code(e) == _CONNECTION_CLOSED:  # the server went away: the session is over
                            raise
                        continue  # an error answer: this call failed, the session goes on
                    except Exception as e:
                        if not fut.done():
                            fut.set_exception(e)
                        raise
                    if not fut.done():
                        fut.set_result(result)
        except BaseException as e:  # the session ended: fail whoever waits, then let the task end
            err = MCPServerError(f"MCP server {self.label!r} failed: {_describe(e)}")
            if not ready.done():
                ready.set_exception(err)
            self.dead = self.dead or str(err)
            while self._requests is not None and not self._requests.empty():
                _, _, fut = self._requests.get_nowait()
                if not fut.done():
                    fut.set_exception(err)
            if not isinstance(e, Exception):
                raise
        finally:
            self._finished.set()

    def _transport(self) -> Any:
        if self.command is not None:
            childwatch.install()  # the server's process is watched by its pidfd on this loop, not by a thread
            params = StdioServerParameters(command=self.command[0], args=list(self.command[1:]), env=self.env,
                                           cwd=self.cwd)
            return stdio_client(params, errlog=_devnull())
        from mcp.client.streamable_http import streamable_http_client

        return _two_streams(streamable_http_client(self.url))

    def _fail(self, message: str) -> None:
        self.dead = self.dead or message
        self.close()
        raise MCPServerError(message)

    def close(self) -> None:
        """Ends the session and the server process (bounded wait), then the thread; safe to call twice. A healthy
        session is asked to end; a dead or stuck one is cancelled, which the SDK turns into ending the process."""
        if self._closed:
            return
        if threading.current_thread() is self._thread:  # e.g. a finalizer run by the gc on this loop: never block it
            threading.Thread(target=self.close, name="agentrl-mcp-close", daemon=True).start()
            return
        self._closed = True
        owner = self._owner
        if owner is not None and not owner.done():
            if not self.dead and self._requests is not None:
                fut: concurrent.futures.Future = concurrent.futures.Future()
                self._loop.call_soon_threadsafe(self._requests.put_nowait, ("close", None, fut))
                try:
                    owner.result(5.0)
                except BaseException:
                    pass
            if not owner.done():
                # The concurrent future reports cancelled at once; the task's cleanup (ending the process) runs
                # after, on the loop, so wait for the task itself.
                owner.cancel()
            self._finished.wait(15.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()

    # -- calls -------------------------------------------------------------------------------------------------
    def _submit(self, name: str, arguments: dict[str, Any]) -> concurrent.futures.Future:
        if self.dead:
            raise MCPServerError(f"MCP server {self.label!r} is no longer usable: {self.dead}")
        if self._owner is None or self._closed:
            raise MCPServerError(f"MCP server {self.label!r} is not started")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._requests.put_nowait, (name, arguments, fut))  # type: ignore[union-attr]
        return fut

    def _timed_out(self, name: str) -> MCPServerError:
        message = f"MCP server {self.label!r} did not answer tools/call {name!r} within {self.call_timeout_s:g} s"
        self.dead = self.dead or message
        self.close()
        return MCPServerError(message)

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[bool, str]:
        """Calls a tool (blocking); returns ``(is_error, text)``: a tool's error result and a JSON-RPC error answer
        are ``is_error``. Raises :class:`MCPServerError` when the server fails (and marks the connection dead)."""
        fut = self._submit(name, arguments)
        try:
            return _result_text(fut.result(self.call_timeout_s))
        except concurrent.futures.TimeoutError:
            raise self._timed_out(name) from None
        except MCPServerError:
            raise
        except _RPC_ERROR as e:
            if _rpc_code(e) != _CONNECTION_CLOSED:  # an error answer (bad arguments...): the model's to read
                return True, f"JSON-RPC error {_rpc_code(e)}: {getattr(e, 'message', None) or e}"
            message = f"MCP server {self.label!r} failed on tools/call {name!r}: {_describe(e)}"
            self.dead = self.dead or message  # at once: the owner task may still be winding the session down
            raise MCPServerError(message) from e
        except Exception as e:
            message = f"MCP server {self.label!r} failed on tools/call {name!r}: {_describe(e)}"
            self.dead = self.dead or message
            raise MCPServerError(message) from e


_DEVNULL: Any = None


def _devnull() -> Any:
    """One handle for the process where stdio servers' stderr (their logs) goes, closed at exit."""
    global _DEVNULL
    if _DEVNULL is None:
        import atexit
        import os

        _DEVNULL = open(os.devnull, "w")  # noqa: SIM115
        atexit.register(_DEVNULL.close)
    return _DEVNULL


class _two_streams:
    """Adapts a transport context that yields more than ``(read, write)`` (streamable HTTP) to the pair."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def __aenter__(self) -> tuple[Any, Any]:
        got = await self.inner.__aenter__()
        return got[0], got[1]

    async def __aexit__(self, *exc: Any) -> Any:
        return await self.inner.__aexit__(*exc)


async def _list_all_tools(session: Any, label: str) -> list[ToolSpec]:
    """Every page of tools/list (the SDK returns one page and its ``next_cursor``); a server whose pages go on past
    :data:`MAX_TOOL_PAGES` or repeat a cursor breaks the protocol."""
    tools: list[ToolSpec] = []
    seen: set[str] = set()
    cursor = None
    for _ in range(MAX_TOOL_PAGES):
        listed = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools += [_tool_spec(t) for t in listed.tools]
        cursor = listed.next_cursor
        if not cursor:
            return tools
        if cursor in seen:
            break
        seen.add(cursor)
    raise MCPServerError(f"MCP server {label!r}: tools/list pages do not end (a cursor repeated, or more than "
                         f"{MAX_TOOL_PAGES} pages)")


def _tool_spec(tool: Any) -> ToolSpec:
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {"type": "object", "properties": {}}
    execution = getattr(tool, "execution", None)
    return ToolSpec(name=str(tool.name), description=str(tool.description or ""), parameters=dict(schema),
                    task_only=getattr(execution, "task_support", None) == "required")


def _result_text(result: Any) -> tuple[bool, str]:
    """``(is_error, text)`` of a ``CallToolResult``: one part per content block (:func:`_block_text`), or its
    structured content as JSON when it has no blocks."""
    parts = [_block_text(block) for block in getattr(result, "content", None) or []]
    structured = getattr(result, "structured_content", None)
    if structured is None:
        structured = getattr(result, "structuredContent", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, default=str))
    is_error = bool(getattr(result, "is_error", None) or getattr(result, "isError", False))
    return is_error, "\n".join(parts)


def _block_text(block: Any) -> str:
    """What a text model can use of one content block: text as is; an embedded text resource's text under its URI;
    a binary resource, a resource link, an image or audio as a line naming its URI, name, type and size."""
    kind = getattr(block, "type", "content")
    text = getattr(block, "text", None)
    if isinstance(text, str):
        return text
    mime = getattr(block, "mime_type", None) or getattr(block, "mimeType", None)
    if kind == "resource":
        res = getattr(block, "resource", None)
        uri = getattr(res, "uri", "")
        if isinstance(getattr(res, "text", None), str):
            return f"[resource {uri}]\n{res.text}"
        mime = getattr(res, "mime_type", None) or getattr(res, "mimeType", None)
        return f"[resource {uri}: {_described(mime, getattr(res, 'blob', None))}]"
    if kind == "resource_link":
        about = ", ".join(str(x) for x in (getattr(block, "uri", ""), mime) if x)
        desc = getattr(block, "description", None)
        return f"[resource_link {getattr(block, 'name', '')}: {about}{': ' + desc if desc else ''}]"
    if kind in ("image", "audio"):
        return f"[{kind}: {_described(mime, getattr(block, 'data', None))}]"
    return f"[{kind}]"


def _described(mime: Any, b64: Any) -> str:
    """``MIME, N bytes`` of base64 data (its decoded size, without decoding it)."""
    size = None
    if isinstance(b64, str):
        size = len(b64) * 3 // 4 - b64.endswith("=") - b64.endswith("==")
    return ", ".join(x for x in (str(mime) if mime else "", f"{size} bytes" if size is not None else "") if x) or "binary"


def _describe(e: BaseException) -> str:
    """One line for an exception, unwrapping anyio's exception groups to their first leaf."""
    while _GROUP and isinstance(e, _GROUP) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
