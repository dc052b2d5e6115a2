"""The BFCL env: data loading from the installed bfcl-eval package, the AST grader on crafted cases, and the
oracle / empty / wrong policies over every item of every covered category."""

from __future__ import annotations

import pytest

from agentrl.envs import bfcl
from agentrl.policy import EpisodeMeta
from agentrl.tools import ToolCall


def _item(answers, functions, category="simple"):
    return bfcl.BFCLItem(id="x_0", category=category, messages=({"role": "user", "content": "q"},),
                         functions=tuple(functions), answers=tuple(answers))


AREA = {
    "name": "area",
    "description": "d",
    "parameters": {
        "type": "dict",
        "properties": {
            "base": {"type": "integer"},
            "height": {"type": "float"},
            "unit": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "opts": {"type": "dict", "properties": {"k": {"type": "string"}}},
        },
        "required": ["base", "height"],
    },
}
AREA_ANSWER = {"area": {"base": [10], "height": [5.0], "unit": ["square meters", ""], "tags": [["A b", "c"], ""],
                        "opts": [{"k": ["Yes"]}, ""]}}


def grade(calls, answers=(AREA_ANSWER,), functions=(AREA,), category="simple"):
    return bfcl.grade(_item(answers, functions, category), [ToolCall(n, a) for n, a in calls])


def test_grader_accepts_exact_and_normalised_values():
    assert grade([("area", {"base": 10, "height": 5.0})]) is None
    # int for a float parameter; string normalisation (case, spaces, punctuation); optional params given.
    assert grade([("area", {"base": 10, "height": 5, "unit": "Square-Meters", "tags": ["a_b", "C"],
                            "opts": {"k": "yes"}})]) is None


@pytest.mark.parametrize(
    "calls, error_type",
    [
        ([("volume", {"base": 10, "height": 5.0})], "wrong_func_name"),
        ([("area", {"height": 5.0})], "missing_required"),
        ([("area", {"base": 10, "height": 5.0, "color": "red"})], "unexpected_param"),
        ([("area", {"base": 10.0, "height": 5.0})], "type_error"),  # a float where the doc says integer
        ([("area", {"base": True, "height": 5.0})], "type_error"),  # bool is not an integer
        ([("area", {"base": "10", "height": 5.0})], "type_error"),
        ([("area", {"base": 11, "height": 5.0})], "value_error"),
        ([("area", {"base": 10, "height": 5.0, "unit": "feet"})], "value_error:string"),
        ([("area", {"base": 10, "height": 5.0, "tags": ["c", "a b"]})], "value_error:list"),  # order matters
        ([("area", {"base": 10, "height": 5.0, "opts": {"k": "no"}})], "value_error:dict_value"),
        ([("area", {"base": 10, "height": 5.0, "opts": {"z": "Yes"}})], "value_error:dict_key"),
        ([], "wrong_count"),
        ([("area", {"base": 10, "height": 5.0})] * 2, "wrong_count"),
    ],
)
def test_grader_rejects_with_reason(calls, error_type):
    bad = grade(calls)
    assert bad is not None and bad.error_type == error_type, bad
    assert bad.error


def test_grader_requires_non_optional_answer_params():
    answer = {"area": {"base": [10], "height": [5.0], "unit": ["cm"]}}
    bad = grade([("area", {"base": 10, "height": 5.0})], answers=(answer,))
    assert bad is not None and bad.error_type == "missing_param"


def test_parallel_matches_multiset_in_any_order():
    f = {"name": "play", "parameters": {"type": "dict", "properties": {"artist": {"type": "string"},
                                                                    "minutes": {"type": "integer"}},
                                        "required": ["artist"]}}
    answers = ({"play": {"artist": ["Taylor Swift"], "minutes": [20]}}, {"play": {"artist": ["Maroon 5"], "minutes": [15, ""]}})
    a = ("play", {"artist": "taylor swift", "minutes": 20})
    b = ("play", {"artist": "Maroon 5"})
    assert grade([a, b], answers, [f], "parallel") is None
    assert grade([b, a], answers, [f], "parallel") is None
    # The same call twice is not the multiset.
    bad = grade([a, a], answers, [f], "parallel")
    assert bad is not None and bad.error_type.startswith("parallel:no_match") and "expected call 1" in bad.error
    # A greedy matcher fails here (b' fits both answers; a perfect matching exists).
    loose = ({"play": {"artist": ["Maroon 5", "Taylor Swift"]}}, {"play": {"artist": ["Maroon 5"]}})
    assert grade([("play", {"artist": "Maroon 5"}), ("play", {"artist": "Taylor Swift"})], loose, [f], "parallel") is None


def test_irrelevance_is_correct_only_without_calls():
    item = _item([], [AREA], "irrelevance")
    assert bfcl.grade(item, []) is None
    assert bfcl.grade(item, [ToolCall("area", {"base": 1, "height": 1.0})]).error_type == "irrelevance:called"


