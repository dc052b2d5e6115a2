"""agentrl/ToolLookup-v0: the tool-use demo's env (contract, solver, invalid actions, scripted mistakes)."""

from __future__ import annotations

import random

import pytest

import agentrl
from agentrl.envs import mistakes_for, solver_for
from agentrl.envs.tool_lookup import MAX_AGE, MIN_AGE, QUESTIONS, TASKS, ToolLookupEnv, mistake, solve
from agentrl.envs.utils import play_episode
from agentrl.tools import format_tool_call, parse_tool_calls

ENV_ID = "agentrl/ToolLookup-v0"


def _env(task: str, seed: int = 0, **kw) -> ToolLookupEnv:
    env = ToolLookupEnv(tasks=[task], **kw)
    env.reset(seed=seed)
    return env


def _asked(env: ToolLookupEnv) -> str:
    return next(w.rstrip("?") for w in env.question.split() if w.rstrip("?").lower() in env.table)


def test_registered_with_time_limit_solver_and_mistakes():
    env = agentrl.make(ENV_ID)
    assert env.spec.max_episode_steps == 5
    assert solver_for(ENV_ID) is ToolLookupEnv.solve and mistakes_for(ENV_ID) is ToolLookupEnv.mistake
    obs, info = env.reset(seed=0)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert [t["function"]["name"] for t in info["tools"]] == ["lookup", "calculator"]
    assert info["task"] in TASKS and info["question"] == obs[1]["content"]
    with pytest.raises(LookupError, match="no scripted mistakes"):
        mistakes_for("agentrl/FrozenLake-v0")


def test_answer_is_hidden_and_needs_the_tools():
    for seed in range(40):
        env = ToolLookupEnv()
        obs, _ = env.reset(seed=seed)
        text = " ".join(m["content"] for m in obs)
        age, city = env.table[_asked(env).lower()]
        assert str(age) not in text and city not in text and env.answer not in text
        assert env.answer.isdigit() and len(env.answer) == 2 or env.task == "city"
        assert MIN_AGE <= age <= MAX_AGE


@pytest.mark.parametrize("task", TASKS)
def test_solver_wins_each_task_with_the_expected_calls(task):
    for seed in range(15):
        env = ToolLookupEnv(tasks=[task])
        result = play_episode(env, solve, seed=seed)
        assert result.terminated and result.total_reward == 1.0, result.conversation
        calls = [c.name for m in result.conversation if m["role"] == "assistant"
                 for c in parse_tool_calls(m["content"]).calls]
        assert calls == (["lookup"] if task in ("city", "age") else ["lookup", "calculator"])
        assert result.info["invalid_actions"] == 0 and result.info["parse_errors"] == 0
        assert result.conversation[1]["content"].split()[0] == QUESTIONS[task].split()[0]


def test_calculator_expression_is_derived_from_lookup_and_question():
    env = _env("age_in", seed=3)
    name = _asked(env)
    age, _ = env.table[name.lower()]
    years = int(env.question.split(" in ")[1].split()[0])
    obs, r, term, _, info = env.step(format_tool_call("lookup", {"name": name}))
    assert (r, term, info["invalid_action"]) == (0.0, False, False)
    assert obs == [{"role": "tool", "name": "lookup", "content": f"{name}: age {age}, city {env.table[name.lower()][1]}"}]
    convo = [{"role": "user", "content": env.question}, {"role": "assistant", "content": format_tool_call("lookup", {"name": name})}, *obs]
    assert solve(convo) == format_tool_call("calculator", {"expression": f"{age} + {years}"})
    # Answering with the looked-up age (not the calculator's result) is wrong.
    obs, r, term, _, info = env.step(f"<answer>{age}</answer>")
    assert (r, term, info["correct"]) == (0.0, True, False)
    assert obs[0]["content"] == f"Wrong. The answer is {age + years}."


@pytest.mark.parametrize("action, error", [
    ('<tool_call>\n{"name": "lookup", "arguments": {"name": "Ann"}\n</tool_call>', "invalid JSON"),
    ('<tool_call>\n{"name": "lookup", "arguments": {"name": "Ann"}}\n', "missing closing </tool_call>"),
    ("<tool_call>\n{'name': 'lookup', 'arguments': {'name': 'Ann'}}\n</tool_call>", "invalid JSON"),
])
def test_malformed_calls_are_parse_errors_with_a_penalty(action, error):
    env = _env("age")
    obs, r, term, trunc, info = env.step(action)
    assert (r, term, trunc) == (-0.1, False, False)
    assert obs[-1]["role"] == "tool" and obs[-1]["content"].startswith("error:") and error in obs[-1]["content"]
    assert info["invalid_action"] and info["parse_errors"] == 1 and info["invalid_actions"] == 1


@pytest.mark.parametrize("call, error", [
    (("search", {"name": "X"}), "unknown tool 'search'"),
    (("lookup", {"person": "X"}), "missing required argument 'name'"),
    (("calculator", {"name": "X"}), "missing required argument 'expression'"),
    (("lookup", {"name": "Nobody"}), "no person named 'Nobody'"),
    (("calculator", {"expression": "import os"}), "calculator failed"),
])
def test_invalid_calls_are_tool_errors_and_the_episode_goes_on(call, error):
    env = _env("city")
    obs, r, term, _, info = env.step(format_tool_call(*call))
    assert (r, term) == (-0.1, False) and info["invalid_action"] and info["parse_errors"] == 0
    assert obs == [{"role": "tool", "name": call[0], "content": obs[0]["content"]}] and error in obs[0]["content"]
    # The episode continues and can still be won, with the penalty in its return.
    name = _asked(env)
    env.step(format_tool_call("lookup", {"name": name}))
    _, r, term, _, info = env.step(f"<answer>{env.table[name.lower()][1]}</answer>")
    assert (r, term, info["correct"], info["invalid_actions"]) == (1.0, True, True, 1)


