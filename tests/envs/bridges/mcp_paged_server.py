"""An MCP server (the official SDK's low-level ``Server``) that lists its tools two per page, as the spec allows any
server to, and declares one tool callable only as a task (``execution.taskSupport: "required"``, MCP 2025-11-25),
which a client without task support can never call. ``--endless``: every page points to one more (a broken or
hostile server)."""

from __future__ import annotations

import sys

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

OBJECT = {"type": "object", "properties": {"x": {"type": "integer"}}}
TOOLS = [types.Tool(name=f"t{i}", description=f"Returns {i} times x.", input_schema=OBJECT) for i in range(5)]
TOOLS.append(types.Tool(name="research", description="Runs as a task only.", input_schema=OBJECT,
                        execution=types.ToolExecution(task_support="required")))
PAGE = 2
ENDLESS = "--endless" in sys.argv


async def list_tools(ctx, params):
    start = int(params.cursor) if params is not None and params.cursor else 0
    if ENDLESS:
        return types.ListToolsResult(tools=[], next_cursor=str(start + 1))
    end = start + PAGE
    return types.ListToolsResult(tools=TOOLS[start:end], next_cursor=str(end) if end < len(TOOLS) else None)


async def call_tool(ctx, params):
    if params.name == "research":
        raise ValueError("research requires task augmentation")
    i = int(params.name[1:])
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(i * int(params.arguments["x"])))])


server = Server("agentrl-paged", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
