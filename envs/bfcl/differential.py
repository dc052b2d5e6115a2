"""Differential check: the envs' verdicts against ``bfcl_eval``'s own pipeline, on perturbed answers.

The candidates are ground-truth answers (:mod:`.oracle`) perturbed the ways models get them wrong, or almost
right: type swaps (``5`` / ``5.0`` / ``"5"``), dropped and extra arguments, changed values, reordered/duplicated/
dropped parallel calls, ints in float arrays, arguments given as a JSON string, ``<tool_call>`` blocks without
their newlines, malformed extra blocks, ``<think>`` preambles, code fences, positional arguments...

- **agentrl side**: the env, as a policy uses it (``reset`` + ``step`` per candidate; for multi-turn, a scripted
  policy playing a per-turn plan through the episode);
- **official side**, without any agentrl code in the path: the format's handler records the completion
  (``_parse_query_response_prompting``) and ``bfcl_eval.eval_checker.eval_runner.evaluate_task`` grades the batch
  (it loads the questions and answers itself; ``allow_missing=True`` as ``--partial-eval`` does), its score file
  listing the failures. For multi-turn, the answers come from the official inference loop itself
  (``inference_multi_turn_prompting``) run with a scripted model in place of the HTTP call, so the segmentation
  into turns and steps, the tool results fed back and the held-out function prompts are the loop's own.

:func:`run` returns the counts; ``benchmarks/bench_bfcl.py`` runs the full set, ``tests/envs/test_bfcl.py`` a sample.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable

from agentrl.envs.bfcl import oracle
from agentrl.envs.bfcl.data import load_category
from agentrl.envs.bfcl.formats import AnswerFormat, get_format, handler_of
from agentrl.envs.bfcl.grading import drop_instances, new_model_name
from agentrl.envs.bfcl.official import load

Call = tuple[str, dict[str, Any]]


# ---------------------------------------------------------------------------------------------------------------
# Single-turn candidates


def _value_variants(v: Any) -> list[tuple[str, Any]]:
    if isinstance(v, bool):
        return [("bool_as_str", str(v).lower()), ("bool_as_int", int(v)), ("bool_flipped", not v)]
    if isinstance(v, int):
        return [("int_as_float", float(v)), ("int_as_str", str(v)), ("int_changed", v + 1)]
    if isinstance(v, float):
        out = [("float_as_str", str(v)), ("float_changed", v + 0.5)]
        if v.is_integer():
            out.append(("float_as_int", int(v)))
        return out
    if isinstance(v, str):
        out = [("str_upper", v.upper()), ("str_punct", v.replace(" ", "_") + "."), ("str_changed", v + " zz"),
               ("str_as_list", [v]), ("str_empty", "")]
        if v.strip().lstrip("-").isdigit():
            out.append(("str_as_int", int(v)))
        return out
    if isinstance(v, list):
        out = [("list_as_str", json.dumps(v)), ("list_empty", [])]
        if len(v) > 1:
            out += [("list_reversed", v[::-1]), ("list_truncated", v[:-1])]
        if v and all(isinstance(x, float) for x in v):
            out.append(("list_floats_as_ints", [int(x) if float(x).is_integer() else x for x in v]))
        if v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            out.append(("list_ints_as_floats", [float(x) for x in v]))
        if v and all(isinstance(x, str) for x in v):
            out.append(("list_str_upper", [x.upper() for x in v]))
        return out
    if isinstance(v, dict):
        out = [("dict_as_str", json.dumps(v)), ("dict_extra_key", {**v, "zz_extra": 1})]
        if v:
            k = next(iter(v))
            out.append(("dict_key_dropped", {x: y for x, y in v.items() if x != k}))
        return out
    return []


def _optional_extras(answer: Any, calls: list[Call]) -> list[tuple[str, list[Call]]]:
    """Candidates adding the optional parameters the oracle leaves out, with their allowed values."""
    out = []
    for ci, expected in enumerate(answer or []):
        if ci >= len(calls):
            break
        ((_, params),) = expected.items()
        for p, allowed in params.items():
            if p in calls[ci][1] or not isinstance(allowed, list):
                continue
            values = [a for a in allowed if a != ""]
            for k, a in enumerate(values[:2]):
                new = copy.deepcopy(calls)
                new[ci][1][p] = oracle._build(a)
                out.append((f"optional_added_{k}", new))
    return out


def call_variants(calls: list[Call], answer: Any = None) -> list[tuple[str, list[Call]]]:
    """Perturbed call lists: per argument value and call, per call list, and the optional parameters added."""
    out: list[tuple[str, list[Call]]] = [("exact", calls)]
    for ci, (name, args) in enumerate(calls):
        def with_call(new_call: Call) -> list[Call]:
            return [new_call if j == ci else c for j, c in enumerate(calls)]

        out.append(("name_changed", with_call((name + "_v2", args))))
        if "." in name:
            out.append(("name_dots_as_underscores", with_call((name.replace(".", "_"), args))))
        out.append(("extra_arg", with_call((name, {**args, "zz_unknown": "x"}))))
        for p, v in args.items():
            out.append(("arg_dropped", with_call((name, {k: x for k, x in args.items() if k != p}))))
            for label, nv in _value_variants(v):
                out.append((label, with_call((name, {**args, p: nv}))))
    if len(calls) > 1:
        out += [("calls_reversed", calls[::-1]), ("calls_rotated", calls[1:] + calls[:1]),
                ("call_dropped", calls[:-1])]
    if calls:
        out += [("call_duplicated", calls + calls[:1]), ("no_calls", [])]
    out += _optional_extras(answer, calls)
    return out


def _fc_block(name: str, args: Any, key: str = "arguments", newline: bool = True) -> str:
    body = json.dumps({"name": name, key: args})
    return f"<tool_call>\n{body}\n</tool_call>" if newline else f"<tool_call>{body}</tool_call>"


def text_variants(fmt: AnswerFormat, calls: list[Call], language: str) -> list[tuple[str, str]]:
    """Perturbations of how correct calls are written (the calls themselves unchanged)."""
    base = oracle.render(fmt, calls, language)
    out = [("think_preamble", "<think>\nLet me look at the functions.\n</think>\n\n" + base),
           ("text_preamble", "Sure, here you go.\n" + base), ("empty_text", "")]
    if not calls:
        return out
    if fmt.tools_in_template:
        out += [
            ("no_newlines_in_tags", "\n".join(_fc_block(n, a, newline=False) for n, a in calls)),
            ("string_arguments", "\n".join(_fc_block(n, json.dumps(a)) for n, a in calls)),
            ("parameters_key", "\n".join(_fc_block(n, a, key="parameters") for n, a in calls)),
            ("malformed_extra_block", base + "\n<tool_call>\n{not json}\n</tool_call>"),
            ("unclosed_last_block", base[: -len("</tool_call>")]),
            ("one_block_json_list", "<tool_call>\n" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
             + "\n</tool_call>"),
            ("plain_json", json.dumps({"name": calls[0][0], "arguments": calls[0][1]})),
        ]
    else:
        out += [("no_brackets", base[1:-1]), ("code_fence", f"```python\n{base}\n```"),
                ("trailing_text", base + " I hope this helps."), ("json_literals", base.replace("True", "true"))]
        if language == "python":
            name, args = calls[0]
            if args:
                first = next(iter(args))
                pos = f"{name}({args[first]!r}" + "".join(f", {k}={v!r}" for k, v in args.items() if k != first) + ")"
                out.append(("positional_arg", "[" + pos + "]"))
    return out


def single_turn_candidates(category: str, i: int, fmt: AnswerFormat) -> list[tuple[str, str]]:
    """``(label, completion)`` candidates for item ``i`` of a single-turn category, in ``fmt``."""
    cat = load_category(category)
    language = oracle.language_name(category)
    calls = oracle.single_turn_calls(category, cat.checker[i], cat.answer(i))
    if not calls:  # irrelevance: calling something is the mistake
        fn = cat.checker[i]["function"][0] if cat.checker[i]["function"] else {"name": "f"}
        calls_for_variants = [(fn["name"], {})]
        out = [("no_call_text", oracle.NO_CALL_TEXT), ("empty_list", "[]" if not fmt.tools_in_template else "")]
        out += [(f"call:{label}", oracle.render(fmt, c, language)) for label, c in call_variants(calls_for_variants)]
        return out + text_variants(fmt, [], language)
    out = [(label, oracle.render(fmt, c, language)) for label, c in call_variants(calls, cat.answer(i))]
    return out + text_variants(fmt, calls, language)


# ---------------------------------------------------------------------------------------------------------------
# The official side


@functools.lru_cache(maxsize=None)
def _official_data(category: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The questions and answers as ``evaluate_task`` loads them (loaded here, not through :mod:`.data`)."""
    utils = load().utils
    prompt = utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    answers = None if utils.is_relevance_or_irrelevance(category) else utils.load_ground_truth_entry(category)
    return prompt, answers


