"""The BFCL envs against the installed bfcl-eval: its categories and denominators, the oracle on every item of
every category (single- and multi-turn, both answer formats), the official empty score, a differential sample of
perturbed answers graded by the env and by bfcl-eval's own runners, the answer formats' decoding rules, the
multi-turn episode mechanics, the eval-time code screens, and the leaderboard aggregation."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.envs.bfcl import categories, differential, oracle, scoring
from agentrl.envs.bfcl.data import load_category
from agentrl.envs.bfcl.formats import get_format, handler_of
from agentrl.envs.bfcl.grading import drop_instances, new_model_name
from agentrl.envs.bfcl.multi_turn import REFUSED, BFCLMultiTurnEnv
from agentrl.envs.bfcl.official import load
from agentrl.envs.bfcl.single_turn import BFCLEnv
from agentrl.policy import EpisodeMeta

FORMATS = ("qwen_fc", "prompt")

# Items of bfcl-eval 2026.3.23 that no answer can pass in its own checker (every model scores 0 on them; they
# stay in the denominators, as on the leaderboard).
UNANSWERABLE = {
    # ArrayList with item type "any": the Java converter keeps every item a string, the answer has ints/bools.
    "simple_java_36": "value_error:list/tuple",
    "simple_java_65": "value_error:list/tuple",
    # A required array parameter whose allowed values are [] (nothing is "in" an empty list).
    "live_simple_106-63-0": "type_error:simple",
    "live_simple_112-68-0": "type_error:simple",
    # The answer has a parameter the function does not declare / lacks one the function requires.
    "live_multiple_862-181-3": "simple_function_checker:unexpected_param",
    "live_multiple_964-207-0": "simple_function_checker:missing_required",
}


def bfcl():
    return load()


# ---------------------------------------------------------------------------------------------------------------
# Categories, data, import


def test_categories_are_the_leaderboards_and_registered():
    mapping = bfcl().categories
    assert categories.NON_LIVE == tuple(mapping.NON_LIVE_CATEGORY)
    assert categories.LIVE == tuple(mapping.LIVE_CATEGORY)
    assert categories.MULTI_TURN == tuple(mapping.MULTI_TURN_CATEGORY)
    import agentrl
    from agentrl.eval import SUITES

    assert set(SUITES["bfcl"]) == set(categories.ENV_IDS) and len(categories.ENV_IDS) == 17
    env = agentrl.make("agentrl/BFCL-multi-turn-miss-func-v0")
    assert isinstance(env.unwrapped, BFCLMultiTurnEnv) and env.unwrapped.category == "multi_turn_miss_func"
    env = agentrl.make("agentrl/BFCL-simple-javascript-v0", format="prompt")
    assert env.unwrapped.fmt.name == "prompt" and env.spec.max_episode_steps == 1
    with pytest.raises(ValueError, match="unknown BFCL answer format 'xml'.*prompt"):
        BFCLEnv("simple_python", format="xml")
    with pytest.raises(ValueError, match="multi-turn ones"):
        BFCLEnv("multi_turn_base")


@pytest.mark.parametrize("category", categories.ALL)
def test_every_item_is_served_in_file_order(category):
    """No item is dropped: the env's tasks are the data file's lines, in order (the official denominators)."""
    path = Path(bfcl().utils.PROMPT_PATH) / f"BFCL_v4_{category}.json"
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]
    cls = BFCLMultiTurnEnv if category in categories.MULTI_TURN else BFCLEnv
    assert cls(category).task_ids() == ids


def test_import_shim_has_no_lasting_stand_ins_and_writes_to_the_cache(tmp_path):
    code = (
        "import sys, os\n"
        "from agentrl.envs.bfcl.official import load\n"
        "o = load()\n"
        "assert 'bfcl_eval.constants.model_config' not in sys.modules\n"
        "assert 'pandas' not in sys.modules and 'openai' not in sys.modules\n"
        "import openai; assert hasattr(openai, '__file__') and openai.OpenAI.__module__.startswith('openai')\n"
        "print(os.environ['BFCL_PROJECT_ROOT'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "BFCL_PROJECT_ROOT"}
    env["AGENTRL_CACHE_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    root = Path(r.stdout.strip())
    assert root == tmp_path / "bfcl" and (root / "score").is_dir() and (root / "result").is_dir()


# ---------------------------------------------------------------------------------------------------------------
# Oracle and empty policy over every item


@pytest.mark.parametrize("fmt", FORMATS)
def test_oracle_passes_every_answerable_single_turn_item(fmt):
    failed = {}
    for category in categories.SINGLE_TURN:
        env = BFCLEnv(category, format=fmt)
        for i in range(env.num_tasks):
            env.reset(options={"index": i})
            _, reward, term, _, info = env.step(env.oracle_answer(i))
            assert term
            if reward != 1.0:
                failed[info["id"]] = info["error_type"]
    assert failed == UNANSWERABLE


def test_oracle_passes_the_multi_turn_items():
    """Every other item in the FC format, every 8th in the prompt format (all of them, both formats:
    benchmarks/bench_bfcl.py and `agentrl eval configs/eval_bfcl_oracle.yaml`)."""
    for fmt, stride in (("qwen_fc", 2), ("prompt", 8)):
        for category in categories.MULTI_TURN:
            env = BFCLMultiTurnEnv(category, format=fmt)
            for i in range(0, env.num_tasks, stride):
                env.reset(options={"index": i})
                done, steps = False, 0
                while not done:
                    _, reward, done, trunc, info = env.step(env.solve([]))
                    steps += 1
                assert reward == 1.0 and info["correct"], (fmt, info["id"], info["error_type"], info["error"])
                assert len(info["result"]) == env.num_turns and not trunc


def _official_loop_result(category: str, i: int, text: str) -> list:
    """The official inference loop's result for a model that always answers ``text``."""
    handler = differential._scripted_handler(get_format("qwen_fc"), lambda messages: text)
    entry = copy.deepcopy(differential._generation_data(category)[i])
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return handler.inference_multi_turn_prompting(entry, include_input_log=False, exclude_state_log=True)[0]
    finally:
        drop_instances(handler.model_name_underline_replaced)


