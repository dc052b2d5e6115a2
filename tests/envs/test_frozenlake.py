from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.frozenlake import FrozenLakeEnv, parse_board, render_board, shortest_path, solve
from agentrl.envs.utils import play_episode


def _env(**kw) -> FrozenLakeEnv:
    env = FrozenLakeEnv(**kw)
    env.reset(seed=0)
    return env


def _place(env: FrozenLakeEnv, player, goal, holes=()) -> None:
    env.player, env.goal, env.holes, env.done = player, goal, set(holes), False


def test_board_render_and_parse_roundtrip():
    text = render_board(3, {(1, 1)}, (2, 2), (0, 0))
    assert text == "P . .\n. H .\n. . G"
    assert parse_board("Board:\n" + text) == (3, {(1, 1)}, (2, 2), (0, 0))
    assert parse_board("no board here") is None
    assert parse_board("P .\n. .") is None  # no goal


def test_generated_boards_are_solvable_and_goal_is_away_from_start():
    for size in (2, 4, 6):
        env = FrozenLakeEnv(size=size, hole_prob=0.3)
        for seed in range(100):
            obs, info = env.reset(seed=seed)
            n, holes, goal, player = parse_board(obs[1]["content"])
            assert n == size and goal == info["goal"] and player == info["position"]
            assert abs(goal[0] - player[0]) + abs(goal[1] - player[1]) >= min(size, 3) - 1
            assert shortest_path(n, holes, player, goal) is not None


def test_moves_edge_goal_and_hole():
    env = _env()
    _place(env, (1, 1), (3, 3), holes=[(2, 1)])
    obs, r, term, trunc, info = env.step("<answer>right</answer>")
    assert (r, term, trunc) == (0.0, False, False) and info["position"] == (1, 2)
    assert "P" in obs[0]["content"] and parse_board(obs[0]["content"])[3] == (1, 2)
    _place(env, (0, 0), (3, 3))
    obs, r, term, _, info = env.step("up")
    assert "hit the edge" in obs[0]["content"] and info["position"] == (0, 0) and not term
    _place(env, (3, 2), (3, 3))
    obs, r, term, _, info = env.step("right")
    assert (r, term, info["won"]) == (1.0, True, True) and "goal" in obs[0]["content"]
    _place(env, (1, 1), (3, 3), holes=[(2, 1)])
    obs, r, term, _, info = env.step("down")
    assert (r, term, info["won"]) == (0.0, True, False) and "hole" in obs[0]["content"]
    # Stepping a finished game is answered, not raised.
    obs, r, term, _, _ = env.step("down")
    assert term and r == 0.0 and "over" in obs[0]["content"]


@pytest.mark.parametrize("action", ["UP", "  up\n", "<answer> Up </answer>", "'up'", "up.", "I think <answer>left</answer> no <answer>up</answer>"])
def test_lenient_parsing_accepts_variants(action):
    env = _env()
    _place(env, (2, 2), (0, 0))
    _, _, _, _, info = env.step(action)
    assert not info["invalid_action"] and info["position"] == (1, 2)


@pytest.mark.parametrize("action", ["jump", "", "   ", "<answer>diagonal</answer>", "up down", "go up please", "x" * 5000, "<answer></answer>"])
def test_invalid_actions_keep_position_and_give_documented_reward(action):
    env = _env(invalid_reward=-0.1)
    before = env.player
    obs, r, term, trunc, info = env.step(action)
    assert r == -0.1 and not term and not trunc and info["invalid_action"]
    assert info["position"] == before
    text = obs[0]["content"]
    assert text.startswith("Invalid move") and "up, down, left or right" in text
    assert len(text) < 200  # a huge action is not echoed back in full
    assert parse_board(text)[3] == before  # the board is repeated


def test_default_invalid_reward_is_zero():
    env = _env()
    assert env.step("fly")[1] == 0.0


def test_slippery_moves_go_sideways():
    env = FrozenLakeEnv(size=5, hole_prob=0.0, slip_prob=1.0)
    env.reset(seed=3)
    _place(env, (2, 2), (0, 0))
    _, _, _, _, info = env.step("up")
    assert info["position"] in ((2, 1), (2, 3))


def test_slippery_episodes_are_seed_deterministic():
    runs = [play_episode(FrozenLakeEnv(slip_prob=0.3), solve, seed=5, max_steps=30).conversation for _ in range(2)]
    assert runs[0] == runs[1]


def test_solver_follows_a_shortest_path():
    env = FrozenLakeEnv(size=6, hole_prob=0.25)
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        n, holes, goal, player = parse_board(obs[1]["content"])
        optimal = len(shortest_path(n, holes, player, goal))
        result = play_episode(env, solve, seed=seed)
        assert result.total_reward == 1.0 and result.steps == optimal


def test_constructor_rejects_bad_config():
    with pytest.raises(ValueError, match="size"):
        FrozenLakeEnv(size=1)
    with pytest.raises(ValueError, match="hole_prob"):
        FrozenLakeEnv(hole_prob=1.0)
    with pytest.raises(ValueError, match="slip_prob"):
        agentrl.make("agentrl/FrozenLake-v0", slip_prob=2.0)


def test_state_key_is_the_position_on_the_board():
    """gigpo's step groups: two episodes of one board are in the same state exactly when the player stands on the
    same cell (the board is the task's, shared by the group); an invalid move or the edge leaves the key alone."""
    env = FrozenLakeEnv(size=4, hole_prob=0.0)
    _, info = env.reset(seed=3)
    start = info["state_key"]
    assert isinstance(start, str) and start == "%d,%d" % info["position"]
    _place(env, (1, 1), (3, 3))
    keys = [env.step(a)[4]["state_key"] for a in ("right", "left", "nonsense", "up", "up")]
    assert keys == ["1,2", "1,1", "1,1", "0,1", "0,1"]
