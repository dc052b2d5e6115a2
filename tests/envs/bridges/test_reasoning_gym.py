"""reasoning-gym datasets as agentrl envs (the real reasoning-gym package): ids resolved by family, seeds,
scoring by the library's own ``score_answer``, the global-RNG lock, ``agentrl envs check`` and 64 episodes at once
through the manager."""

from __future__ import annotations

import hashlib
import random
import threading
import time

import numpy as np
import pytest

import agentrl
from agentrl import registration
from agentrl.cli import main
from agentrl.commands.envs import parse_env_kwargs
from agentrl.envs.bridges.reasoninggym import dataset_names, scorer_evaluates
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig

import reasoning_gym  # noqa: E402  the reasoning-gym extra (setup.sh installs it)

pytestmark = pytest.mark.timeout(300)

LEGS = "reasoning_gym/leg_counting"


def test_family_ids_resolve_on_first_use_and_unknown_names_get_hints():
    env = agentrl.make(LEGS)
    assert env.unwrapped.name == "leg_counting" and LEGS in agentrl.registered_ids("reasoning_gym")
    with pytest.raises(agentrl.RegistrationError, match="did you mean 'reasoning_gym/leg_counting'"):
        agentrl.make("reasoning_gym/leg_countin")
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['legs'\]; valid: \['max_animals'"):
        agentrl.make(LEGS, legs=3)


def test_a_family_whose_library_is_missing_names_the_extra():
    registration.register_family("test_missing_lib", "no_such_module_xyz:Env", name_kwarg="name",
                                 names="no_such_module_xyz:names", extra="no-such-extra")
    try:
        with pytest.raises(agentrl.RegistrationError, match=r"pip install 'agentrl\[no-such-extra\]'"):
            agentrl.make("test_missing_lib/anything")
    finally:
        registration._families.pop("test_missing_lib")


def test_seed_picks_the_entry_and_task_key_is_the_content():
    a, b = agentrl.make(LEGS), agentrl.make(LEGS)
    obs_a, info_a = a.reset(seed=7)
    obs_b, info_b = b.reset(seed=7)
    assert obs_a == obs_b and info_a["index"] == 7
    question = obs_a[-1]["content"]
    assert info_a["task_key"] == f"{LEGS}:{hashlib.sha256(question.encode()).hexdigest()[:16]}"
    # the entry is reasoning-gym's own item 7 of the dataset with seed 0
    assert question == reasoning_gym.create_dataset("leg_counting", seed=0)[7]["question"]
    _, info_c = a.reset(seed=8)
    assert info_c["task_key"] != info_a["task_key"]
    # size bounds the pool: seed 507 is entry 7 again at the default size 500
    assert a.reset(seed=507)[1]["task_key"] == info_a["task_key"]
    # the env contract's task_key(seed): the same key, without a reset; seeds on one entry share it
    assert a.unwrapped.task_key(7) == a.unwrapped.task_key(507) == info_a["task_key"] != a.unwrapped.task_key(8)
    # the config changes the content (dataset_seed is the library config's seed)
    assert agentrl.make(LEGS, dataset_seed=1).reset(seed=7)[1]["task_key"] != info_a["task_key"]


def test_reward_is_the_librarys_score_answer():
    env = agentrl.make(LEGS)
    obs, _ = env.reset(seed=3)
    gold = env.unwrapped.entry["answer"]
    _, reward, terminated, truncated, info = env.step(f"thinking... <answer>{gold}</answer>")
    assert (reward, terminated, truncated, info["correct"], info["invalid_action"]) == (1.0, True, False, True, False)
    env.reset(seed=3)
    obs, reward, terminated, _, info = env.step(f"<answer>{int(gold) + 1}</answer>")
    assert reward == 0.0 and terminated and f"expected answer is {gold}" in obs[0]["content"]
    env.reset(seed=3)
    obs, reward, _, _, info = env.step(gold)  # no tags: reasoning-gym's evaluation scores None
    assert reward == 0.0 and info["invalid_action"] and "No <answer>" in obs[0]["content"]
    # a dataset whose scorer gives partial credit passes it through unchanged
    env = agentrl.make("reasoning_gym/spell_backward")
    env.reset(seed=0)
    entry = env.unwrapped.entry
    answer = entry["answer"][:-1] + "?"
    _, reward, *_ = env.step(f"<answer>{answer}</answer>")
    with_lib = reasoning_gym.create_dataset("spell_backward", seed=0).score_answer(answer, entry)
    assert reward == pytest.approx(with_lib)


def test_global_rng_generators_are_reproducible_and_do_not_move_the_callers_rng():
    """list_functions draws from the process-global random; pool_matrix seeds numpy's. Under the bridge's lock
    both give the same entry whatever the global state, on any thread, and leave the caller's state alone."""
    # entry 0 of list_functions is one that reasoning-gym draws from the global random (as are 31 and 38)
    want = {name: agentrl.make(f"reasoning_gym/{name}").reset(seed=0)[0] for name in ("list_functions", "pool_matrix")}
    random.seed(123)
    np.random.seed(123)
    before = (random.getstate(), np.random.get_state()[1].copy())
    got: dict[tuple[str, int], object] = {}

    def play(name: str, i: int) -> None:
        random.random()  # other threads move the global generator between resets
        got[(name, i)] = agentrl.make(f"reasoning_gym/{name}").reset(seed=0)[0]

    threads = [threading.Thread(target=play, args=(name, i)) for i in range(8) for name in want]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(obs == want[name] for (name, _), obs in got.items()) and len(got) == 16
    random.seed(123)
    np.random.seed(123)
    agentrl.make("reasoning_gym/list_functions").reset(seed=0)
    agentrl.make("reasoning_gym/pool_matrix").reset(seed=3)  # seeds numpy's global generator inside
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()


def test_envs_check_accepts_env_kwargs(capsys):
    assert parse_env_kwargs(["max_animals=3", "name=abc", "xs=[1, 2]", "flag=true", "empty="]) == {
        "max_animals": 3, "name": "abc", "xs": [1, 2], "flag": True, "empty": ""}
    with pytest.raises(ValueError, match="must be a Python identifier"):
        parse_env_kwargs(["bad key=1"])
    assert main(["envs", "check", LEGS, "reasoning_gym/list_functions", "size=50"]) == 0
    out = capsys.readouterr().out
    assert f"PASS  {LEGS}" in out and "solver: return 1 in 1 step" in out and out.rstrip().endswith("2 passed, 0 failed")
    assert main(["envs", "check", LEGS, "max_animals=banana"]) == 1  # the library's own config validation
    assert "FAIL" in capsys.readouterr().out


def test_envs_list_shows_the_family_and_its_names(capsys):
    assert main(["envs", "list"]) == 0
    assert "reasoning_gym/<name>" in capsys.readouterr().out
    assert main(["envs", "list", "--family", "reasoning_gym"]) == 0
    names = capsys.readouterr().out.split()
    assert LEGS in names and len(names) == len(reasoning_gym.factory.DATASETS)


async def test_64_episodes_at_once_through_the_manager_are_reproducible():
    env = agentrl.make(LEGS)
    oracle = env.unwrapped.oracle_policy()
    specs = [EpisodeSpec(LEGS, seed=s) for s in range(64)]
    async with EnvManager(ManagerConfig(max_concurrency=64), oracle) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs)
    assert [t.error for t in first + again] == [None] * 128
    assert all(t.reward == 1.0 and t.num_turns == 1 and t.termination == "terminated" for t in first + again)
    assert [t.messages[:2] for t in first] == [t.messages[:2] for t in again]
    assert len({t.messages[1]["content"] for t in first}) > 50  # distinct questions, not one repeated
    expected = [env.reset(seed=s)[1]["task_key"] for s in range(64)]
    assert [t.info["task_key"] for t in first] == expected


