"""``nemo_gym/Tools-v0`` against a stand-in NeMo Gym tool + ``/verify`` server (``nemo_gym_tools_standin.py``, which
mirrors the wheel's ``example_session_state_mgmt`` server; nemo-gym itself needs Python >= 3.13.14, which this
machine has not), started for real on loopback: a full episode, the Responses transcript ``/verify`` validates, the
session cookie, 64 episodes at once through the manager, bad tool calls, the step bound, a server killed
mid-episode, a hang, garbage and masked verdicts, bad rows, and ``agentrl envs check``."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

import agentrl
from agentrl.envs.bridges.nemo_gym_client import NeMoGymError
from agentrl.envs.bridges.nemo_gym_tools import NeMoGymToolsEnv
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy
from agentrl.tools import format_tool_call
from agentrl.testing.procs import serve_script

pytestmark = pytest.mark.timeout(300)

TOOLS_ID = "nemo_gym/Tools-v0"
STANDIN = Path(__file__).with_name("nemo_gym_tools_standin.py")
# Responses-API function tools, as the wheel's example_session_state_mgmt rows carry them
TOOLS = [
    {"type": "function", "name": "increment_counter", "description": "Add count to the counter", "strict": True,
     "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"],
                    "additionalProperties": False}},
    {"type": "function", "name": "get_counter_value", "description": "", "strict": True,
     "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}},
]
# (initial_count, a, b, expected_count): the last row's expectation is wrong on purpose, so a correct agent scores 0
ROWS = [(3, 1, 2, 6), (6, 4, 5, 15), (0, 7, 8, 15), (10, 2, 9, 21), (1, 1, 1, 3), (5, 5, 5, 99)]


@pytest.fixture
def server():
    with serve_script(STANDIN) as served:
        yield served


def _row(initial: int, a: int, b: int, expected: int, **extra) -> dict:
    messages = [{"role": "developer", "content": "Use the counter tools."},
                {"role": "user", "content": f"add {a} then add {b} then get the count"}]
    return {"responses_create_params": {"input": messages, "tools": TOOLS}, "expected_count": expected,
            "initial_count": initial, **extra}


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def rows(tmp_path) -> str:
    return _write(tmp_path / "counter.jsonl", [_row(*r) for r in ROWS])


def _counter_agent(conversation, meta) -> str:
    """Adds the two numbers (one call, then two calls in one turn with the read-back), then says the count."""
    a, b = map(int, re.findall(r"\d+", next(m["content"] for m in conversation if m["role"] == "user")))
    turn = sum(m["role"] == "assistant" for m in conversation)
    if turn == 0:
        return "First the first number. " + format_tool_call("increment_counter", {"count": a})
    if turn == 1:
        return format_tool_call("increment_counter", {"count": b}) + format_tool_call("get_counter_value", {})
    return f"The count is {json.loads(conversation[-1]['content'])['count']}."


def _play(env, seed: int):
    obs, info = env.reset(seed=seed)
    conversation, result = list(obs), None
    while result is None or not (result[2] or result[3]):
        action = _counter_agent(conversation, None)
        result = env.step(action)
        conversation += [{"role": "assistant", "content": action}, *result[0]]
    return conversation, result


def test_an_episode_over_the_protocol(server, rows):
    _, url = server
    env = agentrl.make(TOOLS_ID, url=url, tasks=rows)
    try:
        obs, info = env.reset(seed=7)  # row 1: 6 + 4 + 5 == 15
        assert obs == [{"role": "system", "content": "Use the counter tools."},
                       {"role": "user", "content": "add 4 then add 5 then get the count"}]
        assert [t["function"]["name"] for t in info["tools"]] == ["increment_counter", "get_counter_value"]
        assert info["tools"][0]["function"]["parameters"]["required"] == ["count"]
        assert info["task_key"] == env.unwrapped.task_key(1) != env.unwrapped.task_key(0)
        out, reward, term, trunc, step_info = env.step(_counter_agent(obs, None))
        assert out == [{"role": "tool", "name": "increment_counter", "content": '{"success":true}'}]
        assert (reward, term, trunc, step_info["tool_calls"], step_info["invalid_action"]) == (0.0, False, False, 1, False)
        out, *_ = env.step(_counter_agent(obs + [{"role": "assistant", "content": ""}], None))
        assert [m["content"] for m in out] == ['{"success":true}', '{"count":15}']  # the session kept the counter
        out, reward, term, trunc, step_info = env.step("The count is 15.")
        assert (out, reward, term, trunc) == ([], 1.0, True, False)
        assert step_info["verify"] == {"mask_sample": False, "failure_kind": None, "failure_reason": None}
        # what /verify got: the episode after its input, in the simple agent's order (calls, then their outputs)
        items = env.unwrapped.verified_response["output"]
        assert [(i["type"], i.get("name")) for i in items] == [
            ("message", None), ("function_call", "increment_counter"), ("function_call_output", None),
            ("function_call", "increment_counter"), ("function_call", "get_counter_value"),
            ("function_call_output", None), ("function_call_output", None), ("message", None)]
        assert items[0]["content"][0]["text"] == "First the first number."
        assert json.loads(items[1]["arguments"]) == {"count": 4} and items[2]["call_id"] == items[1]["call_id"]
        assert items[6] == {"type": "function_call_output", "call_id": items[4]["call_id"], "output": '{"count":15}'}
        assert env.unwrapped.verified_response["tools"] == TOOLS
        with pytest.raises(NeMoGymError, match="no open episode"):
            env.step("again")
        assert _play(env, 5)[1][1:4] == (0.0, True, False)  # the agent is right, the row's expectation is not
    finally:
        env.close()


def test_each_episode_is_its_own_session(server, rows):
    """Two episodes interleaved on one server keep their own counters: each env has its own cookie jar."""
    _, url = server
    a, b = NeMoGymToolsEnv(url, rows), NeMoGymToolsEnv(url, rows)
    a.reset(seed=0)  # starts at 3
    b.reset(seed=3)  # starts at 10
    a.step(format_tool_call("increment_counter", {"count": 100}))
    assert b.step(format_tool_call("get_counter_value", {}))[0][0]["content"] == '{"count":10}'
    assert a.step(format_tool_call("get_counter_value", {}))[0][0]["content"] == '{"count":103}'


async def test_64_episodes_at_once_through_the_manager_are_reproducible(server, rows):
    _, url = server
    specs = [EpisodeSpec(TOOLS_ID, {"url": url, "tasks": rows}, seed=s) for s in range(64)]
    async with EnvManager(ManagerConfig(max_concurrency=64), ScriptedPolicy(_counter_agent)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:12])
    assert [t.error for t in first + again] == [None] * 76
    assert [t.reward for t in first] == [0.0 if s % len(ROWS) == 5 else 1.0 for s in range(64)]
    assert all(t.termination == "terminated" and t.num_turns == 3 for t in first + again)
    assert [t.messages for t in first[:12]] == [t.messages for t in again]  # same seed, same episode


def test_bad_tool_calls_are_tool_messages_and_the_episode_goes_on(server, rows):
    _, url = server
    env = agentrl.make(TOOLS_ID, url=url, tasks=rows, max_calls_per_turn=2)
    env.reset(seed=0)  # 3 + 1 + 2 == 6
    malformed = 'Adding. <tool_call>{"name": "increment_counter", "arguments": {"count": 1}</tool_call>'
    out, reward, term, _, info = env.step(malformed)
    assert len(out) == 1 and out[0]["role"] == "tool" and (reward, term, info["invalid_action"]) == (0.0, False, True)
    assert json.loads(out[0]["content"])["error"].startswith("Invalid tool call: tool call 1: invalid JSON")
    # a name that is not one of the row's tools never reaches the server, not even its own /verify
    for name in ("reset_counter", "verify"):
        (msg,), _, term, _, info = env.step(format_tool_call(name, {}))
        assert json.loads(msg["content"]) == {"error": f"unknown tool {name!r}; available tools: "
                                                        "get_counter_value, increment_counter"}
        assert not term and info["invalid_action"]
    # arguments outside the tool's schema: the server's 422 is the tool's output, as NeMo Gym's agent shows it
    (msg,), _, _, _, info = env.step(format_tool_call("increment_counter", {"count": "many"}))
    assert json.loads(msg["content"])["detail"][0]["loc"] == ["body", "count"] and info["invalid_action"]
    out, *_ , info = env.step(format_tool_call("get_counter_value", {}) * 3)
    assert [m["content"] for m in out][:2] == ['{"count":3}'] * 2 and info["invalid_action"]
    assert json.loads(out[2]["content"]) == {"error": "at most 2 tool calls per turn"}
    env.step(format_tool_call("increment_counter", {"count": 1}) + format_tool_call("increment_counter", {"count": 2}))
    assert env.step("It is 6.")[1:3] == (1.0, True)  # no bad call touched the counter
    items = env.unwrapped.verified_response["output"]
    assert items[0]["type"] == "message" and items[0]["content"][0]["text"] == malformed  # kept as text
    env.close()


def test_max_steps_verifies_and_truncates(server, rows):
    _, url = server
    env = agentrl.make(TOOLS_ID, url=url, tasks=rows, max_steps=2)
    env.reset(seed=4)  # 1 + 1 + 1 == 3
    env.step(format_tool_call("increment_counter", {"count": 2}))
    out, reward, term, trunc, info = env.step(format_tool_call("get_counter_value", {}))
    assert out[0]["content"] == '{"count":3}' and (reward, term, trunc) == (1.0, False, True)  # verified all the same
    assert "verify" in info
    env.close()


def test_a_server_killed_mid_episode_fails_it_with_a_clear_error(server, rows):
    proc, url = server
    env = NeMoGymToolsEnv(url, rows)
    env.reset(seed=0)
    assert env.step(format_tool_call("increment_counter", {"count": 1}))[0][0]["content"] == '{"success":true}'
    proc.kill()
    proc.wait()
    with pytest.raises(NeMoGymError, match=r"127\.0\.0\.1:\d+: POST /increment_counter failed: ConnectionRefusedError"):
        env.step(format_tool_call("increment_counter", {"count": 2}))
    with pytest.raises(NeMoGymError, match="POST /seed_session failed"):
        env.reset(seed=0)


async def test_a_server_killed_mid_episode_through_the_manager(server, rows):
    """The policy kills the server once the first tool call is answered, then calls again: a failed episode (its
    replacement too, refused at /seed_session) with the error, and a manager that returns."""
    proc, url = server
    kills = []

    def act(conversation, meta):
        if any(m["role"] == "tool" for m in conversation) and proc.poll() is None:
            proc.kill()
            proc.wait()  # the kill has landed before the next call goes out
            kills.append(meta.seed)
        return _counter_agent(conversation, meta)

    spec = EpisodeSpec(TOOLS_ID, {"url": url, "tasks": rows, "call_timeout_s": 10}, seed=0)
    async with EnvManager(ManagerConfig(max_failures_per_group=1), ScriptedPolicy(act)) as m:
        (t,) = await m.run_episodes([spec])
    assert kills == [0] and t.termination == "error"
    assert "NeMoGymError" in t.error and re.search(r"POST /(increment_counter|seed_session) failed: ConnectionRefused",
                                                   t.error), t.error


def test_hangs_garbage_and_masked_verdicts_become_clear_errors(server, tmp_path):
    _, url = server
    faults = _write(tmp_path / "faults.jsonl", [_row(0, 1, 1, 2, standin_fault=f)
                                                for f in ("hang_tool", "garbage_verify", "no_reward", "mask",
                                                          "huge_tool")]
                    + [_row(0, 1, 1, 2) | {"initial_count": "lots"}])
    env = NeMoGymToolsEnv(url, faults, call_timeout_s=2)
    env.reset(seed=0)
    t0 = time.monotonic()
    with pytest.raises(NeMoGymError, match="POST /get_counter_value failed: .*timed out"):
        env.step(format_tool_call("get_counter_value", {}))
    assert time.monotonic() - t0 < 20
    for seed, match in ((1, "POST /verify answered with something that is not JSON: b'<html>"),
                        (2, "/verify answered reward None, not a finite number"),
                        (3, "masked the sample \\(failure_kind 'resources_unavailable': the counter store went away\\)")):
        env.reset(seed=seed)
        with pytest.raises(NeMoGymError, match=match):
            env.step("Done.")
    env.reset(seed=4)
    with pytest.raises(NeMoGymError, match=r"POST /get_counter_value answered more than 4194304 bytes"):
        env.step(format_tool_call("get_counter_value", {}))
    with pytest.raises(NeMoGymError, match=r"POST /seed_session answered HTTP 422: .*initial_count"):
        env.reset(seed=5)


def test_a_server_that_does_not_speak_http_fails_reset(rows):
    """A listener that answers bytes that are not HTTP, then hangs up: a clear error, not a hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer_garbage():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        env = NeMoGymToolsEnv(f"http://127.0.0.1:{listener.getsockname()[1]}", rows, call_timeout_s=5)
        with pytest.raises(NeMoGymError, match="POST /seed_session failed: BadStatusLine"):
            env.reset(seed=0)
    finally:
        thread.join(10)
        listener.close()


