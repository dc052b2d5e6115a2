"""TextArena single-player games as agentrl envs (the real textarena package): ids by family, per-env global-RNG
states under one lock, rewards from the game, ``agentrl envs check`` and 64 episodes at once through the manager."""

from __future__ import annotations

import json
import random
import re
import threading
import time

import numpy as np
import pytest

import agentrl
from agentrl.cli import main
from agentrl.envs.bridges.deadline import LibraryTimeout
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy

import textarena  # noqa: F401  the textarena extra (setup.sh installs it)

pytestmark = pytest.mark.timeout(300)

GUESS = "textarena/GuessTheNumber-v0"
MOVES = ["[Up]", "[Left]", "[Down]", "[Right]"] * 3


def _bisect(conversation, meta=None) -> str:
    """Binary search over 1..20 from the game's 'higher' / 'lower' replies."""
    lo, hi, last = 1, 20, None
    for m in conversation:
        if m["role"] == "assistant":
            found = re.search(r"\[(\d+)\]", m["content"])
            last = int(found.group(1)) if found else None
        elif m["role"] == "user" and last is not None:
            if "higher" in m["content"]:
                lo = last + 1
            elif "lower" in m["content"]:
                hi = last - 1
    return f"[{(lo + hi) // 2}]"


def test_guess_the_number_is_played_and_rewarded_by_the_game():
    env = agentrl.make(GUESS)
    obs, info = env.reset(seed=3)
    assert "Guess The Number" in obs[0]["content"] and info["task_key"].startswith(f"{GUESS}:")
    conversation = list(obs)
    while True:
        action = _bisect(conversation)
        conversation.append({"role": "assistant", "content": action})
        out, reward, terminated, truncated, info = env.step(action)
        conversation += out
        if terminated or truncated:
            break
    assert terminated and reward == 1.0 and "Congratulations" in out[0]["content"]
    assert env.step("[1]")[2] is True  # after the end: a note, no crash


def test_task_key_is_the_hidden_content_and_seeds_reproduce():
    keys = [agentrl.make(GUESS).reset(seed=s)[1]["task_key"] for s in (0, 0, 1, 2, 3)]
    assert keys[0] == keys[1] and len(set(keys)) == 4  # same opening text; the number to guess differs
    env = agentrl.make(GUESS).unwrapped
    assert [env.task_key(s) for s in (0, 1, 2, 3)] == keys[1:]  # the env contract's task_key(seed)


def _play_2048(seed: int) -> list[str]:
    env = agentrl.make("textarena/2048-v0")
    obs, _ = env.reset(seed=seed)
    seen = [obs[0]["content"]]
    for move in MOVES:
        out, _, terminated, truncated, _ = env.step(move)
        seen.append(out[0]["content"])
        if terminated or truncated:
            break
    return seen


def test_each_env_keeps_its_own_global_rng_state_across_threads():
    """2048 draws a new tile from the global random after every move: games on threads interleave their moves, and
    each still plays as it does alone; the caller's generators do not move."""
    want = {s: _play_2048(s) for s in range(4)}
    assert len({tuple(v) for v in want.values()}) == 4
    # two games interleaved move by move on one thread: each draws its tiles from its own stream
    a, b = agentrl.make("textarena/2048-v0"), agentrl.make("textarena/2048-v0")
    seen = {0: [a.reset(seed=0)[0][0]["content"]], 1: [b.reset(seed=1)[0][0]["content"]]}
    for move in MOVES[: len(want[0]) - 1]:
        seen[0].append(a.step(move)[0][0]["content"])
        seen[1].append(b.step(move)[0][0]["content"])
    assert seen[0] == want[0] and seen[1][: len(seen[0])] == want[1][: len(seen[0])]
    random.seed(7)
    np.random.seed(7)
    before = (random.getstate(), np.random.get_state()[1].copy())
    got: dict[tuple[int, int], list[str]] = {}
    barrier = threading.Barrier(8)

    def run(seed: int, k: int) -> None:
        barrier.wait()
        got[(seed, k)] = _play_2048(seed)

    threads = [threading.Thread(target=run, args=(s, k)) for s in range(4) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[(s, k)] == want[s] for s in range(4) for k in range(2))
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()


