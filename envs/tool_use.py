"""Tool use: answer a question about a hidden table of people with a lookup tool and a calculator."""

from __future__ import annotations

import copy
import re
from typing import Any

from agentrl.core import Env, Message, StepResult
from agentrl.envs.calc import CalcError, format_number, parse_number, safe_eval
from agentrl.envs.utils import extract_answer, preview
from agentrl.tools import Tool, ToolCall, ToolSet, format_tool_call, parse_tool_calls

NAMES = (
    "Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jill", "Kai", "Lena",
    "Max", "Nora", "Otto", "Pia", "Rosa", "Sam", "Tess", "Uma", "Vic", "Wes", "Yara", "Zoe",
)
CITIES = ("Oslo", "Lima", "Rome", "Kyiv", "Baku", "Doha", "Riga", "Bern", "Suva", "Male", "Apia", "Lome")
TASKS = ("sum", "difference", "product", "city")

SYSTEM_PROMPT = (
    "Answer the question with tools. lookup(name) gives a person's age and city. calculator(expression) "
    "evaluates arithmetic. Call a tool like "
    '<tool_call>{"name": "lookup", "arguments": {"name": "Ann"}}</tool_call>. '
    "Give the final answer like <answer>42</answer>."
)
QUESTIONS = {
    "sum": "What is the sum of the ages of {a} and {b}?",
    "difference": "How many years older is {a} than {b}?",
    "product": "What is {a}'s age multiplied by {b}'s age?",
    "city": "In which city does the older of {a} and {b} live?",
}
_LOOKUP_RESULT_RE = re.compile(r"^(\w+): age (\d+), city (\w+)$")


def run_tool_calls(toolset: ToolSet, parsed: Any, max_calls: int) -> tuple[list[Message], bool]:
    """Runs the parsed calls of one turn (at most ``max_calls``; the others are answered with an error) and returns
    ``(tool messages, invalid)``: one message per call, then one per parse error; ``invalid`` when any call failed
    or did not parse."""
    out: list[Message] = []
    invalid = bool(parsed.errors)
    for k, call in enumerate(parsed.calls):
        if k >= max_calls:
            ok, result = False, f"error: at most {max_calls} tool calls per turn; this one was not run"
        else:
            ok, result = toolset.call(call)
        invalid |= not ok
        out.append({"role": "tool", "name": call.name, "content": result})
    out.extend({"role": "tool", "content": f"error: {e}"} for e in parsed.errors)
    return out, invalid


