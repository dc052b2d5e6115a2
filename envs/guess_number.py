"""Guess-the-number: find a secret integer from higher/lower feedback."""

from __future__ import annotations

import re
from typing import Any

from agentrl.core import Env, Message, StepResult
from agentrl.envs.utils import answer_or_text, preview

_INT_RE = re.compile(r"[+-]?\d+")
_RANGE_RE = re.compile(r"between (-?\d+) and (-?\d+)")
_FEEDBACK_RE = re.compile(r"(Higher|Lower) than (-?\d+)\.")


class GuessNumberEnv(Env):
    """Guess the secret integer in ``[low, high]``; after each guess the env says higher or lower.

    - **Observation**: ``reset`` gives a system message (range, number of guesses, action format) and the user
      message ``"Guess the number."``. Each ``step`` gives one user message: ``"Higher than 8. 4 guesses left."``,
      ``"Lower than 8. 4 guesses left."``, ``"Correct! The number is 8."``, or the end of the game.
    - **Action**: one integer; canonical format ``<answer>8</answer>``. Parsing is lenient: the last ``<answer>``
      block or else the bare text, surrounding whitespace, quotes and trailing punctuation ignored.
    - **Reward**: 1.0 for the correct guess, 0.0 for every other step.
    - **Termination**: on the correct guess (``info["won"]``), or when the guesses run out (the number is then
      revealed).
    - **Truncation**: never by the env (the guess budget already bounds an episode); a ``TimeLimit`` from
      ``agentrl.make(id, max_episode_steps=N)`` can truncate earlier.
    - **Invalid action** (not an integer, or outside the range): the observation says why, reward
      ``invalid_reward`` (default 0.0), and the turn **uses up a guess**, so every episode ends within
      ``max_guesses`` steps.
    - **Randomness**: the secret is drawn uniformly from ``[low, high]`` with ``self.np_random``.
    - ``max_guesses`` defaults to the binary-search worst case plus one, ``(high - low + 1).bit_length() + 1``
      (6 for 1..16).
    """

    description = "Guess the secret number in a range from higher/lower feedback, within a guess budget."

    def __init__(self, low: int = 1, high: int = 16, max_guesses: int | None = None, invalid_reward: float = 0.0):
        super().__init__()
        if not (isinstance(low, int) and isinstance(high, int)) or low >= high:
            raise ValueError(f"GuessNumberEnv: need integers low < high, got low={low!r}, high={high!r}")
        if max_guesses is None:
            max_guesses = (high - low + 1).bit_length() + 1
        if not isinstance(max_guesses, int) or max_guesses < 1:
            raise ValueError(f"GuessNumberEnv: max_guesses must be a positive int, got {max_guesses!r}")
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.invalid_reward = float(invalid_reward)
        self.secret = low
        self.guesses_left = max_guesses
        self.done = False

    def system_prompt(self) -> str:
        return (
            f"Guess my secret integer between {self.low} and {self.high}. After each guess I say if it is "
            f"higher or lower. You have {self.max_guesses} guesses. Reply with one number, like <answer>{(self.low + self.high) // 2}</answer>."
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Draws a new secret; returns ``([system, user], info)``."""
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(self.low, self.high + 1))
        self.guesses_left = self.max_guesses
        self.done = False
        obs = [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": "Guess the number."}]
        return obs, self._info(won=False, invalid=False)

    def task_key(self, seed: int) -> str:
        """The secret ``reset(seed=seed)`` draws (only ``high - low + 1`` distinct tasks: seeds collide)."""
        self.reset(seed=seed)
        return f"{self.low}..{self.high}:{self.secret}"

    def step(self, action: str) -> StepResult:
        """Scores one guess; returns ``([user message], reward, terminated, False, info)``."""
        if self.done:
            return self._reply("The game is over. Call reset() to play again."), 0.0, True, False, self._info(False, True)
        self.guesses_left -= 1
        text = answer_or_text(str(action))
        is_int = _INT_RE.fullmatch(text) is not None
        # int() refuses strings of more than 4300 digits; anything that long is out of range anyway
        guess = int(text) if is_int and len(text) <= 30 else None
        if guess is None or not self.low <= guess <= self.high:
            why = "is not an integer" if not is_int else f"is outside {self.low}..{self.high}"
            msg = f"Invalid guess {preview(str(action))!r}: it {why}. Reply like <answer>{(self.low + self.high) // 2}</answer>."
            return self._after(msg, reward=self.invalid_reward, invalid=True)
        if guess == self.secret:
            self.done = True
            return self._reply(f"Correct! The number is {guess}."), 1.0, True, False, self._info(True, False)
        hint = "Higher" if self.secret > guess else "Lower"
        return self._after(f"{hint} than {guess}.", reward=0.0, invalid=False)

    def _after(self, msg: str, *, reward: float, invalid: bool) -> StepResult:
        if self.guesses_left <= 0:
            self.done = True
            return self._reply(f"{msg} No guesses left. The number was {self.secret}."), reward, True, False, self._info(False, invalid)
        left = f"{self.guesses_left} guess{'es' if self.guesses_left != 1 else ''} left."
        return self._reply(f"{msg} {left}"), reward, False, False, self._info(False, invalid)

    def _info(self, won: bool, invalid: bool) -> dict[str, Any]:
        return {"guesses_left": self.guesses_left, "won": won, "invalid_action": invalid}

    @staticmethod
    def _reply(text: str) -> list[Message]:
        return [{"role": "user", "content": text}]

    @staticmethod
    def solve(conversation: list[Message]) -> str:
        """See :func:`solve`."""
        return solve(conversation)


def solve(conversation: list[Message]) -> str:
    """Scripted policy: binary search. Reads the range from the system prompt and narrows it with every
    ``Higher than X`` / ``Lower than X`` feedback in the conversation; returns ``<answer>MID</answer>``."""
    low, high = 1, 16
    for m in conversation:
        if m.get("role") == "system":
            found = _RANGE_RE.search(str(m.get("content", "")))
            if found:
                low, high = int(found.group(1)), int(found.group(2))
    for m in conversation:
        if m.get("role") != "user":
            continue
        for hint, value in _FEEDBACK_RE.findall(str(m.get("content", ""))):
            if hint == "Higher":
                low = max(low, int(value) + 1)
            else:
                high = min(high, int(value) - 1)
    return f"<answer>{(low + max(low, high)) // 2}</answer>"
