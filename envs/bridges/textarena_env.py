"""TextArena single-player games as agentrl envs: ``agentrl.make("textarena/<game id>")``, e.g.
``textarena/GuessTheNumber-v0``.

Flow: ``reset(seed)`` makes the game (its ``-raw`` variant when TextArena registers one: no observation wrappers, so
each observation holds only what is new) and resets it for one player with that seed; the game's messages since the
player's last turn become one user message (the player's own move, which TextArena echoes back, left out). ``step``
plays the model's text as the move; at the end of the game its reward (``close()``'s reward of player 0) is the
step's reward and the episode terminates.

Invariants:

- TextArena seeds and draws from the process-global ``random`` (``reset(seed)`` calls ``random.seed``) and some games
  from ``numpy.random``. Each env keeps its own state of both generators: every call into the game holds the
  bridges' one lock, swaps the env's states in, and swaps the process's back out (:mod:`.rng`). So concurrent
  episodes on threads neither interleave their draws nor move anyone else's generator, and a seed gives the same
  game everywhere.
- A game for several players fails at ``reset`` with an error that says so; a game that cannot be made names the
  library's error on one line (:func:`.errors.describe`).
- The game's reward is the step's only where it is a finite number; anything else (some games put the reason of a
  malformed move where the reward goes) ends the game with reward 0, ``info["reward_error"]`` and the game's text in
  the message.
- Every call into the game is bounded (kwarg ``call_timeout_s``, default 60 s; :mod:`.deadline`): a game that loops
  forever (MarketEntryGame, a game for several players that accepts one, spins once its player is out) fails its
  episode with :class:`~.deadline.LibraryTimeout` instead of holding the bridges' lock, and every other bridged env,
  for good.
- ``oracle_policy()`` plays a game's scripted solver where this module has one (FrozenLake: a shortest hole-free path
  on the last board shown), for the warm start and ``agentrl eval``; other games have none.
- ``task_key(seed)`` (also ``info["task_key"]`` of ``reset``) is ``textarena/<game>:<sha256 of the opening and the game's state>`` (the state
  holds the hidden parts, such as the number to guess), the state read by content (:func:`state_content`: objects
  by their fields, never by a memory address), so the same deal has the same key in any instance or process.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from typing import Any, Callable, TypeVar

from agentrl.core import Env, Message, StepResult
from agentrl.envs.bridges.deadline import LibraryTimeout, timeout_arg
from agentrl.envs.bridges.errors import describe
from agentrl.envs.bridges.rng import RNGStates, seed_globals, with_states
from agentrl.envs.frozenlake import shortest_path

try:
    import textarena
    from textarena.envs.registration import ENV_REGISTRY
except ImportError as e:  # an optional extra: say which
    raise ImportError(f"textarena envs need the textarena package: pip install 'agentrl[textarena]' ({e})") from e

T = TypeVar("T")
_VARIANTS = ("-raw", "-train")


def solve_frozen_lake(conversation: list[Message]) -> str:
    """TextArena FrozenLake's scripted play: the first move of a shortest hole-free path on the last board the game
    showed (its ``+-----+`` grid of ``P``, ``H``, ``G`` cells), as ``[move]``; ``[down]`` when there is no board."""
    text = next((str(m.get("content", "")) for m in reversed(conversation) if m.get("role") == "user"), "")
    rows = [[c.strip() for c in line.strip()[1:-1].split("|")]
            for line in text.rpartition("Current Board:")[2].splitlines() if line.strip().startswith("|")]
    n = len(rows)
    cells = {(r, c): x for r, row in enumerate(rows) for c, x in enumerate(row)}
    player = [rc for rc, x in cells.items() if x in ("P", "P/G")]
    goal = [rc for rc, x in cells.items() if x in ("G", "P/G")]
    if n == 0 or any(len(row) != n for row in rows) or len(player) != 1 or len(goal) != 1:
        return "[down]"
    path = shortest_path(n, {rc for rc, x in cells.items() if x == "H"}, player[0], goal[0])
    return f"[{path[0]}]" if path else "[down]"


_SOLVERS: dict[str, Callable[[list[Message]], str]] = {  # by the game's class, so that every variant has it
    "textarena.envs.FrozenLake.env:FrozenLakeEnv": solve_frozen_lake,
}


def state_content(value: Any, _path: frozenset[int] = frozenset()) -> Any:
    """``value`` (a game's state) as JSON-ready content: objects by their class and fields, sets sorted, a value
    already on the path as ``"<cycle>"``; never a memory address (a default ``repr`` holds one, so a key made from it
    would differ between two deals of the same game)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if id(value) in _path:
        return "<cycle>"
    path = _path | {id(value)}
    if isinstance(value, dict):
        return sorted(([state_content(k, path), state_content(v, path)] for k, v in value.items()), key=repr)
    if isinstance(value, (list, tuple)):
        return [state_content(v, path) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((state_content(v, path) for v in value), key=repr)
    fields = getattr(value, "__dict__", None)
    if fields is None and hasattr(type(value), "__slots__"):
        fields = {k: getattr(value, k) for k in type(value).__slots__ if hasattr(value, k)}
    if isinstance(fields, dict) and not callable(value):
        return [type(value).__qualname__, state_content(fields, path)]
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))  # a function, a module, a bare object: its name only


