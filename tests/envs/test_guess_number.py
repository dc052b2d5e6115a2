from __future__ import annotations

import pytest

from agentrl.envs.guess_number import GuessNumberEnv, solve
from agentrl.envs.utils import play_episode


def _env(**kw) -> GuessNumberEnv:
    env = GuessNumberEnv(**kw)
    env.reset(seed=0)
    return env


def test_prompt_states_range_budget_and_format():
    obs, info = GuessNumberEnv().reset(seed=0)
    system = obs[0]["content"]
    assert "between 1 and 16" in system and "6 guesses" in system and "<answer>" in system
    assert info == {"guesses_left": 6, "won": False, "invalid_action": False}


def test_feedback_direction_and_win():
    env = _env()
    env.secret = 11
    obs, r, term, _, info = env.step("<answer>4</answer>")
    assert obs[0]["content"] == "Higher than 4. 5 guesses left." and r == 0.0 and not term
    obs, r, term, _, info = env.step("14")
    assert obs[0]["content"] == "Lower than 14. 4 guesses left."
    obs, r, term, trunc, info = env.step(" 11. ")
    assert obs[0]["content"] == "Correct! The number is 11." and (r, term, trunc) == (1.0, True, False)
    assert info["won"]


def test_running_out_of_guesses_terminates_and_reveals():
    env = _env(max_guesses=2)
    env.secret = 9
    assert env.step("1")[2] is False
    obs, r, term, trunc, info = env.step("2")
    assert term and not trunc and r == 0.0 and not info["won"]
    assert "No guesses left. The number was 9." in obs[0]["content"]
    obs, r, term, _, _ = env.step("9")  # after the end: answered, not raised, no reward
    assert term and r == 0.0


@pytest.mark.parametrize("action, why", [
    ("banana", "is not an integer"),
    ("", "is not an integer"),
    ("3.5", "is not an integer"),
    ("<answer>eight</answer>", "is not an integer"),
    ("8 or 9", "is not an integer"),
    ("17", "is outside 1..16"),
    ("0", "is outside 1..16"),
    ("-3", "is outside 1..16"),
    ("9" * 400, "is outside 1..16"),
    ("9" * 5000, "is outside 1..16"),
])
def test_invalid_guesses_use_a_guess_and_give_invalid_reward(action, why):
    env = _env(invalid_reward=-0.5)
    obs, r, term, trunc, info = env.step(action)
    text = obs[0]["content"]
    assert text.startswith("Invalid guess") and why in text and "5 guesses left." in text
    assert (r, term, trunc) == (-0.5, False, False) and info["invalid_action"] and info["guesses_left"] == 5
    assert len(text) < 200


def test_invalid_actions_alone_end_the_episode_within_the_budget():
    env = _env()
    ends = [env.step("??")[2] for _ in range(6)]
    assert ends == [False] * 5 + [True]


def test_solver_is_binary_search_within_worst_case():
    env = GuessNumberEnv()
    seen = set()
    for seed in range(200):
        result = play_episode(env, solve, seed=seed)
        seen.add(env.secret)
        assert result.total_reward == 1.0 and result.steps <= 5, result.conversation
    assert seen == set(range(1, 17)), "200 seeds should cover every secret"


def test_custom_range_and_default_budget():
    env = GuessNumberEnv(low=-10, high=100)
    assert env.max_guesses == (111).bit_length() + 1
    for seed in range(30):
        result = play_episode(env, solve, seed=seed)
        assert result.total_reward == 1.0 and -10 <= env.secret <= 100


def test_secret_is_drawn_from_the_seed():
    secrets = [GuessNumberEnv() for _ in range(2)]
    for e in secrets:
        e.reset(seed=42)
    assert secrets[0].secret == secrets[1].secret
    assert len({(e := GuessNumberEnv(), e.reset(seed=s), e.secret)[2] for s in range(20)}) > 5


def test_constructor_rejects_bad_config():
    with pytest.raises(ValueError, match="low < high"):
        GuessNumberEnv(low=5, high=5)
    with pytest.raises(ValueError, match="max_guesses"):
        GuessNumberEnv(max_guesses=0)