@pytest.mark.parametrize("category", categories.ALL)
def test_empty_answer_scores_the_official_empty_score(category):
    """The env's mean reward for the empty answer equals the accuracy bfcl-eval's own runner gives a model that
    answers nothing (single turn: every item; multi turn: the first 25 items, results from the official loop)."""
    multi = category in categories.MULTI_TURN
    env = (BFCLMultiTurnEnv if multi else BFCLEnv)(category)
    n = 25 if multi else env.num_tasks
    rewards = []
    for i in range(n):
        env.reset(options={"index": i})
        done, total = False, 0.0
        while not done:
            _, r, done, _, _ = env.step("")
            total += r
        rewards.append(total)
    rows = [(i, _official_loop_result(category, i, "") if multi else "") for i in range(n)]
    model = new_model_name("empty")
    try:
        official = differential.official_verdicts(category, env.fmt, rows, model)
    finally:
        drop_instances(model)
    assert sum(rewards) / n == sum(official) / n
    assert sum(official) == (n if "irrelevance" in category else 0)


# ---------------------------------------------------------------------------------------------------------------
# Differential sample (the full run: benchmarks/bench_bfcl.py --differential)


def test_differential_sample_agrees_with_the_official_runners():
    single = differential.run_single_turn(categories.SINGLE_TURN, FORMATS, items=1, seed=1)
    multi = differential.run_multi_turn(categories.MULTI_TURN, FORMATS, items=1, seed=1)
    for tally in (single, multi):
        assert tally.candidates > 100 and 0 < tally.valid < tally.candidates  # both verdicts are exercised
        assert tally.agreement >= 0.999, tally.disagreements[:10]
    # Multi-turn: the env segments turns and steps, and feeds back tool results, exactly as the official loop.
    assert multi.results_equal == multi.candidates


