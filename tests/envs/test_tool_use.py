from __future__ import annotations

import json
import re

import pytest

from agentrl.envs.tool_use import QUESTIONS, TASKS, ToolUseEnv, solve
from agentrl.envs.utils import play_episode
from agentrl.tools import format_tool_call


def _env(**kw) -> ToolUseEnv:
    env = ToolUseEnv(**kw)
    env.reset(seed=0)
    return env


def _call(tool, **arguments) -> str:
    return format_tool_call(tool, arguments)


def _someone(env: ToolUseEnv) -> tuple[str, int, str]:
    name, (age, city) = sorted(env.table.items())[0]
    return name, age, city


def test_tool_schemas_exposed_on_env_and_in_reset_info():
    env = ToolUseEnv()
    obs, info = env.reset(seed=0)
    schemas = env.tool_schemas()
    assert [s["function"]["name"] for s in schemas] == ["lookup", "calculator"]
    for s in schemas:
        assert s["type"] == "function" and s["function"]["parameters"]["type"] == "object"
        assert s["function"]["parameters"]["required"]
    assert info["tools"] == schemas and info["tools"] is not schemas
    assert env.tool_schemas()[0] is not schemas[0]  # fresh copies: callers may mutate them
    assert info["question"] == obs[1]["content"] and info["task"] in TASKS
    assert "<tool_call>" in obs[0]["content"] and "<answer>" in obs[0]["content"]


def test_table_is_hidden_from_the_prompt():
    env = ToolUseEnv()
    obs, _ = env.reset(seed=3)
    text = " ".join(m["content"] for m in obs)
    for age, city in env.table.values():
        assert str(age) not in text


def test_lookup_and_calculator_results_come_back_as_tool_messages():
    env = _env()
    name, age, city = _someone(env)
    action = "Let me check.\n" + _call("lookup", name=name.upper()) + _call("calculator", expression=f"{age} * 2")
    obs, r, term, trunc, info = env.step(action)
    assert (r, term, trunc) == (0.0, False, False) and info["tool_calls"] == 2 and not info["invalid_action"]
    assert obs == [
        {"role": "tool", "name": "lookup", "content": f"{name.capitalize()}: age {age}, city {city}"},
        {"role": "tool", "name": "calculator", "content": str(age * 2)},
    ]