class ToolUseEnv(Env):
    """Answer a question about a generated table of people (name -> age, city) that only tools can read.

    - **Tools** (``env.tool_schemas()``, also in ``reset``'s ``info["tools"]``, OpenAI function schemas):
      ``lookup(name: string)`` returns ``"Ann: age 34, city Oslo"`` (case-insensitive name); ``calculator(
      expression: string)`` returns the value of an arithmetic expression (``+ - * / // % **`` and parentheses,
      evaluated safely, never with ``eval``).
    - **Questions** (``tasks``, drawn with ``self.np_random``): the sum of two people's ages, how many years
      older one is than the other, the product of their ages, or the city of the older one.
    - **Observation**: ``reset`` gives a system message (tools and formats) and the question as a user message.
      A step with tool calls gives one ``{"role": "tool", "name": TOOL, "content": RESULT}`` message per call, in
      order, then one ``{"role": "tool", "content": "error: ..."}`` per malformed call. The final step gives a
      user message saying whether the answer was right.
    - **Action**: tool calls in the :mod:`agentrl.tools` format
      (``<tool_call>{"name": "lookup", "arguments": {"name": "Ann"}}</tool_call>``, several per message allowed,
      at most ``max_calls_per_turn``), or the final answer ``<answer>...</answer>``. A message with an
      ``<answer>`` ends the episode; tool calls in that same message are ignored.
    - **Reward**: 1.0 for a correct final answer (numbers compared by value, cities case-insensitively), else 0.0.
      Tool calls earn 0.0.
    - **Termination**: on the final answer. **Truncation**: never by the env; the registered id
      ``agentrl/ToolUse-v0`` has a ``TimeLimit`` of 8 steps.
    - **Invalid actions**: an unknown tool, wrong/missing arguments, malformed JSON, a missing ``</tool_call>`` or
      too many calls give a tool message starting with ``error:`` (reward 0.0, episode continues); a message with
      neither a tool call nor an answer gives a user message explaining the format, reward ``invalid_reward``
      (default 0.0). ``info["invalid_action"]`` is set whenever any part of the action was invalid.
    """

    description = "Tool use: answer questions about a hidden people table via lookup and calculator tool calls."

    def __init__(self, num_people: int = 6, tasks: tuple[str, ...] | list[str] = TASKS, max_calls_per_turn: int = 4, invalid_reward: float = 0.0):
        super().__init__()
        if not isinstance(num_people, int) or not 2 <= num_people <= len(NAMES):
            raise ValueError(f"ToolUseEnv: num_people must be an int in [2, {len(NAMES)}], got {num_people!r}")
        bad = [t for t in tasks if t not in TASKS]
        if bad or not tasks:
            raise ValueError(f"ToolUseEnv: tasks must be a non-empty subset of {TASKS}, got {list(tasks)!r}")
        if not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ValueError(f"ToolUseEnv: max_calls_per_turn must be a positive int, got {max_calls_per_turn!r}")
        self.num_people, self.tasks, self.max_calls_per_turn = num_people, tuple(tasks), max_calls_per_turn
        self.invalid_reward = float(invalid_reward)
        self.table: dict[str, tuple[int, str]] = {}
        self.question = ""
        self.answer = ""
        self.done = False
        self.toolset = ToolSet([
            Tool(
                name="lookup",
                description="Returns the age and city of a person.",
                parameters={"type": "object", "properties": {"name": {"type": "string", "description": "the person's name"}}, "required": ["name"]},
                fn=self._lookup,
            ),
            Tool(
                name="calculator",
                description="Evaluates an arithmetic expression with + - * / // % ** and parentheses.",
                parameters={"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 34 * (12 + 5)"}}, "required": ["expression"]},
                fn=self._calculator,
            ),
        ])

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Returns the tools as OpenAI-style function schemas (a fresh copy; pass as ``tools=`` to a chat
        template)."""
        return copy.deepcopy(self.toolset.schemas())

    # -- gymnasium API ---------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Draws a table and a question; returns ``([system, user], info)`` with ``info["tools"]`` and
        ``info["question"]``."""
        super().reset(seed=seed)
        names = [NAMES[int(i)] for i in self.np_random.choice(len(NAMES), size=self.num_people, replace=False)]
        ages = [int(a) for a in self.np_random.choice(range(18, 91), size=self.num_people, replace=False)]
        cities = [CITIES[int(self.np_random.integers(len(CITIES)))] for _ in names]
        self.table = {n.lower(): (age, city) for n, age, city in zip(names, ages, cities)}
        task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        i, j = (int(x) for x in self.np_random.choice(self.num_people, size=2, replace=False))
        a, b = names[i], names[j]
        if task == "difference" and ages[i] < ages[j]:
            a, b = b, a
        age_a, age_b = self.table[a.lower()][0], self.table[b.lower()][0]
        self.answer = {
            "sum": str(age_a + age_b),
            "difference": str(age_a - age_b),
            "product": str(age_a * age_b),
            "city": self.table[(a if age_a > age_b else b).lower()][1],
        }[task]
        self.question = QUESTIONS[task].format(a=a, b=b)
        self.done = False
        obs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.question}]
        return obs, {"tools": self.tool_schemas(), "question": self.question, "task": task}

    def task_key(self, seed: int) -> str:
        """The question and the hidden table ``reset(seed=seed)`` draws."""
        self.reset(seed=seed)
        return f"{self.question}|{sorted(self.table.items())}"

    def step(self, action: str) -> StepResult:
        """Runs the tool calls of ``action`` or scores its final answer; returns ``(messages, reward,
        terminated, False, info)``."""
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
                   "or answer like <answer>42</answer>.")
            return [{"role": "user", "content": msg}], self.invalid_reward, False, False, self._info(False, True, 0)
        out, invalid = run_tool_calls(self.toolset, parsed, self.max_calls_per_turn)
        return out, 0.0, False, False, self._info(False, invalid, len(parsed.calls))

    # -- tools -----------------------------------------------------------------------------------------------
    def _lookup(self, name: str) -> str:
        key = name.strip().lower()
        if key not in self.table:
            raise ValueError(f"no person named {preview(name, 24)!r}")
        age, city = self.table[key]
        return f"{key.capitalize()}: age {age}, city {city}"

    @staticmethod
    def _calculator(expression: str) -> str:
        try:
            return format_number(safe_eval(expression))
        except CalcError as e:
            raise ValueError(str(e)) from None

    # -- helpers ---------------------------------------------------------------------------------------------
    def _is_correct(self, answer: str) -> bool:
        want = parse_number(self.answer)
        if want is not None:
            return parse_number(answer) == want
        return answer.strip(" .!\"'").lower() == self.answer.lower()

    def _info(self, correct: bool, invalid: bool, calls: int) -> dict[str, Any]:
        return {"correct": correct, "invalid_action": invalid, "tool_calls": calls}

    @staticmethod
    def solve(conversation: list[Message]) -> str:
        """See :func:`solve`."""
        return solve(conversation)


