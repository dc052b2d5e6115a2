"""Tool lookup: answer a question about one person of a hidden directory with one or two tool calls.

The CPU demo's tool-use task (``configs/tooluse.yaml``): small enough for a model trained from scratch in minutes,
still a real multi-turn tool-use loop. The answer is never in the prompt: the model must call ``lookup`` with the
name copied from the question, read the result, and either answer from it or call ``calculator`` with an expression
derived from the result and the question, then answer with the calculator's result.

Flow of a solved episode (``age_in`` task)::

    user:      How old will Ann be in 7 years?
    assistant: <tool_call>{"name": "lookup", "arguments": {"name": "Ann"}}</tool_call>
    tool:      Ann: age 34, city Oslo
    assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "34 + 7"}}</tool_call>
    tool:      41
    assistant: <answer>41</answer>                                  -> reward 1.0, terminated

:meth:`ToolLookupEnv.mistake` plays the mistakes that scripted warm-start demonstrations mix in (malformed calls,
wrong tools, wrong argument values, skipping the tool, a wrong answer): mistakes a policy can unlearn with RL.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

from agentrl.core import Env, Message, StepResult
from agentrl.envs.tool_use import CITIES, NAMES, ToolUseEnv, run_tool_calls
from agentrl.envs.utils import extract_answer, preview
from agentrl.tools import Tool, ToolSet, format_tool_call, parse_tool_calls

TASKS = ("city", "age", "age_in", "age_ago")
QUESTIONS = {
    "city": "Where does {name} live?",
    "age": "How old is {name}?",
    "age_in": "How old will {name} be in {years} years?",
    "age_ago": "How old was {name} {years} years ago?",
}
SYSTEM_PROMPT = (
    "Answer the question about a person. Only tools know people: lookup(name) gives a person's age and city, "
    "calculator(expression) evaluates arithmetic. Call a tool as "
    '<tool_call>{"name": TOOL, "arguments": {...}}</tool_call> and give the final answer as <answer>...</answer>.'
)
MIN_AGE, MAX_AGE = 20, 89
MIN_YEARS, MAX_YEARS = 2, 9
_LOOKUP_RESULT_RE = re.compile(r"^(\w+): age (\d+), city (\w+)$")
_QUESTION_RES = {
    task: re.compile("^" + re.escape(q).replace(r"\{name\}", r"(?P<name>\w+)").replace(r"\{years\}", r"(?P<years>\d+)") + "$")
    for task, q in QUESTIONS.items()
}


class ToolLookupEnv(Env):
    """One question about one person of a generated directory (name -> age, city) that only tools can read.

    - **Tools** (``env.tool_schemas()``, also ``reset``'s ``info["tools"]``): ``lookup(name: string)`` returns
      ``"Ann: age 34, city Oslo"`` (case-insensitive name; an unknown name is an error); ``calculator(expression:
      string)`` returns the value of ``+ - * / // % **`` arithmetic (evaluated safely, never with ``eval``).
    - **Questions** (``tasks``, drawn with ``self.np_random``): ``city`` "Where does Ann live?" and ``age`` "How
      old is Ann?" need one lookup; ``age_in`` "How old will Ann be in 7 years?" and ``age_ago`` "How old was Ann 7
      years ago?" need a lookup, then a calculator call on the looked-up age (the answer must be the calculator's
      result: the directory's ages and the years are drawn so that every answer is a two-digit number).
    - **Observation**: ``reset`` gives a system message (tools, formats) and the question as a user message. A step
      with tool calls gives one ``{"role": "tool", "name": TOOL, "content": RESULT}`` message per call, in order,
      then one ``{"role": "tool", "content": "error: ..."}`` per malformed call. The final step gives a user
      message saying whether the answer was right.
    - **Action**: tool calls in the :mod:`agentrl.tools` format (at most ``max_calls_per_turn`` per message) or
      the final answer ``<answer>...</answer>``; a message with an answer ends the episode (its tool calls are
      ignored).
    - **Reward**: 1.0 for a correct final answer (numbers by value, cities case-insensitively), 0.0 for a wrong
      one; every step with an invalid action earns ``invalid_reward`` (default -0.1), so the episode reward of a
      correct answer falls with the invalid actions on the way. Valid tool calls earn 0.0.
    - **Invalid actions**: a malformed call (bad JSON, missing ``</tool_call>``, no ``name``), an unknown tool,
      wrong or missing arguments, an unknown person, a calculator error, or more than ``max_calls_per_turn`` calls
      give a tool message starting with ``error:``; a message with neither a call nor an answer gives a user
      message explaining the format. The episode continues in both cases.
    - **Info** (every step): ``correct``, ``invalid_action`` (this step), ``tool_calls`` (this step),
      ``invalid_actions`` and ``parse_errors`` (malformed calls) counted over the episode so far, ``task``, and
      ``state_key`` (also in ``reset``'s info, for ``gigpo``'s step groups): the sorted tool results the episode
      has obtained so far (failed calls add nothing), as JSON text: what the policy knows is the state.
    - **Termination**: on the final answer. **Truncation**: never by the env; the registered id
      ``agentrl/ToolLookup-v0`` has a ``TimeLimit`` of 5 steps (the longest task needs 3).
    """

    description = "Tool lookup: one question about a hidden person, answered with 1-2 lookup/calculator calls."

    def __init__(self, num_people: int = 6, tasks: tuple[str, ...] | list[str] = TASKS, max_calls_per_turn: int = 2,
                 invalid_reward: float = -0.1):
        super().__init__()
        if not isinstance(num_people, int) or not 1 <= num_people <= len(NAMES):
            raise ValueError(f"ToolLookupEnv: num_people must be an int in [1, {len(NAMES)}], got {num_people!r}")
        if isinstance(tasks, str) or not tasks or any(t not in TASKS for t in tasks):
            raise ValueError(f"ToolLookupEnv: tasks must be a non-empty list drawn from {list(TASKS)}, got {tasks!r}")
        if not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ValueError(f"ToolLookupEnv: max_calls_per_turn must be a positive int, got {max_calls_per_turn!r}")
        if not -1.0 <= float(invalid_reward) <= 0.0:
            raise ValueError(f"ToolLookupEnv: invalid_reward must be in [-1, 0], got {invalid_reward!r}")
        self.num_people, self.tasks = num_people, tuple(tasks)
        self.max_calls_per_turn, self.invalid_reward = max_calls_per_turn, float(invalid_reward)
        self.table: dict[str, tuple[int, str]] = {}
        self.task, self.question, self.answer = "", "", ""
        self.done = False
        self.invalid_actions = self.parse_errors = 0
        self.facts: set[str] = set()
        self.toolset = ToolSet([
            Tool(
                name="lookup",
                description="Returns the age and city of a person.",
                parameters={"type": "object", "properties": {"name": {"type": "string", "description": "the person's name"}},
                            "required": ["name"]},
                fn=self._lookup,
            ),
            Tool(
                name="calculator",
                description="Evaluates an arithmetic expression.",
                parameters={"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 34 + 7"}},
                            "required": ["expression"]},
                fn=self._calculator,
            ),
        ])

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Returns the tools as OpenAI-style function schemas (a fresh copy)."""
        return copy.deepcopy(self.toolset.schemas())

    # -- gymnasium API ---------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Draws a directory and a question; returns ``([system, user], info)`` with ``info["tools"]``,
        ``info["question"]`` and ``info["task"]``."""
        super().reset(seed=seed)
        rng = self.np_random
        names = [NAMES[int(i)] for i in rng.choice(len(NAMES), size=self.num_people, replace=False)]
        ages = [int(rng.integers(MIN_AGE, MAX_AGE + 1)) for _ in names]
        cities = [CITIES[int(rng.integers(len(CITIES)))] for _ in names]
        self.table = {n.lower(): (a, c) for n, a, c in zip(names, ages, cities)}
        self.task = self.tasks[int(rng.integers(len(self.tasks)))]
        who = names[int(rng.integers(self.num_people))]
        years = int(rng.integers(MIN_YEARS, MAX_YEARS + 1))
        age, city = self.table[who.lower()]
        self.answer = {"city": city, "age": str(age), "age_in": str(age + years), "age_ago": str(age - years)}[self.task]
        self.question = QUESTIONS[self.task].format(name=who, years=years)
        self.done = False
        self.invalid_actions = self.parse_errors = 0
        self.facts = set()
        obs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.question}]
        return obs, {"tools": self.tool_schemas(), "question": self.question, "task": self.task,
                     "state_key": self._state_key()}

    def task_key(self, seed: int) -> str:
        """The question and the hidden table ``reset(seed=seed)`` draws."""
        self.reset(seed=seed)
        return f"{self.question}|{sorted(self.table.items())}"

    def step(self, action: str) -> StepResult:
        """Runs the tool calls of ``action`` or scores its final answer; returns ``(messages, reward, terminated,
        False, info)`` (see the class docstring)."""
        if self.done:
            return [{"role": "user", "content": "The question is already answered. Call reset() for a new one."}], 0.0, True, False, self._info(False, True, 0)
        text = str(action)
        answer = extract_answer(text)
        if answer is not None:
            self.done = True
            correct = self._is_correct(answer)
            msg = "Correct." if correct else f"Wrong. The answer is {self.answer}."
            return [{"role": "user", "content": msg}], 1.0 if correct else 0.0, True, False, self._info(correct, False, 0)
        parsed = parse_tool_calls(text)
        if not parsed.calls and not parsed.errors:
            msg = (f"No tool call or answer in {preview(text)!r}. Call a tool with <tool_call>{{...}}</tool_call> "
                   "or answer with <answer>...</answer>.")
            return [{"role": "user", "content": msg}], self.invalid_reward, False, False, self._info(False, True, 0)
        out, invalid = run_tool_calls(self.toolset, parsed, self.max_calls_per_turn)
        self.facts.update(f"{m['name']}: {m['content']}" for m in out
                          if "name" in m and not str(m["content"]).startswith("error:"))
        self.parse_errors += len(parsed.errors)
        reward = self.invalid_reward if invalid else 0.0
        return out, reward, False, False, self._info(False, invalid, len(parsed.calls))

    # -- tools and grading: the same table lookups, calculator and answer check as ToolUse ----------------------
    _lookup = ToolUseEnv._lookup
    _calculator = ToolUseEnv.__dict__["_calculator"]  # the staticmethod itself
    _is_correct = ToolUseEnv._is_correct

    def _info(self, correct: bool, invalid: bool, calls: int) -> dict[str, Any]:
        self.invalid_actions += invalid
        return {"correct": correct, "invalid_action": invalid, "tool_calls": calls,
                "invalid_actions": self.invalid_actions, "parse_errors": self.parse_errors, "task": self.task,
                "state_key": self._state_key()}

    def _state_key(self) -> str:
        return json.dumps(sorted(self.facts))

    @staticmethod
    def solve(conversation: list[Message]) -> str:
        """See :func:`solve`."""
        return solve(conversation)

    @staticmethod
    def mistake(conversation: list[Message], rng: random.Random) -> str:
        """See :func:`mistake`."""
        return mistake(conversation, rng)


# ------------------------------------------------------------------------------------------- scripted policies
def _read_question(conversation: list[Message]) -> tuple[str, str, int] | None:
    """Returns ``(task, name, years)`` of the episode's question (the first user message), or None."""
    question = next((str(m.get("content", "")) for m in conversation if m.get("role") == "user"), "").strip()
    for task, pattern in _QUESTION_RES.items():
        found = pattern.match(question)
        if found:
            return task, found.group("name"), int(found.groupdict().get("years") or 0)
    return None


def _results(conversation: list[Message]) -> list[tuple[str, dict[str, Any], str]]:
    """Returns ``(tool, arguments, result)`` for every call the assistant made that a tool message answered (paired
    by order and tool name; error results included)."""
    out: list[tuple[str, dict[str, Any], str]] = []
    pending: list[Any] = []
    for m in conversation:
        role = m.get("role")
        if role == "assistant":
            pending = parse_tool_calls(str(m.get("content", ""))).calls
        elif role == "tool" and m.get("name") and pending:
            call = pending.pop(0)
            if call.name == m["name"]:
                out.append((call.name, call.arguments, str(m.get("content", ""))))
    return out


def _plan(conversation: list[Message]) -> tuple[str, dict[str, Any]] | None:
    """The scripted next step: ``("lookup" | "calculator", arguments)`` for a call, ``("answer", {"text": ...})``,
    or None for a question the solver does not recognise."""
    q = _read_question(conversation)
    if q is None:
        return None
    task, name, years = q
    results = _results(conversation)
    person = None
    for tool, _, result in results:
        found = _LOOKUP_RESULT_RE.match(result.strip()) if tool == "lookup" else None
        if found and found.group(1).lower() == name.lower():
            person = (int(found.group(2)), found.group(3))
    if person is None:
        return "lookup", {"name": name}
    age, city = person
    if task == "city":
        return "answer", {"text": city}
    if task == "age":
        return "answer", {"text": str(age)}
    expression = f"{age} {'+' if task == 'age_in' else '-'} {years}"
    for tool, args, result in reversed(results):
        if tool == "calculator" and args.get("expression") == expression and not result.startswith("error"):
            return "answer", {"text": result.strip()}
    return "calculator", {"expression": expression}


def solve(conversation: list[Message]) -> str:
    """Scripted policy: looks up the person named in the question, then (``age_in`` / ``age_ago``) calls the
    calculator on the looked-up age and the question's years, then answers with the result. Reads the text
    observations only; returns ``<answer>unknown</answer>`` for a question it does not recognise."""
    plan = _plan(conversation)
    if plan is None:
        return "<answer>unknown</answer>"
    what, args = plan
    if what == "answer":
        return f"<answer>{args['text']}</answer>"
    return format_tool_call(what, args)


MISTAKES = ("malformed", "wrong_tool", "wrong_argument", "skip_tool")


def mistake(conversation: list[Message], rng: random.Random) -> str:
    """A plausible wrong action for the state :func:`solve` would act in, drawn with ``rng``: a malformed call
    (broken JSON or a missing ``</tool_call>``; an answer without its tags), a wrong tool or argument name, a wrong
    argument value (another person, a wrong number or operator; a wrong answer), or skipping the tool (a guessed
    answer instead of the call). Each is a mistake RL can unlearn: it costs an invalid step or the episode."""
    plan = _plan(conversation)
    if plan is None:
        return "<answer>unknown</answer>"
    what, args = plan
    kind = rng.choice(MISTAKES)
    q = _read_question(conversation)
    asked = q[1] if q else ""
    if what == "answer":
        value = args["text"]
        if kind == "malformed":
            return value  # no tags: neither a call nor an answer
        if value.isdigit():
            return f"<answer>{int(value) + rng.choice([-10, -2, -1, 1, 2, 10])}</answer>"
        return f"<answer>{rng.choice([c for c in CITIES if c != value])}</answer>"
    if kind == "malformed":
        body = json.dumps({"name": what, "arguments": args})
        key, value = next(iter(args.items()))
        broken = rng.choice([
            body[:-1],                                                    # unbalanced braces
            body.replace(json.dumps(value), str(value)),                  # unquoted string value
            body.replace('"', "'"),                                       # single quotes
            "<tool_call>\n" + body + "\n",                                # missing </tool_call> (below: no tags)
        ])
        return broken if broken.startswith("<tool_call>") else "<tool_call>\n" + broken + "\n</tool_call>"
    if kind == "wrong_tool":
        key, value = next(iter(args.items()))
        if rng.random() < 0.5:
            return format_tool_call({"lookup": "calculator", "calculator": "lookup"}[what], args)  # a schema error
        return format_tool_call(what, {rng.choice(["person", "query", "input"]): value})  # wrong argument name
    if kind == "wrong_argument":
        if what == "lookup":
            return format_tool_call("lookup", {"name": rng.choice([n for n in NAMES if n.lower() != asked.lower()])})
        a, op, b = args["expression"].split()
        if rng.random() < 0.5:
            op = {"+": "-", "-": "+"}[op]
        else:
            b = str(int(b) + rng.choice([-1, 1, 10]))
        return format_tool_call("calculator", {"expression": f"{a} {op} {b}"})
    # skip_tool: answer without (finishing) the tool work
    if q and q[0] == "city":
        return f"<answer>{rng.choice(CITIES)}</answer>"
    return f"<answer>{rng.randint(MIN_AGE, MAX_AGE)}</answer>"