@pytest.mark.parametrize("action, expected", [
    (_call("search", query="x"), "error: unknown tool 'search'; available tools: calculator, lookup"),
    (_call("lookup"), "error: lookup: missing required argument 'name'"),
    (_call("lookup", name=5), "error: lookup: argument 'name' must be string, got int"),
    (_call("lookup", name="Ann", age=3), "error: lookup: unknown argument 'age'"),
    (_call("lookup", name="Nobody"), "error: lookup failed: no person named 'Nobody'"),
    (_call("calculator", expression="__import__('os')"), "error: calculator failed: only numbers"),
    (_call("calculator", expression="1/0"), "error: calculator failed: division by zero"),
    ("<tool_call>{\"name\": \"lookup\", \"arguments\": {\"name\": }</tool_call>", "error: tool call 1: invalid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "error: tool call 1: expected a JSON object"),
    ("<tool_call>{\"name\": \"lookup\", \"arguments\": {\"name\": \"Ann\"}}", "error: tool call 1: missing closing </tool_call>"),
])
def test_bad_tool_calls_give_error_observations(action, expected):
    env = _env(invalid_reward=-0.2)
    obs, r, term, trunc, info = env.step(action)
    assert (term, trunc) == (False, False) and r == 0.0 and info["invalid_action"]
    assert len(obs) == 1 and obs[0]["role"] == "tool" and obs[0]["content"].startswith(expected), obs


def test_text_without_tool_call_or_answer_is_invalid():
    env = _env(invalid_reward=-0.2)
    obs, r, term, trunc, info = env.step("Hmm, I need to think about this." * 50)
    assert (r, term, trunc) == (-0.2, False, False) and info["invalid_action"]
    assert obs[0]["role"] == "user" and obs[0]["content"].startswith("No tool call or answer")
    assert len(obs[0]["content"]) < 250


def test_too_many_calls_in_one_turn():
    env = _env(max_calls_per_turn=2)
    name = _someone(env)[0]
    obs, _, _, _, info = env.step(_call("lookup", name=name) * 3)
    assert [m["content"].startswith("error") for m in obs] == [False, False, True]
    assert "at most 2 tool calls" in obs[2]["content"] and info["invalid_action"]


def test_valid_and_broken_calls_in_one_message():
    env = _env()
    name = _someone(env)[0]
    obs, _, _, _, info = env.step(_call("lookup", name=name) + "<tool_call>not json</tool_call>")
    assert obs[0]["name"] == "lookup" and not obs[0]["content"].startswith("error")
    assert obs[1]["role"] == "tool" and "invalid JSON" in obs[1]["content"] and info["invalid_action"]


def test_answers():
    env = ToolUseEnv(tasks=["sum"])
    env.reset(seed=1)
    obs, r, term, trunc, info = env.step(f"<answer> {env.answer} </answer>")
    assert (r, term, trunc) == (1.0, True, False) and obs[0] == {"role": "user", "content": "Correct."}
    env.reset(seed=1)
    obs, r, term, _, info = env.step(f"<answer>{int(env.answer) + 1}</answer>")
    assert (r, term) == (0.0, True) and obs[0]["content"] == f"Wrong. The answer is {env.answer}."
    env.reset(seed=1)
    # An answer ends the episode even when the same message also calls tools.
    assert env.step(_call("lookup", name="Ann") + f"<answer>{env.answer}.0</answer>")[1:3] == (1.0, True)
    obs, r, term, _, _ = env.step("<answer>1</answer>")
    assert term and r == 0.0 and "already answered" in obs[0]["content"]


def test_city_answers_are_case_insensitive():
    env = ToolUseEnv(tasks=["city"])
    env.reset(seed=2)
    assert env.step(f"<answer>{env.answer.upper()}.</answer>")[1] == 1.0


@pytest.mark.parametrize("task", TASKS)
def test_each_task_is_solved_by_the_solver_using_the_tools(task):
    env = ToolUseEnv(tasks=[task])
    for seed in range(15):
        result = play_episode(env, solve, seed=seed)
        assert result.total_reward == 1.0, result.conversation
        pattern = re.escape(QUESTIONS[task]).replace(r"\{a\}", r"\w+").replace(r"\{b\}", r"\w+")
        assert re.fullmatch(pattern, result.conversation[1]["content"])
        used = [m["name"] for m in result.conversation if m["role"] == "tool"]
        assert used.count("lookup") == 2
        assert used.count("calculator") == (0 if task == "city" else 1)


def test_solver_recovers_after_an_invalid_turn():
    env = ToolUseEnv()
    obs, _ = env.reset(seed=4)
    conversation = list(obs)
    for action in ["no idea", _call("lookup", name="Zzz")]:
        conversation.append({"role": "assistant", "content": action})
        conversation.extend(env.step(action)[0])
    for _ in range(5):
        action = solve(conversation)
        conversation.append({"role": "assistant", "content": action})
        out, reward, term, _, _ = env.step(action)
        conversation.extend(out)
        if term:
            break
    assert term and reward == 1.0


def test_constructor_rejects_bad_config():
    with pytest.raises(ValueError, match="tasks"):
        ToolUseEnv(tasks=["weather"])
    with pytest.raises(ValueError, match="num_people"):
        ToolUseEnv(num_people=1)


def test_tool_messages_are_json_safe():
    env = _env()
    obs, _, _, _, _ = env.step(_call("lookup", name=_someone(env)[0]))
    json.dumps(obs)