def official_verdicts(category: str, fmt: AnswerFormat, rows: list[tuple[int, Any]], model: str | None = None
                      ) -> list[bool]:
    """Grades ``rows`` (``(item index, recorded result)``; an item may repeat) with the category's official file
    runner (``ast_file_runner``, ``relevance_file_runner`` or ``multi_turn_runner``, as ``evaluate_task``
    dispatches) and reads its score file. Returns one verdict per row."""
    bfcl = load()
    utils, runner = bfcl.utils, bfcl.runner
    prompt, answers = _official_data(category)
    model = model or "agentrl_differential"
    model_result = [{"id": f"row{k}", "result": r} for k, (_, r) in enumerate(rows)]
    entries = [dict(prompt[i]) for i, _ in rows]  # the multi-turn runner deletes "function" from its entry
    truth = [answers[i] for i, _ in rows] if answers is not None else None
    handler = handler_of(fmt)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        score_dir = Path(tmp)
        if utils.is_relevance_or_irrelevance(category):
            runner.relevance_file_runner(handler, model_result, entries, model, category, score_dir)
        elif utils.is_multi_turn(category):
            runner.multi_turn_runner(handler, model_result, entries, truth, model, category, score_dir)
        else:
            runner.ast_file_runner(handler, model_result, entries, truth, category, model, score_dir)
        path = (score_dir / model / utils.get_directory_structure_by_category(category)
                / utils.get_file_name_by_category(category, is_score_file=True))
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    failed = {r["id"] for r in lines[1:]}
    return [r["id"] not in failed for r in model_result]