def test_env_prompt_info_and_malformed_action():
    env = bfcl.BFCLEnv("parallel")
    obs, info = env.reset(options={"index": 3})
    assert info["id"] == "parallel_3" and info["index"] == 3
    assert obs[0]["role"] == "system" and obs[1]["role"] == "user"
    schema = info["tools"][0]
    assert schema["type"] == "function" and schema["function"]["parameters"]["type"] == "object"
    # By default the chat template renders info["tools"]; the prompt does not list them a second time.
    assert "<tools>" not in obs[0]["content"] and schema["function"]["name"] not in obs[0]["content"]
    listed = bfcl.BFCLEnv("parallel", tools_in_prompt=True).reset(options={"index": 3})[0][0]["content"]
    assert "<tools>" in listed and schema["function"]["name"] in listed and "<tool_call>" in listed
    # A malformed tool call is an observation with reward 0, never an exception.
    _, r, term, trunc, info = env.step("<tool_call>{not json</tool_call>")
    assert (r, term, trunc) == (0.0, True, False) and info["error_type"] == "parse_error"
    # Stepping a finished episode is reported, not raised.
    _, r, term, _, info = env.step("x")
    assert r == 0.0 and term and info["error_type"] == "not_running"
    with pytest.raises(ValueError, match="index"):
        env.reset(options={"index": 10_000})
    # Seeds pick items deterministically.
    assert env.reset(seed=7)[1]["id"] == env.reset(seed=7)[1]["id"] == "parallel_7"


def test_data_loads_from_installed_package_and_defects_are_few():
    root = bfcl.data_dir()
    assert (root / "BFCL_v4_simple_python.json").is_file()
    sizes = {c: len(bfcl.load_category(c)) for c in bfcl.CATEGORIES}
    assert sizes["simple"] == 400 and sizes["multiple"] == 200 and sizes["parallel"] == 200
    dropped = {c: sizes[c] - len(bfcl.items_of(c)) for c in bfcl.CATEGORIES}
    assert sum(dropped.values()) == 5 and dropped["simple"] == dropped["multiple"] == dropped["parallel"] == 0


@pytest.mark.parametrize("category", list(bfcl.CATEGORIES))
def test_oracle_scores_all_and_wrong_and_empty_score_none(category):
    """Every item of the category (all of them, 2,586 in total: about a second)."""
    env_id = next(k for k, v in bfcl.ENV_IDS.items() if v == category)
    env = bfcl.BFCLEnv(category)
    listed = bfcl.BFCLEnv(category, tools_in_prompt=True)
    oracle = wrong = empty = 0
    for i in range(env.num_tasks):
        obs, info = env.reset(options={"index": i})
        meta = EpisodeMeta("t", "g", env_id, None, task={"instance_id": info["id"], "index": i})
        oracle += env.step(bfcl.oracle_action(obs, meta))[1]
        # The conversation alone identifies the item when the prompt lists the functions.
        assert bfcl.BFCLEnv.solve(listed.reset(options={"index": i})[0]) == bfcl.oracle_text(env.item)
        env.reset(options={"index": i})
        wrong += env.step(bfcl.wrong_action(obs, meta))[1]
        env.reset(options={"index": i})
        empty += env.step("")[1]
    assert oracle == env.num_tasks
    assert wrong == 0
    # The empty answer calls nothing, which is exactly right on irrelevance items only.
    assert empty == (env.num_tasks if category == "irrelevance" else 0)


def test_registered_ids_make_through_gymnasium():
    bfcl.register_all()
    import agentrl

    env = agentrl.make("agentrl/BFCL-multiple-v0")
    obs, info = env.reset(seed=0)
    _, r, term, _, _ = env.step(bfcl.oracle_text(env.unwrapped.item))
    assert r == 1.0 and term
    from gymnasium.utils.env_checker import check_env

    check_env(bfcl.BFCLEnv("simple"), skip_render_check=True)


def test_oracle_calls_round_trip_through_text():
    from agentrl.tools import parse_tool_calls

    item = bfcl.load_category("parallel_multiple")[0]
    parsed = parse_tool_calls(bfcl.oracle_text(item))
    assert not parsed.errors and len(parsed.calls) == len(item.answers)
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in bfcl.oracle_calls(item)]


def test_oracle_finds_item_from_task_or_conversation():
    items = bfcl.load_category("live_simple")
    # live_simple_32-9-0 and live_simple_33-10-0 share question and function names: the task id disambiguates.
    a, b = (next(it for it in items if it.id == i) for i in ("live_simple_32-9-0", "live_simple_33-10-0"))
    convo = bfcl.prompt_messages(b)
    meta = EpisodeMeta("t", "g", "agentrl/BFCL-live-simple-v0", None, task={"instance_id": b.id, "index": 33})
    assert bfcl.oracle_action(convo, meta) == bfcl.oracle_text(b)
    # The env's oracle policy uses the task the runner passes.
    import asyncio

    session = bfcl.BFCLEnv("live_simple").oracle_policy().session(meta)
    assert asyncio.run(session.act(convo)).text == bfcl.oracle_text(b)
    with pytest.raises(ValueError, match="matches no BFCL"):
        bfcl.oracle_action([{"role": "user", "content": "no such question"}],
                           EpisodeMeta("t", "g", "agentrl/BFCL-simple-v0", None))