def test_bad_rows_and_kwargs_are_refused_by_name(tmp_path, rows):
    url = "http://127.0.0.1:9"
    for tools, match in (([{**TOOLS[0], "name": "verify"}], r"row 0: tools\[0\] name 'verify' cannot be a tool endpoint"),
                         ([{**TOOLS[0], "name": "../admin"}], r"tools\[0\] name '../admin'"),
                         ([{"name": "x"}], r"tools\[0\] must be a Responses function tool"),
                         ("increment_counter", "tools must be a list")):
        bad = _write(tmp_path / "bad.jsonl", [{"responses_create_params": {"input": "hi", "tools": tools}}])
        with pytest.raises(ValueError, match=match):
            NeMoGymToolsEnv(url, bad)
    bad = _write(tmp_path / "bad.jsonl", [{"responses_create_params": {"input": [{"type": "function_call"}]}}])
    with pytest.raises(ValueError, match="row 0: responses_create_params.input has no message with text"):
        NeMoGymToolsEnv(url, bad)
    with pytest.raises(ValueError, match="max_steps must be an int in \\[1, 1000\\]"):
        NeMoGymToolsEnv(url, rows, max_steps=0)
    with pytest.raises(ValueError, match="url must look like"):
        NeMoGymToolsEnv("localhost:1", rows)
    with pytest.raises(NeMoGymError, match="POST /seed_session failed: ConnectionRefusedError"):
        NeMoGymToolsEnv(url, rows).reset(seed=0)