def test_task_key_of_a_game_whose_state_holds_objects_is_its_content():
    """RushHour's state holds its vehicles as objects (default repr: a memory address). The key is their content,
    the same for the same seed in any instance and any process, and differs where the boards differ."""
    keys = [agentrl.make("textarena/RushHour-v0").reset(seed=s)[1]["task_key"] for s in (3, 3, 4)]
    assert keys[0] == keys[1] != keys[2]
    assert agentrl.make("textarena/RushHour-v0").unwrapped.task_key(3) == keys[0]


class _Piece:
    def __init__(self, name: str, at: tuple[int, int]):
        self.name, self.at, self.board = name, at, None


def test_state_content_reads_objects_by_their_fields_not_their_address():
    from agentrl.envs.bridges.textarena_env import state_content

    a, b = _Piece("X", (2, 0)), _Piece("X", (2, 0))
    a.board, b.board = [a], [b]  # cycles: each read once, then named
    assert state_content({"p": a, "s": {3, 1, 2}}) == state_content({"p": b, "s": {2, 3, 1}})
    assert state_content({"p": a}) != state_content({"p": _Piece("X", (2, 1))})
    assert "0x" not in json.dumps(state_content({"p": a, "f": print, "o": object()}))


def test_a_reward_that_is_not_a_number_ends_the_game_with_0_and_says_so():
    """Countdown, Cryptarithm and Slitherlink end a game on a malformed move with the reason where the reward goes
    (TextArena passes the two the other way round there): the episode ends with reward 0, the game's message shown
    to the model and named in the info, and no exception."""
    for game in ("Countdown-v0", "Cryptarithm-v0", "Slitherlink-v0"):
        env = agentrl.make(f"textarena/{game}")
        env.reset(seed=0)
        done, k = False, 0
        while not done and k < 10:
            out, reward, done, truncated, info = env.step("not a move")
            k += 1
        assert done and reward == 0.0 and info["invalid_move"] is True, (game, info)
        assert "is not a number" in info["reward_error"] and "format" in out[0]["content"], (game, info, out)


def test_a_library_error_with_a_banner_is_told_by_its_text():
    """nltk's LookupError (a corpus not downloaded) opens with a blank line and a row of asterisks: the error
    names the missing resource, not an empty line."""
    from agentrl.envs.bridges.errors import describe

    e = LookupError("\n" + "*" * 70 + "\n  Resource \x1b[93mwords\x1b[0m not found.\n  Please use the NLTK "
                    "Downloader to obtain the resource:\n\n  >>> import nltk\n" + "*" * 70 + "\n")
    assert describe(e).startswith("LookupError: Resource words not found. Please use the NLTK Downloader")
    assert describe(KeyError()) == "KeyError" and len(describe(ValueError("x" * 5000))) < 400


def test_every_listed_game_is_an_id_that_can_be_made():
    """TextArena names one variant 'Taboo-v0-city/country': as an id that has a second '/', which gymnasium refuses
    to parse, so a family lists only the names that make an id."""
    from gymnasium.envs.registration import parse_env_id

    from agentrl.registration import family_names

    names = family_names("textarena")
    assert "GuessTheNumber-v0" in names and not [n for n in names if "/" in n]
    for n in names:
        parse_env_id(f"textarena/{n}")


def test_games_that_cannot_run_say_why():
    with pytest.raises(ValueError, match="cannot be played by one player: AssertionError: The number of players has to be 2"):
        agentrl.make("textarena/ConnectFour-v0").reset(seed=0)
    with pytest.raises(agentrl.RegistrationError, match="did you mean 'textarena/GuessTheNumber-v0'"):
        agentrl.make("textarena/GuessTheNumbr-v0")


