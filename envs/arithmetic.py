"""Arithmetic problems generated from the seed, single turn, with a verified answer (RLVR-style)."""

from __future__ import annotations

import re
from typing import Any

from agentrl.core import Env, Message, StepResult
from agentrl.envs.calc import CalcError, Number, parse_number, safe_eval
from agentrl.envs.utils import extract_answer, last_content

SYSTEM_PROMPT = "Solve the arithmetic problem. Give the final answer, an integer, in \\boxed{}, like \\boxed{42}."
_BOXED_RE = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_QUESTION_RE = re.compile(r"Compute (.+?)\.?$", re.DOTALL)
_PRECEDENCE = {"+": 1, "-": 1, "*": 2}


def extract_boxed(text: str) -> str | None:
    """Returns the content of the last ``\\boxed{...}`` in ``text`` (no nested braces), or None."""
    found = _BOXED_RE.findall(text)
    return found[-1].strip() if found else None


class ArithmeticEnv(Env):
    """One arithmetic expression over non-negative integers; the agent answers once.

    - **Observation**: ``reset`` gives a system message (the answer format) and the user message
      ``"Compute 7 + 12 * 3."``. The ``step`` gives one user message: ``"Correct."``, ``"Wrong. The answer is 43."``
      or why no answer could be read.
    - **Problems** (from ``self.np_random``): ``difficulty`` operators (1 to 4) between operands from 1 to 20
      (1 to 50 from difficulty 3); difficulty 1 uses ``+``/``-``, higher ones also ``*`` (operands of ``*`` at
      most 12) and parentheses where the expression tree needs them. The answer is an integer (maybe negative).
    - **Action**: free text whose final answer is in ``\\boxed{}`` (the last one counts), e.g. ``"... so
      \\boxed{43}"``. Also accepted: ``<answer>43</answer>``, or an action that is only a number. Spaces, thousands
      commas and ``43.0`` are accepted.
    - **Reward**: 1.0 if the answer equals the value, else 0.0.
    - **Termination**: always after the one step. **Truncation**: never.
    - **Invalid action** (no ``\\boxed{}``/``<answer>``/bare number, or one that holds no number): reward
      ``invalid_reward`` (default 0.0), an observation saying the answer could not be read, and the episode still
      terminates (``info["invalid_action"]``).
    """

    description = "Single-turn arithmetic from the seed; final answer in \\boxed{}, reward 1 if exact."

    def __init__(self, difficulty: int = 2, invalid_reward: float = 0.0):
        super().__init__()
        if not isinstance(difficulty, int) or not 1 <= difficulty <= 4:
            raise ValueError(f"ArithmeticEnv: difficulty must be an int in [1, 4], got {difficulty!r}")
        self.difficulty = difficulty
        self.invalid_reward = float(invalid_reward)
        self.expression = "0"
        self.answer: Number = 0
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Draws a new problem; returns ``([system, user], info)`` with ``info["question"]``."""
        super().reset(seed=seed)
        self.expression = self._generate()
        self.answer = safe_eval(self.expression)
        self.done = False
        question = f"Compute {self.expression}."
        obs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        return obs, {"question": question, "difficulty": self.difficulty}

    def task_key(self, seed: int) -> str:
        """The expression ``reset(seed=seed)`` draws (small difficulties have few distinct ones)."""
        self.reset(seed=seed)
        return self.expression

    def step(self, action: str) -> StepResult:
        """Scores the answer; returns ``([user message], reward, True, False, info)``."""
        if self.done:
            return self._reply("The problem is already answered. Call reset() for a new one."), 0.0, True, False, self._info(None, True)
        self.done = True
        text = str(action)
        raw = extract_boxed(text)
        if raw is None:
            raw = extract_answer(text)
        if raw is None:
            raw = text
        value = parse_number(raw)
        if value is None:
            msg = "No answer found. Put the final answer in \\boxed{}, like \\boxed{42}."
            return self._reply(msg), self.invalid_reward, True, False, self._info(None, True)
        correct = value == self.answer
        msg = "Correct." if correct else f"Wrong. The answer is {self.answer}."
        return self._reply(msg), 1.0 if correct else 0.0, True, False, self._info(correct, False)

    def _generate(self) -> str:
        high = 20 if self.difficulty < 3 else 50
        ops = ["+", "-"] if self.difficulty == 1 else ["+", "-", "*"]
        text, _ = self._tree(self.difficulty, ops, high)
        return text

    def _tree(self, n_ops: int, ops: list[str], high: int, cap: int | None = None) -> tuple[str, int]:
        """Returns ``(text, precedence)`` of a random expression with ``n_ops`` operators; a leaf has
        precedence 3. ``cap`` bounds the operands (for ``*``)."""
        if n_ops == 0:
            return str(int(self.np_random.integers(1, (cap or high) + 1))), 3
        op = ops[int(self.np_random.integers(len(ops)))]
        n_left = int(self.np_random.integers(0, n_ops))
        sub_cap = 12 if op == "*" else cap
        left, lp = self._tree(n_left, ops, high, sub_cap)
        right, rp = self._tree(n_ops - 1 - n_left, ops, high, sub_cap)
        p = _PRECEDENCE[op]
        if lp < p:
            left = f"({left})"
        # a right operand of equal precedence needs brackets after "-" (a - (b + c)); the others keep them so that
        # the text always shows the tree's grouping
        if rp <= p:
            right = f"({right})"
        return f"{left} {op} {right}", p

    def _info(self, correct: bool | None, invalid: bool) -> dict[str, Any]:
        return {"answer": self.answer, "correct": bool(correct), "invalid_action": invalid}

    @staticmethod
    def _reply(text: str) -> list[Message]:
        return [{"role": "user", "content": text}]

    @staticmethod
    def solve(conversation: list[Message]) -> str:
        """See :func:`solve`."""
        return solve(conversation)


def solve(conversation: list[Message]) -> str:
    """Scripted policy: evaluates the ``Compute ...`` expression of the last user message with the safe evaluator
    and answers ``\\boxed{VALUE}``; answers ``\\boxed{0}`` when there is no readable problem."""
    found = _QUESTION_RE.search(last_content(conversation).strip())
    if not found:
        return "\\boxed{0}"
    try:
        return f"\\boxed{{{safe_eval(found.group(1))}}}"
    except CalcError:
        return "\\boxed{0}"