# ---------------------------------------------------------------------------------------------------------------
# Answer formats: the official handlers' rules, through the env


def _grade(category: str, fmt: str, text: str, index: int = 0) -> dict:
    env = BFCLEnv(category, format=fmt)
    env.reset(options={"index": index})
    return env.step(text)[4]


def test_qwen_fc_format_follows_the_official_handler():
    args = {"base": 10, "height": 5}
    block = "<tool_call>\n" + json.dumps({"name": "calculate_triangle_area", "arguments": args}) + "\n</tool_call>"
    assert _grade("simple_python", "qwen_fc", block)["correct"]
    # <think> is dropped before decoding; a second, malformed block is skipped, not fatal.
    assert _grade("simple_python", "qwen_fc", "<think>\n<tool_call>\n{}\n</tool_call>\n</think>\n\n" + block)["correct"]
    assert _grade("simple_python", "qwen_fc", block + "\n<tool_call>\n{oops\n</tool_call>")["correct"]
    # Without the newlines inside the tags nothing is decoded; arguments as a JSON string fail decoding.
    flat = block.replace("<tool_call>\n", "<tool_call>").replace("\n</tool_call>", "</tool_call>")
    assert _grade("simple_python", "qwen_fc", flat)["error_type"] == "simple_function_checker:wrong_count"
    as_string = block.replace(json.dumps(args), json.dumps(json.dumps(args)))
    assert _grade("simple_python", "qwen_fc", as_string)["error_type"] == "ast_decoder:decoder_failed"
    # The prompt format's Python calls are not FC answers.
    assert not _grade("simple_python", "qwen_fc", "[calculate_triangle_area(base=10, height=5)]")["correct"]


def test_prompt_format_follows_the_official_handler():
    assert _grade("simple_python", "prompt", "[calculate_triangle_area(base=10, height=5)]")["correct"]
    assert _grade("simple_python", "prompt", "calculate_triangle_area(base=10, height=5)")["correct"]
    info = _grade("simple_python", "prompt", "[calculate_triangle_area(base=10.0, height=5)]")
    assert info["error_type"] == "type_error:simple"
    env = BFCLEnv("simple_python", format="prompt")
    messages, info = env.reset(options={"index": 0})
    assert "tools" not in info and messages[0]["role"] == "system"
    expected = bfcl().handler_utils.formulate_system_prompt(
        bfcl().prompts.DEFAULT_SYSTEM_PROMPT_FORMAT, env.cat.prompt[0]["function"])
    assert messages[0]["content"] == expected and messages[1] == env.cat.prompt[0]["question"][0][0]
    # Java answers are decoded by the tree-sitter Java parser and typed by the Java converter.
    java = BFCLEnv("simple_java", format="prompt")
    java.reset(options={"index": 0})
    ok = java.step('[GeometryPresentation.createPresentation(controller="mapController", parent="mapArea")]')
    assert ok[1] == 1.0


def test_prompts_render_as_the_official_handlers_render_them():
    """With a Qwen chat template (the tiny model's), the env's messages and tools render to exactly the prompt
    the official handler's ``_format_prompt`` builds, in both formats."""
    from transformers import AutoTokenizer

    from agentrl.models import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    for fmt in FORMATS:
        for category, i in (("parallel_multiple", 5), ("live_simple", 3)):
            env = BFCLEnv(category, format=fmt)
            messages, info = env.reset(options={"index": i})
            ours = tok.apply_chat_template(messages, tools=info.get("tools"), add_generation_prompt=True,
                                           tokenize=False)
            assert ours == handler_of(env.fmt)._format_prompt(messages, info.get("tools") or [])