def recorded(fmt: AnswerFormat, text: str) -> str:
    """The handler's ``_parse_query_response_prompting`` on a completion (what BFCL stores as the result)."""
    response = SimpleNamespace(choices=[SimpleNamespace(text=text)],
                               usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0))
    return handler_of(fmt)._parse_query_response_prompting(response)["model_responses"]


# ---------------------------------------------------------------------------------------------------------------
# Multi turn: plans, the official loop, the env


class PlanResponder:
    """A scripted model playing ``plan[turn][step]``: the turn advances when a user message arrived since its last
    answer; past the end of a turn's plan it answers without calls. Works on the official loop's message list and
    on the env's conversation alike (both append the model's own answer)."""

    def __init__(self, plan: list[list[str]]):
        self.plan, self.turn, self.step, self.seen = plan, -1, 0, 0

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        new = messages[self.seen:]
        if self.turn < 0 or any(m.get("role") == "user" for m in new):
            self.turn, self.step = self.turn + 1, 0
        else:
            self.step += 1
        self.seen = len(messages) + 1
        steps = self.plan[self.turn] if self.turn < len(self.plan) else []
        return steps[self.step] if self.step < len(steps) else oracle.TURN_DONE_TEXT


def multi_turn_plans(category: str, i: int, fmt: AnswerFormat, rng: random.Random) -> list[tuple[str, list[list[str]]]]:
    """``(label, plan)`` per perturbation of item ``i``'s ground truth (``plan[turn]`` = answers of its steps)."""
    cat = load_category(category)
    entry, truth = cat.prompt[i], cat.answer(i)
    turns = [[oracle.multi_turn_call(c, entry["involved_classes"]) for c in t] for t in truth]

    def render(calls: list[Call]) -> str:
        return oracle.render(fmt, calls)

    def plan_of(ts: list[list[Call]]) -> list[list[str]]:
        return [[render(t), oracle.TURN_DONE_TEXT] if t else [oracle.NO_CALL_TEXT] for t in ts]

    busy = [k for k, t in enumerate(turns) if t]
    k = rng.choice(busy) if busy else 0
    out = [("oracle", plan_of(turns)),
           ("one_call_per_step", [[render([c]) for c in t] + [oracle.TURN_DONE_TEXT] if t else [oracle.NO_CALL_TEXT]
                                  for t in turns])]

    def edit(fn: Callable[[list[Call]], list[Call]]) -> list[list[str]]:
        return plan_of([fn(list(t)) if j == k else t for j, t in enumerate(turns)])

    if busy:
        out += [("call_dropped", edit(lambda t: t[:-1])), ("calls_reversed", edit(lambda t: t[::-1])),
                ("call_duplicated", edit(lambda t: t + t[:1])), ("turn_skipped", edit(lambda t: []))]
        name, args = turns[k][-1]
        if args:
            p = next(iter(args))
            v = args[p]
            changed = v + 1 if isinstance(v, (int, float)) and not isinstance(v, bool) else "zz_changed"
            out.append(("value_changed", edit(lambda t: t[:-1] + [(name, {**args, p: changed})])))
            out.append(("arg_dropped", edit(lambda t: t[:-1] + [(name, {q: x for q, x in args.items() if q != p})])))
        steps = plan_of(turns)
        bad_first = ("<tool_call>\n{not json\n</tool_call>" if fmt.tools_in_template else "[broken(")
        out.append(("malformed_step_first", [[bad_first] + s if j == k else s for j, s in enumerate(steps)]))
        think = "<think>\nplanning\n</think>\n\n"
        out.append(("think_preamble", [[think + x for x in s] for s in steps]))
        out.append(("stop_halfway", [s if j < len(steps) // 2 else [oracle.NO_CALL_TEXT] for j, s in enumerate(steps)]))
        first = render(turns[k][:1])
        out.append(("force_quit", [s if j != k else [first] * 22 for j, s in enumerate(steps)]))
        if fmt.tools_in_template:
            strs = "\n".join(_fc_block(n, json.dumps(a)) for n, a in turns[k])
            out.append(("string_arguments", [s if j != k else [strs, oracle.TURN_DONE_TEXT]
                                             for j, s in enumerate(steps)]))
            nonl = "\n".join(_fc_block(n, a, newline=False) for n, a in turns[k])
            out.append(("no_newlines_in_tags", [s if j != k else [nonl, oracle.TURN_DONE_TEXT]
                                                for j, s in enumerate(steps)]))
    empty = [j for j, t in enumerate(turns) if not t]
    if empty and busy:
        j = empty[0]
        nxt = next((t for t in turns[j:] if t), turns[busy[0]])
        out.append(("call_in_no_call_turn", plan_of([nxt if x == j else t for x, t in enumerate(turns)])))
    return out


def _scripted_handler(fmt: AnswerFormat, responder: PlanResponder) -> Any:
    """The format's official handler, under a model name of its own, with its HTTP completion
    (``_query_prompting``) replaced by ``responder`` on the instance (the class's metaclass forbids subclassing
    without ``overrides``' decorator)."""
    base = load().handler_class(fmt.handler)
    handler = base(model_name=new_model_name("agentrl_diff"), temperature=0.0, registry_name=fmt.registry_name,
                   is_fc_model=fmt.tools_in_template)

    def query(inference_data: dict) -> tuple[Any, float]:
        text = responder(inference_data["message"])
        return SimpleNamespace(choices=[SimpleNamespace(text=text)],
                               usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0)), 0.0

    handler._query_prompting = query
    handler.tool_results = []  # every execution result the loop feeds back, in order
    add = handler._add_execution_results_prompting

    def add_results(inference_data: dict, results: list[str], response: dict) -> dict:
        handler.tool_results.extend(results)
        return add(inference_data, results, response)

    handler._add_execution_results_prompting = add_results
    return handler


def official_multi_turn(category: str, i: int, fmt: AnswerFormat, plan: list[list[str]]
                        ) -> tuple[list, bool, list[str]]:
    """Runs the official inference loop with a scripted model playing ``plan`` on item ``i`` (the question as
    generation loads it: ``load_dataset_entry``), then grades its result with ``multi_turn_runner``. Returns
    ``(result, valid, the execution results the loop fed back)``."""
    handler = _scripted_handler(fmt, PlanResponder(plan))
    entry = copy.deepcopy(_generation_data(category)[i])
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            result, _ = handler.inference_multi_turn_prompting(entry, include_input_log=False, exclude_state_log=True)
    finally:
        drop_instances(handler.model_name_underline_replaced)
    model = new_model_name("agentrl_diff_grade")
    try:
        valid = official_verdicts(category, fmt, [(i, result)], model)[0]
    finally:
        drop_instances(model)
    return result, valid, handler.tool_results


def _generation_data(category: str) -> tuple[dict[str, Any], ...]:
    # The entries generation runs on: load_dataset_entry(category), as .data loads them for the envs (it is the
    # same call; the grading side loads its own copy, as evaluate_task does).
    return load_category(category).prompt


def env_multi_turn(env: Any, i: int, plan: list[list[str]]) -> tuple[list, bool, list[str]]:
    """Plays ``plan`` through a :class:`~.multi_turn.BFCLMultiTurnEnv` on item ``i``; returns ``(result, correct,
    the tool results the env returned)``."""
    responder = PlanResponder(plan)
    obs, _ = env.reset(options={"index": i})
    conversation = list(obs)
    while True:
        text = responder(conversation)
        conversation.append({"role": "assistant", "content": text})
        obs, _, done, _, info = env.step(text)
        conversation += obs
        if done:
            return info["result"], bool(info["correct"]), [m["content"] for m in conversation if m["role"] == "tool"]


# ---------------------------------------------------------------------------------------------------------------
# Runs


@dataclass
class Tally:
    """Agreement counts; ``disagreements`` lists ``(category, format, id, label, env, official)``."""

    candidates: int = 0
    agree: int = 0
    valid: int = 0
    results_equal: int = 0  # multi-turn: the env's recorded answers and tool results equal the official loop's
    disagreements: list[tuple] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agree / self.candidates if self.candidates else 1.0


def _items(n: int, limit: int | None, rng: random.Random) -> list[int]:
    idx = list(range(n))
    return idx if limit is None or limit >= n else sorted(rng.sample(idx, limit))


def run_single_turn(categories: Iterable[str], formats: Iterable[str], items: int | None = None, seed: int = 0
                    ) -> Tally:
    """Every candidate of ``items`` sampled items (all if None) per category and format, both sides."""
    from agentrl.envs.bfcl.single_turn import BFCLEnv

    tally = Tally()
    for fname in formats:
        fmt = get_format(fname)
        for category in categories:
            rng = random.Random(f"{seed}/{category}")
            env = BFCLEnv(category, format=fmt.name)
            chosen = _items(env.num_tasks, items, rng)
            cands = {i: single_turn_candidates(category, i, fmt) for i in chosen}
            ours = {}
            for i, cs in cands.items():
                for slot, (_, text) in enumerate(cs):
                    env.reset(options={"index": i})
                    ours[(i, slot)] = bool(env.step(text)[4]["correct"])
            keys = [(i, slot) for i, cs in cands.items() for slot in range(len(cs))]
            official = official_verdicts(category, fmt, [(i, recorded(fmt, cands[i][slot][1])) for i, slot in keys])
            for (i, slot), theirs in zip(keys, official):
                mine = ours[(i, slot)]
                tally.candidates += 1
                tally.valid += theirs
                if theirs == mine:
                    tally.agree += 1
                else:
                    tally.disagreements.append((category, fmt.name, env.cat.ids[i], cands[i][slot][0], mine, theirs))
    return tally


def run_multi_turn(categories: Iterable[str], formats: Iterable[str], items: int | None = None, seed: int = 0
                   ) -> Tally:
    """Every plan of ``items`` sampled items (all if None) per category and format, both sides."""
    from agentrl.envs.bfcl.multi_turn import BFCLMultiTurnEnv

    tally = Tally()
    for fname in formats:
        fmt = get_format(fname)
        for category in categories:
            rng = random.Random(f"{seed}/{category}")
            env = BFCLMultiTurnEnv(category, format=fmt.name)
            for i in _items(env.num_tasks, items, rng):
                for label, plan in multi_turn_plans(category, i, fmt, rng):
                    mine_result, mine, mine_tools = env_multi_turn(env, i, plan)
                    their_result, theirs, their_tools = official_multi_turn(category, i, fmt, plan)
                    tally.candidates += 1
                    tally.valid += theirs
                    tally.results_equal += mine_result == their_result and mine_tools == their_tools
                    if mine == theirs:
                        tally.agree += 1
                    else:
                        tally.disagreements.append((category, fmt.name, env.cat.ids[i], label, mine, theirs))
            env.close()
    return tally