def test_envs_check_passes_with_kwargs(server, rows, capsys):
    from agentrl.cli import main

    _, url = server
    assert main(["envs", "check", TOOLS_ID, f"url={url}", f"tasks={rows}"]) == 0
    assert f"PASS  {TOOLS_ID}" in capsys.readouterr().out


async def test_the_rows_tools_reach_the_models_chat_template(server, rows):
    """reset's info["tools"] is what the manager hands the policy (meta.tools): rendered with Qwen3's real template,
    the prompt lists the row's tools in the model's own tool format."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "chat"))
    try:
        from chat_tokenizers import qwen_tokenizer, template
    finally:
        sys.path.pop(0)
    from agentrl.chat.renderer import ChatRenderer

    _, url = server
    renderer = ChatRenderer(qwen_tokenizer(template("qwen3.jinja")))
    prompts: list[str] = []

    def act(conversation, meta):
        if not prompts:
            prompts.append(renderer.render(conversation, add_generation_prompt=True, tools=meta.tools))
        return _counter_agent(conversation, meta)

    async with EnvManager(ManagerConfig(), ScriptedPolicy(act)) as m:
        (t,) = await m.run_episodes([EpisodeSpec(TOOLS_ID, {"url": url, "tasks": rows}, seed=0)])
    assert t.error is None and t.reward == 1.0
    tools_block = prompts[0].split("<tools>\n")[1].split("\n</tools>")[0]
    listed = [json.loads(line)["function"]["name"] for line in tools_block.strip().splitlines()]
    assert listed == ["increment_counter", "get_counter_value"]
    assert prompts[0].index("Use the counter tools.") < prompts[0].index("add 1 then add 2")