def test_prompt_mode_java_and_js_answers_round_trip_through_the_official_parsers():
    """Any argument value, source string or not (perturbed answers hold ints, lists...), is written so that the
    official Java/JavaScript call parsers read it back."""
    utils = bfcl().handler_utils
    fmt = get_format("prompt")
    for language, parse in (("java", utils.parse_java_function_call), ("js", utils.parse_javascript_function_call)):
        args = {"a": 5, "b": True, "c": [1, 2], "d": "new int[]{1, 2}", "e": 'put("k", 1)', "f": "plain text"}
        text = oracle.render(fmt, [("Api.call", args)], language)
        assert set(parse(text[1:-1])[0]["Api.call"]) == set(args)


def test_single_turn_env_protocol():
    env = BFCLEnv("parallel")
    messages, info = env.reset(options={"index": 3})
    assert info["id"] == "parallel_3" and info["index"] == 3 and info["format"] == "qwen_fc"
    assert info["tools"] == env.cat.prompt[3]["function"]  # BFCL's docs, as the Qwen FC handler sends them
    assert messages == env.cat.prompt[3]["question"][0]
    _, r, term, trunc, info = env.step("<tool_call>\n{not json\n</tool_call>")
    assert (r, term, trunc, info["correct"]) == (0.0, True, False, False) and info["error"]
    _, r, term, _, info = env.step("x")
    assert r == 0.0 and term and info["error_type"] == "not_running"
    assert env.reset(seed=7)[1]["id"] == env.reset(seed=7)[1]["id"] == "parallel_7"
    assert env.reset(options={"id": "parallel_9"})[1]["index"] == 9
    with pytest.raises(ValueError, match="index"):
        env.reset(options={"index": 10_000})
    env.reset(options={"index": 0})
    assert env.step(None)[4]["correct"] is False  # a non-string action is the empty answer
    from gymnasium.utils.env_checker import check_env

    check_env(BFCLEnv("live_relevance"), skip_render_check=True)
    check_env(BFCLMultiTurnEnv("multi_turn_base"), skip_render_check=True)


def test_oracle_policy_finds_the_item_from_the_task():
    import asyncio

    env = BFCLEnv("live_simple")
    i = env.cat.index_of["live_simple_33-10-0"]
    messages, _ = env.reset(options={"index": i})
    meta = EpisodeMeta("t", "g", "agentrl/BFCL-live-simple-v0", None, task={"instance_id": "live_simple_33-10-0"})
    text = asyncio.run(env.oracle_policy().session(meta).act(messages)).text
    assert text == env.oracle_answer(i) and env.step(text)[1] == 1.0
    with pytest.raises(ValueError, match="meta.task"):
        asyncio.run(env.oracle_policy().session(EpisodeMeta("t", "g", "x", None)).act(messages))


# ---------------------------------------------------------------------------------------------------------------
# Multi-turn mechanics


def _play(env: BFCLMultiTurnEnv, answers):
    """Steps ``answers`` (then "Done." until the end); returns the transitions."""
    out, it = [], iter(answers)
    done = False
    while not done:
        obs, r, done, trunc, info = env.step(next(it, oracle.TURN_DONE_TEXT))
        out.append((obs, r, done, info))
    return out


def test_multi_turn_steps_run_on_the_backends_and_turns_advance():
    env = BFCLMultiTurnEnv("multi_turn_base")
    messages, info = env.reset(options={"index": 0})
    assert info["turn"] == 0 and info["num_turns"] == 4 and len(info["tools"]) == len(env.entry["function"])
    call = '<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>'
    obs, r, done, _, info = env.step(call)
    assert obs == [{"role": "tool", "name": "cd(folder='document')", "content": '{"current_working_directory": "document"}'}]
    assert (r, done, info["turn"], info["step"]) == (0.0, False, 0, 1)
    obs, _, _, _, info = env.step("ok")  # no call: the turn ends, the next question arrives
    assert obs == env.entry["question"][1] and info["turn"] == 1
    # A miss_func turn announces the held-out functions with the official wording.
    mf = BFCLMultiTurnEnv("multi_turn_miss_func")
    mf.reset(options={"index": 0})
    held = next(int(k) for k in mf.entry["missed_function"])
    steps = _play(mf, [oracle.TURN_DONE_TEXT] * held)
    prompt = steps[held - 1][0][0]["content"]
    assert prompt.endswith(bfcl().prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)
    assert "'name': 'sort'" in prompt