def test_make_records_the_given_kwargs_in_the_spec():
    """gymnasium's check_env rebuilds the env from ``env.spec``: before, the spec held the registered kwargs only, so
    an env made with kwargs (an OpenEnv client's url) was rebuilt without them and the check failed."""
    env = agentrl.make(LEGS, max_animals=3)
    assert env.unwrapped.spec.kwargs == {"dataset": "leg_counting", "max_animals": 3}
    assert env.unwrapped.spec.make().unwrapped.config["max_animals"] == 3
    assert agentrl.make(LEGS).unwrapped.spec is agentrl.spec(LEGS)  # no kwargs: the registered spec itself


def test_check_all_skips_only_envs_whose_constructor_needs_kwargs():
    from agentrl.commands.envs import _required_kwargs

    assert _required_kwargs("openenv/Client-v0", {}) == ["url"]
    assert _required_kwargs("openenv/Client-v0", {"url": "http://127.0.0.1:1"}) == []
    assert _required_kwargs(LEGS, {}) == []  # its one required argument is the registered dataset
    assert _required_kwargs("mcp/Tools-v0", {}) == []  # runs its bundled demo server


def test_enum_fields_take_their_values_as_strings_and_name_the_choices_when_wrong():
    # A config or command line gives strings; aiw's task_types are a list of its TaskType enum.
    env = agentrl.make("reasoning_gym/aiw", task_types=["siblings"], task_type_weights=[1.0], size=50)
    obs, info = env.reset(seed=3)
    assert "sisters" in obs[-1]["content"] and "brother" in obs[-1]["content"]
    assert env.step(f"<answer>{env.unwrapped.entry['answer']}</answer>")[1] == 1.0
    with pytest.raises(ValueError, match=r"task_types.*'cousins'.*siblings"):
        agentrl.make("reasoning_gym/aiw", task_types=["cousins"])


