from __future__ import annotations

import pytest

from agentrl.envs.arithmetic import ArithmeticEnv, extract_boxed, solve
from agentrl.envs.calc import CalcError, format_number, parse_number, safe_eval


def _env(**kw) -> ArithmeticEnv:
    env = ArithmeticEnv(**kw)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_problems_match_an_independent_evaluation(difficulty):
    env = ArithmeticEnv(difficulty=difficulty)
    questions = set()
    for seed in range(100):
        obs, info = env.reset(seed=seed)
        question = obs[1]["content"]
        assert question.startswith("Compute ") and question.endswith(".")
        expression = question[len("Compute "):-1]
        assert sum(expression.count(op) for op in "+-*") == difficulty
        if difficulty == 1:
            assert "*" not in expression and "(" not in expression
        assert set(expression) <= set("0123456789+-*() ")
        # The env's answer agrees with Python on the same text (the text is generated here, so eval is safe).
        assert env.answer == eval(expression) and isinstance(env.answer, int)
        questions.add(question)
    assert len(questions) > 50


@pytest.mark.parametrize("action", [
    "\\boxed{ANSWER}",
    "Let me think. 7 + 3 = 10, so the result is \\boxed{ ANSWER }.",
    "\\boxed{999} wait, no: \\boxed{ANSWER}",
    "<answer>ANSWER</answer>",
    "ANSWER",
    " ANSWER. ",
    "\\boxed{ANSWER.0}",
])
def test_accepted_answer_forms(action):
    env = _env()
    obs, r, term, trunc, info = env.step(action.replace("ANSWER", str(env.answer)))
    assert (r, term, trunc) == (1.0, True, False) and obs[0]["content"] == "Correct." and info["correct"]


def test_thousands_separator_is_accepted():
    env = _env()
    env.answer = 1234
    assert env.step("\\boxed{1,234}")[1] == 1.0


def test_wrong_answer_terminates_with_zero_and_shows_answer():
    env = _env()
    obs, r, term, trunc, info = env.step(f"\\boxed{{{env.answer + 1}}}")
    assert (r, term, trunc) == (0.0, True, False) and not info["invalid_action"] and not info["correct"]
    assert obs[0]["content"] == f"Wrong. The answer is {env.answer}."


@pytest.mark.parametrize("action", ["I don't know", "", "\\boxed{abc}", "\\boxed{}", "<answer>ten</answer>", "the answer is 4 or 5", "9" * 5000])
def test_unreadable_answers_are_invalid_and_terminate(action):
    env = _env(invalid_reward=-1.0)
    obs, r, term, trunc, info = env.step(action)
    assert (r, term, trunc) == (-1.0, True, False) and info["invalid_action"]
    assert "\\boxed{}" in obs[0]["content"]


def test_step_after_answer_is_answered_not_raised():
    env = _env()
    env.step("1")
    obs, r, term, _, _ = env.step(f"\\boxed{{{env.answer}}}")
    assert term and r == 0.0 and "already answered" in obs[0]["content"]


def test_solver_reads_the_problem_text():
    assert solve([{"role": "user", "content": "Compute 3 * (4 + 5) - 2."}]) == "\\boxed{25}"
    assert solve([{"role": "user", "content": "hello"}]) == "\\boxed{0}"


def test_extract_boxed_takes_the_last():
    assert extract_boxed("\\boxed{1} and \\boxed {2}") == "2"
    assert extract_boxed("nothing") is None


def test_constructor_rejects_bad_difficulty():
    with pytest.raises(ValueError, match="difficulty"):
        ArithmeticEnv(difficulty=0)


# -- the safe evaluator (also the ToolUse calculator) --------------------------------------------------------
@pytest.mark.parametrize("expression, value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 / 2", 3.5), ("8 / 2", 4), ("7 // 2", 3), ("7 % 3", 1),
    ("2 ** 10", 1024), ("2^3", 8), ("-(3 - 5)", 2), ("1.5 * 2", 3), ("2 ** -1", 0.5),
])
def test_safe_eval_values(expression, value):
    result = safe_eval(expression)
    assert result == value and type(result) is type(value)


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('true')", "only numbers"),
    ("open('/etc/passwd')", "function call"),
    ("x + 1", "name 'x'"),
    ("'a' * 3", "str literal"),
    ("1 < 2", "only numbers"),
    ("9 ** 9 ** 9", "exponent"),
    ("10 ** 30", "larger"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 +", "cannot parse"),
    ("", "empty"),
    ("1+" * 200 + "1", "longer than"),
    ("((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1", "too long"),
])
def test_safe_eval_refuses(expression, message):
    with pytest.raises(CalcError, match=message):
        safe_eval(expression)


def test_number_helpers():
    assert format_number(3.0) == "3" and format_number(1 / 3) == "0.333333" and format_number(-2) == "-2"
    assert parse_number(" 1,234. ") == 1234 and parse_number("2.50") == 2.5 and parse_number("$7") == 7
    assert parse_number("abc") is None and parse_number("") is None and parse_number("inf") is None
