"""A small MCP server written with the official ``mcp`` SDK: the default server of ``mcp/Tools-v0``.

Tools: ``lookup(name)`` (age and city of a person of a fixed directory), ``calculator(expression)`` and
``check_answer(task_id, answer)`` (the grader: ``"1"`` or ``"0"``; the env hides it from the model when it is the
checker). Run: ``python mcp_demo_server.py`` (stdio), or ``python mcp_demo_server.py --http PORT`` (streamable HTTP
on ``http://127.0.0.1:PORT/mcp``). ``AGENTRL_MCP_DEMO_PIDFILE``, when set, is a file the server writes its process
id to (tests kill it mid-episode).
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

PEOPLE = {"ann": (34, "Oslo"), "bob": (61, "Lima"), "cleo": (27, "Kyoto"), "dev": (45, "Accra"),
          "eli": (52, "Quito"), "fay": (38, "Perth")}
ANSWERS = {"ann-age": "34", "bob-city": "Lima", "cleo-in-7": "34", "dev-ago-5": "40", "eli-in-3": "55",
           "fay-city": "Perth"}

server = MCPServer("agentrl-demo")


@server.tool(description="Returns the age and city of a person.")
def lookup(name: str) -> str:
    key = name.strip().lower()
    if key not in PEOPLE:
        raise ValueError(f"no person named {name!r}")
    age, city = PEOPLE[key]
    return f"{key.capitalize()}: age {age}, city {city}"


@server.tool(description="Evaluates integer arithmetic: a + b or a - b.")
def calculator(expression: str) -> str:
    parts = expression.split()
    if len(parts) != 3 or parts[1] not in "+-" or not all(p.lstrip("-").isdigit() for p in parts[::2]):
        raise ValueError(f"expected 'a + b' or 'a - b', got {expression!r}")
    a, op, b = int(parts[0]), parts[1], int(parts[2])
    return str(a + b if op == "+" else a - b)


@server.tool(description="Grades an answer to a task: 1 if right, 0 if wrong.")
def check_answer(task_id: str, answer: str) -> str:
    want = ANSWERS.get(task_id)
    return "1" if want is not None and answer.strip().lower() == want.lower() else "0"


if __name__ == "__main__":
    if os.environ.get("AGENTRL_MCP_DEMO_PIDFILE"):
        with open(os.environ["AGENTRL_MCP_DEMO_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