# Scorers that run the model's answer as code: eval (binary_matrix, ...) or sympy's parse_expr (countdown, ...).
EVALUATING = {"binary_matrix", "countdown", "intermediate_integration", "n_queens", "polynomial_multiplication",
              "puzzle24", "simple_integration", "spiral_matrix", "string_insertion"}


def test_scorers_that_evaluate_answers_are_found_from_their_source():
    assert EVALUATING <= {n for n in dataset_names() if scorer_evaluates(n)}
    assert not scorer_evaluates("leg_counting")


@pytest.mark.parametrize("name", ["binary_matrix", "countdown", "spiral_matrix"])
def test_an_answer_that_is_code_is_never_run(tmp_path, name):
    """Without the check, binary_matrix's eval and countdown's parse_expr run this answer in the trainer's process."""
    marker = tmp_path / "pwned"
    env = agentrl.make(f"reasoning_gym/{name}")
    env.reset(seed=0)
    _, reward, done, _, info = env.step(f"<answer>__import__('pathlib').Path({str(marker)!r}).write_text('x')</answer>")
    assert not marker.exists()
    assert reward == 0.0 and done and info["score_error"].startswith("answer refused: a call of 'Attribute'")


def test_an_answer_that_would_stall_the_scorer_is_refused_at_once():
    """sympy turned 1e999999 into a Float and took 326 s over it, holding the bridges' lock all along."""
    env = agentrl.make("reasoning_gym/countdown")
    for answer in ("1e999999", "9**9**9**9**9", "factorial(10**8)"):
        env.reset(seed=0)
        t0 = time.monotonic()
        _, reward, *_, info = env.step(f"<answer>{answer}</answer>")
        assert reward == 0.0 and "refused" in info["score_error"] and time.monotonic() - t0 < 30


@pytest.mark.parametrize("name", sorted(EVALUATING))
def test_gold_answers_and_plain_expressions_still_score(name):
    env = agentrl.make(f"reasoning_gym/{name}")
    oracle = env.unwrapped
    for seed in range(12):
        env.reset(seed=seed)
        _, reward, *_, info = env.step(oracle.solve([]))
        assert reward == 1.0, (seed, info.get("score_error"))
    if name == "binary_matrix":  # the scorer's own partial credit for a Python list of lists still reaches it
        env.reset(seed=0)
        rows = oracle.entry_at(0)["answer"].splitlines()
        listed = repr([[int(v) for v in r.split()] for r in rows])
        assert env.step(f"<answer>{listed}</answer>")[1] == 0.1