def test_multi_turn_force_quit_after_the_step_limit():
    env = BFCLMultiTurnEnv("multi_turn_base")
    env.reset(options={"index": 0})
    pwd = '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>'
    limit = bfcl().prompts.MAXIMUM_STEP_LIMIT
    for _ in range(limit):
        assert not env.step(pwd)[2]
    obs, r, done, _, info = env.step(pwd)
    assert done and r == 0.0 and info["force_quit"] and info["error_type"] == "multi_turn:force_terminated"
    assert obs and obs[0]["role"] == "tool"


def test_a_force_quit_in_the_last_turn_is_graded_normally():
    """The official loop stops after 21 executed steps in a turn; in the last turn nothing is missing, so the
    checker grades the episode as usual (here: right, the extra calls change no state), in both reward modes."""
    pwd = '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>'
    for mode in ("episode", "turn"):
        env = BFCLMultiTurnEnv("multi_turn_base", reward=mode)
        env.reset(options={"index": 0})
        total, done = 0.0, False
        while env.turn < env.num_turns - 1:
            total += env.step(env.solve([]))[1]
        total += env.step(env.solve([]))[1]  # the last turn's calls
        while not done:
            _, r, done, _, info = env.step(pwd)
            total += r
        assert info["force_quit"] and info["correct"] and total == pytest.approx(1.0), mode


def test_multi_turn_turn_rewards_sum_to_the_verdict():
    env = BFCLMultiTurnEnv("multi_turn_base", reward="turn")
    env.reset(options={"index": 2})
    n = env.num_turns
    rewards = []
    done = False
    while not done:
        _, r, done, _, info = env.step(env.solve([]))
        rewards.append(r)
    assert sum(rewards) == pytest.approx(1.0) and info["correct"] and sum(1 for r in rewards if r) == n
    # Right first turn, then nothing: 1/n, and the final verdict is wrong.
    env.reset(options={"index": 2})
    first = [env.solve([]), oracle.TURN_DONE_TEXT]
    steps = _play(env, first)
    assert sum(s[1] for s in steps) == pytest.approx(1.0 / n) and not steps[-1][3]["correct"]
    assert steps[1][3]["turn_valid"] is True and steps[2][3]["turn_valid"] is False


def test_a_checker_exception_is_a_wrong_verdict_not_a_crash(monkeypatch):
    import agentrl.envs.bfcl.multi_turn as mt

    def broken(*args, **kwargs):
        return {"valid": False, "error": ["KeyError: 'x'"], "error_type": "checker_exception"}

    monkeypatch.setattr(mt, "grade_multi_turn", broken)
    env = BFCLMultiTurnEnv("multi_turn_base")
    env.reset(options={"index": 0})
    info = _play(env, [])[-1][3]
    assert (info["correct"], info["error_type"], info["error"]) == (False, "checker_exception", "KeyError: 'x'")