def test_text_without_call_or_answer_and_too_many_calls():
    env = _env("age", max_calls_per_turn=2)
    obs, r, term, _, info = env.step("I think the answer is 42")
    assert (r, term, info["invalid_action"]) == (-0.1, False, True) and obs[0]["role"] == "user"
    assert "No tool call or answer" in obs[0]["content"]
    name = _asked(env)
    obs, r, _, _, info = env.step(format_tool_call("lookup", {"name": name}) * 3)
    assert r == -0.1 and [m["content"].startswith("error") for m in obs] == [False, False, True]
    assert info["invalid_actions"] == 2 and info["tool_calls"] == 3
    # After the end: a clear message, no reward, still terminated.
    env.step("<answer>0</answer>")
    obs, r, term, _, _ = env.step("<answer>0</answer>")
    assert (r, term) == (0.0, True) and "already answered" in obs[0]["content"]


def test_city_answers_are_case_insensitive_and_numbers_by_value():
    env = _env("city")
    city = env.table[_asked(env).lower()][1]
    assert env.step(f"<answer> {city.upper()}. </answer>")[1] == 1.0
    env = _env("age_ago", seed=5)
    assert env.step(f"<answer>{int(env.answer)}.0</answer>")[1] == 1.0


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="tasks must be"):
        ToolLookupEnv(tasks=["sum"])
    with pytest.raises(ValueError, match="tasks must be"):
        ToolLookupEnv(tasks="city")
    with pytest.raises(ValueError, match="num_people"):
        ToolLookupEnv(num_people=0)
    with pytest.raises(ValueError, match="invalid_reward"):
        ToolLookupEnv(invalid_reward=0.5)


def test_scripted_mistakes_cover_every_kind_and_never_win_at_once():
    """Every mistake is wrong in the state it is made: it ends the episode without the reward (but for the rare lucky
    guess when skipping the tool: the answer is hidden from the mistake too) or is an invalid or useless step; and
    the kinds the demonstrations need (parse errors, wrong tools/arguments, skipping) all occur."""
    seen = {"parse_error": 0, "invalid_call": 0, "wrong_person": 0, "wrong_answer": 0, "no_call": 0, "lucky": 0}
    rng = random.Random(0)
    for seed in range(200):
        env = ToolLookupEnv()
        obs, _ = env.reset(seed=seed)
        convo = list(obs)
        for _ in range(rng.randint(0, 2)):  # a mistake at a random point of a solved episode
            action = solve(convo)
            if action.startswith("<answer>"):
                break
            convo.append({"role": "assistant", "content": action})
            convo.extend(env.step(action)[0])
        bad = mistake(convo, rng)
        assert bad != solve(convo)
        obs, r, term, _, info = env.step(bad)
        if term and r > 0:
            seen["lucky"] += 1
        elif term:
            assert r == 0.0 and not info["correct"]
            seen["wrong_answer"] += 1
        elif info["parse_errors"]:
            seen["parse_error"] += 1
        elif info["invalid_action"] and obs[0]["role"] == "user":
            seen["no_call"] += 1
        elif info["invalid_action"]:
            seen["invalid_call"] += 1
        else:  # a valid call with a wrong value: another person (or a wrong expression), no progress
            assert r == 0.0
            seen["wrong_person"] += 1
    assert seen.pop("lucky") <= 6, seen
    assert all(n > 0 for n in seen.values()), seen


def test_noisy_demonstrations_are_mediocre():
    """The warm start's demonstrations at the demo's noise succeed often but not always (RL has room)."""
    from agentrl.controller.warmstart import noisy

    act = noisy(solve, mistake, 0.4, seed=0)
    env = agentrl.make(ENV_ID)
    wins = 0
    for i in range(200):
        meta = type("Meta", (), {"trajectory_id": f"t{i}"})()
        wins += play_episode(env, lambda c: act(c, meta), seed=i).total_reward > 0
    assert 0.3 < wins / 200 < 0.7


def test_state_key_is_what_the_tools_have_told_so_far():
    """gigpo's step groups: the state is the set of tool results the episode has obtained (failed calls change
    nothing), so two episodes that looked the person up, in any wording of the call, share the state after it."""
    keys = []
    for wording in ("{name}", "{lower}"):
        env = _env("age_in", seed=5)
        _, info = env.reset(seed=5)
        start = info["state_key"]
        who = _asked(env)
        age = env.table[who.lower()][0]
        bad = env.step(format_tool_call("lookup", {"name": "Nobody"}))[4]["state_key"]
        looked = env.step(format_tool_call("lookup", {"name": wording.format(name=who, lower=who.lower())}))[4]
        years = int(env.question.split(" in ")[1].split()[0])
        calc = env.step(format_tool_call("calculator", {"expression": f"{age} + {years}"}))[4]["state_key"]
        assert bad == start and looked["state_key"] not in (start, calc) and who in looked["state_key"]
        keys.append((start, looked["state_key"], calc))
    assert keys[0] == keys[1]