def test_a_game_that_loops_forever_fails_its_episode_and_leaves_the_others_running():
    """MarketEntryGame is for several players but accepts one; once that player is out, TextArena's turn rotation
    spins forever looking for a player still in (textarena/state.py). Bounded, the call ends with an error and the
    bridges' lock is free for every other game in the process."""
    env = agentrl.make("textarena/MarketEntryGame-v0", call_timeout_s=2)
    env.reset(seed=0)
    t0 = time.monotonic()
    with pytest.raises(LibraryTimeout, match="TextArena game 'MarketEntryGame-v0' did not return within 2 s"):
        for _ in range(40):
            env.step("[enter]")
    assert time.monotonic() - t0 < 60
    assert env.step("[enter]")[2] is True  # the interrupted game is over; reset() starts a new one
    other = agentrl.make(GUESS)  # the lock is free: another game plays on
    other.reset(seed=1)
    assert other.step("[10]")[0][0]["content"]
    with pytest.raises(ValueError, match="call_timeout_s must be a positive number"):
        agentrl.make(GUESS, call_timeout_s=0)


def test_envs_check_on_single_player_games(capsys):
    ids = [GUESS, "textarena/TowerOfHanoi-v0", "textarena/Sudoku-v0"]
    assert main(["envs", "check", *ids, "max_turns=12"]) == 0  # a game's own kwarg, from the command line
    assert capsys.readouterr().out.rstrip().endswith("3 passed, 0 failed")
    assert main(["envs", "check", "textarena/2048-v0", "max_turns=12"]) == 1  # 2048 takes no max_turns: it says so
    assert "got an unexpected keyword argument 'max_turns'" in capsys.readouterr().out
    assert main(["envs", "check", "textarena/2048-v0"]) == 0


async def test_64_episodes_at_once_through_the_manager_are_reproducible():
    specs = [EpisodeSpec(GUESS, seed=s) for s in range(64)]
    async with EnvManager(ManagerConfig(max_concurrency=64), ScriptedPolicy(_bisect)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:16])
    assert [t.error for t in first + again] == [None] * 80
    assert all(t.reward == 1.0 and t.termination == "terminated" for t in first + again)
    assert [t.messages for t in first[:16]] == [t.messages for t in again]
    assert len({t.num_turns for t in first}) > 1  # different hidden numbers, different searches


def test_frozen_lake_oracle_reaches_the_goal_on_every_board_and_other_games_have_none():
    # The scripted solver reads only the board TextArena shows (its ASCII grid), so it is what the warm start imitates.
    from agentrl.eval.policies import oracle_policy_for

    env = agentrl.make("textarena/FrozenLake-v0")
    act = oracle_policy_for("textarena/FrozenLake-v0").fn
    for seed in range(40):
        conversation, _ = env.reset(seed=seed)
        conversation = list(conversation)
        for _ in range(12):
            move = act(conversation, None)
            obs, reward, done, _, _ = env.step(move)
            conversation += [{"role": "assistant", "content": move}, *obs]
            if done:
                break
        assert done and reward == 1.0, (seed, conversation[-1]["content"])
    with pytest.raises(LookupError, match="GuessTheNumber"):
        oracle_policy_for(GUESS)


def _board(*rows: str) -> str:
    """A board drawn as TextArena's FrozenLake draws it (``rows``: one character per cell, ``.`` for ice)."""
    line = "+" + "+".join(["-----"] * len(rows)) + "+"
    cells = ["|" + "|".join(f" {'' if c == '.' else c:^3} " for c in row) + "|" for row in rows]
    return "Current Board:\n\n" + "\n".join(x for row in cells for x in (line, row)) + "\n" + line + "\n"


def test_frozen_lake_solver_reads_the_last_board_and_falls_back_without_one():
    from agentrl.envs.bridges.textarena_env import solve_frozen_lake

    def move(text: str) -> str:
        return solve_frozen_lake([{"role": "user", "content": "old"}, {"role": "assistant", "content": "[up]"},
                                  {"role": "user", "content": text}])

    assert move(_board("PH.", ".H.", "..G")) == "[down]"
    assert move(_board(".H.", ".H.", "P.G")) == "[right]"
    assert move(_board("P..", "..H", ".HG") + "You moved.\n" + _board("...", "...", "PHG")) == "[up]"
    assert move(_board("...", ".P.", "...")) == "[down]"  # no goal on it: nothing to solve
    assert move("The game is over.") == "[down]"
    assert solve_frozen_lake([]) == "[down]"