def game_names() -> list[str]:
    """TextArena's game ids (wrapper variants left out): the ``textarena/<id>`` names."""
    return sorted(k for k in ENV_REGISTRY if not k.endswith(_VARIANTS))


class TextArenaEnv(Env):
    """One single-player TextArena game (see the module docstring). kwargs: ``game`` (set by the id) and the game's
    own kwargs (e.g. ``max_turns=5``), passed to ``textarena.make``."""

    description = "TextArena single-player game, played unchanged"

    def __init__(self, game: str, call_timeout_s: float = 60.0, **game_kwargs: Any):
        super().__init__()
        if game not in ENV_REGISTRY:
            raise ValueError(f"TextArenaEnv: unknown game {game!r} (see textarena's ENV_REGISTRY)")
        self.game_id = game
        self.make_id = game + "-raw" if game + "-raw" in ENV_REGISTRY else game
        self.game_kwargs = game_kwargs
        self.call_timeout_s = timeout_arg(call_timeout_s, "TextArenaEnv")
        self.game: Any = None
        self.current_key = ""
        self._rng: RNGStates | None = None  # None until the first reset seeds the game
        self.done = True

    def _call(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` with this env's states of ``random`` and ``numpy.random`` in place (:mod:`.rng`)."""
        try:
            result, self._rng = with_states(self._rng, fn, self.call_timeout_s, f"TextArena game {self.game_id!r}")
        except LibraryTimeout:
            self.game, self.done = None, True  # interrupted mid-call: the game's state is lost
            raise
        return result

    def _text(self) -> str:
        _, observation = self.game.get_observation()
        parts = [str(text).strip() for _, text, *kind in (observation or [])
                 if not (kind and getattr(kind[0], "name", "") == "PLAYER_ACTION")]  # the player's own move, echoed
        return "\n".join(p for p in parts if p)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """A new game for one player, seeded with ``seed`` (or a seed drawn from ``self.np_random``)."""
        super().reset(seed=seed)
        game_seed = seed if seed is not None else int(self.np_random.integers(2**31))

        def start() -> str:
            seed_globals(game_seed)  # TextArena seeds only `random` (in its reset); numpy's draws get the same seed
            try:
                self.game = textarena.make(self.make_id, **self.game_kwargs)
            except Exception as e:  # some games do not import on every Python (3.12-only syntax)
                raise ValueError(f"TextArena game {self.game_id!r} cannot be made: {describe(e)}") from e
            try:
                self.game.reset(num_players=1, seed=game_seed)
            except Exception as e:
                raise ValueError(f"TextArena game {self.game_id!r} cannot be played by one player: {describe(e)}") from e
            return self._text() or "(the game says nothing)"

        self._rng = None
        text = self._call(start)
        self.done = False
        state = getattr(getattr(self.game, "state", None), "game_state", None)
        content = json.dumps([text, state_content(state)])
        self.current_key = f"textarena/{self.game_id}:{hashlib.sha256(content.encode()).hexdigest()[:16]}"
        return [{"role": "user", "content": text}], {"task_key": self.current_key}

    def oracle_policy(self) -> Any:
        """The game's scripted solver as a :class:`agentrl.policy.ScriptedPolicy`, or None if it has none."""
        from agentrl.policy import ScriptedPolicy

        solve = _SOLVERS.get(str(ENV_REGISTRY[self.game_id].entry_point))
        return None if solve is None else ScriptedPolicy(lambda conversation, meta: solve(conversation))

    def task_key(self, seed: int) -> str:
        """The content identity of the game ``reset(seed=seed)`` deals (the env contract's ``task_key``): resets
        this instance to read it, which costs a game's set-up and nothing more."""
        return self.reset(seed=seed)[1]["task_key"]

    def step(self, action: str) -> StepResult:
        """Plays ``action`` as the move; terminates with the game's reward when the game ends."""
        if self.done or self.game is None:
            return [{"role": "user", "content": "The game is over. Call reset() for a new one."}], 0.0, True, False, {"invalid_action": True}

        def play() -> tuple[bool, str, Any]:
            done, _ = self.game.step(str(action))
            text = self._text()
            return done, text, (self.game.close() if done else None)

        done, text, closed = self._call(play)
        info: dict[str, Any] = {"task_key": self.current_key}
        reward = 0.0
        if done:
            self.done = True
            rewards, game_info = closed
            reward, bad = _number((rewards or {}).get(0, 0.0))
            player = (game_info or {}).get(0, {})
            info.update({k: v for k, v in player.items() if isinstance(v, (str, int, float, bool))})
            verdict = [str(player.get("reason", "")).strip()]
            if bad is not None:
                info["reward_error"] = f"the game's reward {bad!r:.300} is not a number; counted as 0"
                verdict.append(str(bad).strip() if isinstance(bad, str) else "")
            text = "\n".join(p for p in (text, *verdict) if p)
        return [{"role": "user", "content": text or "(the game says nothing)"}], reward, done, False, info


def _number(raw: Any) -> tuple[float, Any]:
    """(reward, None) for a finite number; else (0.0, ``raw``). Some games end a malformed move with the reason
    where the reward goes (Countdown, Cryptarithm, Slitherlink: "Invalid action format. ..."), and a reward that is
    not a finite number must not reach training."""
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        return 0.0, raw
    return (value, None) if math.isfinite(value) and not isinstance(raw, (str, bytes)) else (0.0, raw)