def _call_results(conversation: list[Message]) -> list[tuple[ToolCall, str]]:
    """Pairs every tool call the assistant made with the tool message that answered it (by order and name)."""
    pairs: list[tuple[ToolCall, str]] = []
    pending: list[ToolCall] = []
    for m in conversation:
        role = m.get("role")
        if role == "assistant":
            pending = parse_tool_calls(str(m.get("content", ""))).calls
        elif role == "tool" and m.get("name") and pending:
            call = pending.pop(0)
            if call.name == m["name"]:
                pairs.append((call, str(m.get("content", ""))))
    return pairs


def solve(conversation: list[Message]) -> str:
    """Scripted policy: looks up both people named in the question (one message, two calls), then, for numeric
    questions, calls the calculator on their ages, then answers with the calculator's result (or the older
    person's city). Uses the text observations only; returns ``<answer>unknown</answer>`` for a question it does
    not recognise."""
    question = next((str(m.get("content", "")) for m in conversation if m.get("role") == "user"), "")
    task, names = None, None
    for t, template in QUESTIONS.items():
        pattern = "^" + re.escape(template).replace(r"\{a\}", r"(\w+)").replace(r"\{b\}", r"(\w+)") + "$"
        found = re.match(pattern, question.strip())
        if found:
            task, names = t, found.groups()
            break
    if task is None or names is None:
        return "<answer>unknown</answer>"
    pairs = _call_results(conversation)
    people: dict[str, tuple[int, str]] = {}
    for call, result in pairs:
        found = _LOOKUP_RESULT_RE.match(result.strip())
        if call.name == "lookup" and found:
            people[found.group(1).lower()] = (int(found.group(2)), found.group(3))
    missing = [n for n in names if n.lower() not in people]
    if missing:
        return "\n".join(format_tool_call("lookup", {"name": n}) for n in missing)
    (age_a, city_a), (age_b, city_b) = people[names[0].lower()], people[names[1].lower()]
    if task == "city":
        return f"<answer>{city_a if age_a > age_b else city_b}</answer>"
    op = {"sum": "+", "difference": "-", "product": "*"}[task]
    expression = f"{age_a} {op} {age_b}"
    for call, result in reversed(pairs):
        if call.name == "calculator" and call.arguments.get("expression") == expression and not result.startswith("error"):
            return f"<answer>{result.strip()}</answer>"
    return format_tool_call("calculator", {"expression": expression})
