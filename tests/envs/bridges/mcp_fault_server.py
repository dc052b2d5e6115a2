"""A stdio MCP server written with the ``mcp`` SDK for the MCP env's fault tests (run as a file).

Tools: ``echo(text)``; ``hang(seconds)`` blocks that long before answering (a server too slow for the call timeout);
``crash()`` ends the process without answering (a server that dies mid-call); ``flood(chars)`` answers that many
characters (a tool whose output is far past any context).
"""

import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("agentrl-fault-test")


@server.tool(description="Returns the text.")
def echo(text: str) -> str:
    return text


@server.tool(description="Blocks for the given seconds, then answers.")
def hang(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@server.tool(description="Answers that many characters.")
def flood(chars: int) -> str:
    return "head " + "y" * chars + " tail"


@server.tool(description="Ends the server process without answering.")
def crash() -> str:
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