def test_multi_turn_episodes_are_isolated_and_release_their_backends():
    """Two episodes of the same item interleaved do not share state, and nothing is left behind."""
    globals_ = bfcl().multi_turn_utils.__dict__
    before = {k for k in globals_ if k.endswith("_instance")}
    a, b = BFCLMultiTurnEnv("multi_turn_base"), BFCLMultiTurnEnv("multi_turn_base")
    a.reset(options={"index": 0})
    b.reset(options={"index": 0})
    mkdir = '<tool_call>\n{"name": "mkdir", "arguments": {"dir_name": "zz_new"}}\n</tool_call>'
    a.step(mkdir)
    obs = b.step(mkdir)[0]  # would fail with "already exists" if b saw a's file system
    assert "Error" not in obs[0]["content"]
    for env in (a, b):
        while not env.step(oracle.TURN_DONE_TEXT)[2]:
            pass
    a.close()
    b.close()
    assert {k for k in globals_ if k.endswith("_instance")} == before


async def test_multi_turn_episode_trains_through_the_agent_loop_and_manager():
    """A multi-turn item as an RL episode: the env manager, the token-in/token-out agent loop with a Qwen chat
    template (the tiny model's) and the env's tools, and an engine that answers with the ground truth's tokens.
    The trajectory validates, only generated tokens are trained on, the tool results are in the token stream,
    and the reward is the official verdict."""
    from transformers import AutoTokenizer

    from agentrl.inference.base import Generation, InferenceEngine
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.models import ensure_tiny_model
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    env = BFCLMultiTurnEnv("multi_turn_miss_param")
    item = 1
    truth = env.cat.answer(item)
    texts = [x for t, calls in enumerate(truth)
             for x in ([env.oracle_answer(item, t, False), oracle.TURN_DONE_TEXT] if calls
                       else [env.oracle_answer(item, t, False)])]

    class GroundTruthEngine(InferenceEngine):
        def __init__(self):
            self.n = 0

        async def generate(self, prompt_ids, params, *, request_id, session_id=None):
            ids = tok(texts[self.n], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            self.n += 1
            return Generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")

        async def update_weights(self, state_dict, version):
            pass

        @property
        def version(self):
            return 0

    policy = AgentLoopPolicy(GroundTruthEngine(), tok, RolloutConfig(max_context_tokens=500_000, max_turns=64,
                                                                     max_tokens_per_turn=100_000))
    spec = EpisodeSpec(env_id="agentrl/BFCL-multi-turn-miss-param-v0", env_kwargs={"reward": "turn"},
                       options={"index": item}, task={"instance_id": env.cat.ids[item]})
    async with EnvManager(ManagerConfig(workers=0, max_concurrency=1, max_turns=64), policy) as mgr:
        (traj,) = await mgr.run_episodes([spec])
    traj.validate()
    assert traj.termination == "terminated" and traj.info["correct"] and traj.reward == pytest.approx(1.0)
    assert traj.num_turns == len(texts)
    text = tok.decode(traj.token_ids)
    assert "<tool_response>" in text and traj.info["result"][0][0] in text
    generated = tok.decode([t for t, m in zip(traj.token_ids, traj.loss_mask) if m])
    assert "<tool_response>" not in generated and json.loads(texts[0].split("\n")[1])["name"] in generated


# ---------------------------------------------------------------------------------------------------------------
# The eval-time code screens


def test_model_text_never_runs_as_code(tmp_path):
    """bfcl-eval evaluates decoded answers with eval(): FC names and argument keys are pasted into call strings,
    and the prompt decoder evaluates arithmetic. None of it may run model code here."""
    marker = tmp_path / "pwned"
    touch = f"__import__('os').system('touch {marker}')"
    imp = f"importlib.import_module('os').system('touch {marker}')"
    env = BFCLMultiTurnEnv("multi_turn_base")
    env.reset(options={"index": 0})
    name_inj = {"name": f"{imp} or ls", "arguments": {}}
    key_inj = {"name": "ls", "arguments": {f"a={imp},b": 1}}
    text = "\n".join("<tool_call>\n" + json.dumps(c) + "\n</tool_call>" for c in (name_inj, key_inj))
    obs = env.step(text)[0]
    assert [m["content"] for m in obs] == [REFUSED, REFUSED]
    steps = _play(env, [])
    assert not steps[-1][3]["correct"]
    prompt_env = BFCLMultiTurnEnv("multi_turn_base", format="prompt")
    prompt_env.reset(options={"index": 0})
    prompt_env.step(f"[cd(folder={imp})]")  # the prompt decoder reads a call without keywords as its text
    assert prompt_env.step(f"[ls(a={touch} + 1)]")[0] == prompt_env.entry["question"][1]  # refused: turn over
    single = BFCLEnv("simple_python", format="prompt")
    single.reset(options={"index": 0})
    info = single.step(f"[calculate_triangle_area(base={touch} + 10, height=5)]")[4]
    assert info["error_type"] == "ast_decoder:decoder_failed" and "refusing" in info["error"]
    assert not marker.exists()
    # Arithmetic on literals is still evaluated, as the official decoder does.
    single.reset(options={"index": 0})
    assert single.step("[calculate_triangle_area(base=5 + 5, height=5)]")[1] == 1.0


def test_safe_call_screen():
    from agentrl.envs.bfcl.safety import is_safe_call

    methods = {"cd", "ls", "mv"}
    assert is_safe_call("cd(folder='a')", methods)
    assert is_safe_call("mv(source=['a', 1, -2.5, {'k': (1, 2)}], destination=ls(a=True))", methods)
    assert is_safe_call("cd(folder=(1+2j))", methods)
    assert is_safe_call("cd(from='a')", methods)  # not an expression: eval cannot compile it either
    for bad in ("rm(path='/')", "cd(folder=open('x'))", "cd(folder=x)", "cd(**{'a': 1})", "cd(folder=2**10**10)",
                "os.system('id')", "cd(folder=[i for i in range(9)])", "(lambda: 1)()", "cd(folder=inf)",
                "cd(folder=ls.__class__)", "[ls(), __import__('os')]"):
        assert not is_safe_call(bad, methods), bad


# ---------------------------------------------------------------------------------------------------------------
# Leaderboard aggregation


def test_scores_are_aggregated_by_the_leaderboard_code():
    def recs(category, correct, total):
        return [{"env_id": categories.env_id(category), "success": k < correct, "info": {"format": "prompt"}}
                for k in range(total)]

    # Live is weighted by item counts, the categories not run count 0 with their full size: 258 right of
    # 258 + 1053 + 16 + 24 live AST items is 19.10 % (an unweighted mean would say 25 %).
    sec = scoring.section(recs("live_simple", 258, 258) + recs("live_multiple", 0, 1053), "m")["prompt"]
    assert sec["leaderboard"]["overall"]["Live Acc"] == "19.10%"
    assert sec["categories"]["live_simple"] == {"correct": 258, "total": 258, "accuracy": 1.0}
    # Non-live: the simple summary is the unweighted mean of Python/Java/JavaScript (shown N/A while one is
    # missing, counted as 0), then the mean of four.
    non_live = scoring.section(recs("simple_python", 400, 400) + recs("multiple", 100, 200), "m")["prompt"][
        "leaderboard"]["non_live"]
    assert non_live["Python Simple AST"] == "100.00%" and non_live["Simple AST"] == "N/A"
    assert non_live["Non-Live Overall Acc"] == "20.83%"  # (1/3 + 1/2 + 0 + 0) / 4
    # Overall: non-live 10, live 10, irrelevance 10, multi-turn 30, agentic 40 (not served: 0).
    every = sum((recs(c, len(load_category(c)), len(load_category(c))) for c in categories.ALL), [])
    sec = scoring.section(every, "m")["prompt"]
    assert sec["complete"] and not sec["missing_categories"]
    assert sec["leaderboard"]["overall"]["Overall Acc"] == "60.00%"
    assert sec["leaderboard"]["multi_turn"]["Multi Turn Overall Acc"] == "100.00%"
    assert "| simple_java | 100 | 100 | 100.00% |" in scoring.render_markdown({"prompt": sec})
