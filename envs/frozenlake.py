"""FrozenLake as a multi-turn text game: walk to the goal across a grid without falling into a hole."""

from __future__ import annotations

from collections import deque
from typing import Any

from agentrl.core import Env, Message, StepResult
from agentrl.envs.utils import answer_or_text, last_content, preview

MOVES: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
PLAYER, GOAL, HOLE, ICE = "P", "G", "H", "."

SYSTEM_PROMPT = (
    "FrozenLake. P is you, G the goal, H a hole, . ice. Reach G without stepping on H. "
    "Moves: up, down, left, right. Reply with one move, like <answer>up</answer>."
)


def render_board(size: int, holes: set[tuple[int, int]], goal: tuple[int, int], player: tuple[int, int]) -> str:
    """Returns the board as ``size`` lines of space-separated cells, top row first."""
    rows = []
    for r in range(size):
        cells = []
        for c in range(size):
            if (r, c) == player:
                cells.append(PLAYER)
            elif (r, c) == goal:
                cells.append(GOAL)
            elif (r, c) in holes:
                cells.append(HOLE)
            else:
                cells.append(ICE)
        rows.append(" ".join(cells))
    return "\n".join(rows)


def shortest_path(size: int, holes: set[tuple[int, int]], start: tuple[int, int], goal: tuple[int, int]) -> list[str] | None:
    """Returns the moves of a shortest hole-free path from ``start`` to ``goal`` (BFS, moves tried in the order
    up, down, left, right), or None if there is none."""
    prev: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path = []
            while prev[cell] is not None:
                cell, move = prev[cell]  # type: ignore[misc]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in holes and nxt not in prev:
                prev[nxt] = (cell, move)
                queue.append(nxt)
    return None


class FrozenLakeEnv(Env):
    """FrozenLake: move ``P`` to ``G`` on a square grid without stepping on a hole ``H``.

    - **Observation**: ``reset`` gives a system message (rules and action format) and a user message
      ``"Board:\\n<rows>"``: ``size`` rows of space-separated cells, top row first (``P`` you, ``G`` goal, ``H``
      hole, ``.`` ice). Each ``step`` gives one user message: the new board (prefixed by a note when the move was
      invalid or hit the edge), or the end of the game.
    - **Action**: one of ``up``, ``down``, ``left``, ``right``; canonical format ``<answer>up</answer>``. Parsing is
      lenient: the last ``<answer>`` block or else the bare text, case-insensitive, surrounding quotes and
      punctuation ignored.
    - **Reward**: 1.0 on reaching the goal, 0.0 on every other step (falling into a hole included).
    - **Termination**: on reaching the goal (``info["won"]``) or falling into a hole.
    - **Truncation**: never by the env itself; the registered id ``agentrl/FrozenLake-v0`` is wrapped in a
      ``TimeLimit`` of 20 steps (``agentrl.make(id, max_episode_steps=N)`` to change it).
    - **Invalid action** (anything that is not one of the four moves): the observation says so and repeats the
      board, reward ``invalid_reward`` (default 0.0), the position does not change and the episode continues.
      Walking into the edge is a valid move that leaves the position unchanged.
    - **State key** (``info["state_key"]``, for ``gigpo``'s step groups): the player's cell as ``"row,col"``.
    - **Randomness** (all from ``self.np_random``): start, goal (Manhattan distance at least ``min(size, 3) - 1``),
      holes (each other cell with probability ``hole_prob``; a hole-free path always exists), and with
      ``slip_prob > 0`` the chance that a move goes sideways instead.
    """

    description = "Grid puzzle: walk P to the goal G without falling into a hole H (up/down/left/right)."

    def __init__(self, size: int = 4, hole_prob: float = 0.2, slip_prob: float = 0.0, invalid_reward: float = 0.0):
        super().__init__()
        if not isinstance(size, int) or not 2 <= size <= 12:
            raise ValueError(f"FrozenLakeEnv: size must be an int in [2, 12], got {size!r}")
        if not 0.0 <= hole_prob < 1.0:
            raise ValueError(f"FrozenLakeEnv: hole_prob must be in [0, 1), got {hole_prob!r}")
        if not 0.0 <= slip_prob <= 1.0:
            raise ValueError(f"FrozenLakeEnv: slip_prob must be in [0, 1], got {slip_prob!r}")
        self.size, self.hole_prob, self.slip_prob = size, float(hole_prob), float(slip_prob)
        self.invalid_reward = float(invalid_reward)
        self.holes: set[tuple[int, int]] = set()
        self.goal = self.player = (0, 0)
        self.done = False

    # -- gymnasium API ---------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Draws a new board; returns ``([system, user], info)``. The same seed gives the same board."""
        super().reset(seed=seed)
        self._generate()
        self.done = False
        obs = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Board:\n" + self.board()},
        ]
        return obs, self._info(won=False, invalid=False)

    def task_key(self, seed: int) -> str:
        """The board ``reset(seed=seed)`` draws (start, goal and holes): a small grid has few distinct boards, so
        seeds collide."""
        self.reset(seed=seed)
        return f"{self.size}:{self.board()}"

    def step(self, action: str) -> StepResult:
        """Applies one move; returns ``([user message], reward, terminated, False, info)``."""
        if self.done:
            return self._reply("The game is over. Call reset() to play again."), 0.0, True, False, self._info(False, True)
        move = answer_or_text(str(action)).lower()
        if move not in MOVES:
            text = f"Invalid move {preview(str(action))!r}. Reply with up, down, left or right, like <answer>up</answer>.\nBoard:\n"
            return self._reply(text + self.board()), self.invalid_reward, False, False, self._info(False, True)
        if self.slip_prob > 0 and self.np_random.random() < self.slip_prob:
            sideways = ["left", "right"] if move in ("up", "down") else ["up", "down"]
            move = sideways[int(self.np_random.integers(2))]
        dr, dc = MOVES[move]
        r, c = self.player[0] + dr, self.player[1] + dc
        if not (0 <= r < self.size and 0 <= c < self.size):
            return self._reply("You hit the edge.\nBoard:\n" + self.board()), 0.0, False, False, self._info(False, False)
        self.player = (r, c)
        if self.player == self.goal:
            self.done = True
            return self._reply("You reached the goal!"), 1.0, True, False, self._info(True, False)
        if self.player in self.holes:
            self.done = True
            return self._reply("You fell into a hole. Game over."), 0.0, True, False, self._info(False, False)
        return self._reply("Board:\n" + self.board()), 0.0, False, False, self._info(False, False)

    # -- helpers ---------------------------------------------------------------------------------------------
    def board(self) -> str:
        """Returns the current board as rendered in observations."""
        return render_board(self.size, self.holes, self.goal, self.player)

    def _generate(self) -> None:
        n = self.size
        min_dist = min(n, 3) - 1
        for _ in range(100):
            cells = [(r, c) for r in range(n) for c in range(n)]
            start = cells[int(self.np_random.integers(len(cells)))]
            far = [x for x in cells if abs(x[0] - start[0]) + abs(x[1] - start[1]) >= min_dist]
            goal = far[int(self.np_random.integers(len(far)))]
            draws = self.np_random.random(len(cells))
            holes = {x for x, u in zip(cells, draws) if u < self.hole_prob and x not in (start, goal)}
            if shortest_path(n, holes, start, goal) is not None:
                break
        else:  # only reachable with absurd hole_prob; an empty lake is always solvable
            holes = set()
        self.player, self.goal, self.holes = start, goal, holes

    def _info(self, won: bool, invalid: bool) -> dict[str, Any]:
        # The board is the task's, the same for every episode of a group: the cell alone names the state.
        return {"position": self.player, "goal": self.goal, "won": won, "invalid_action": invalid,
                "state_key": "%d,%d" % self.player}

    @staticmethod
    def _reply(text: str) -> list[Message]:
        return [{"role": "user", "content": text}]

    # -- scripted solver -------------------------------------------------------------------------------------
    @staticmethod
    def solve(conversation: list[Message]) -> str:
        """See :func:`solve`."""
        return solve(conversation)


def parse_board(text: str) -> tuple[int, set[tuple[int, int]], tuple[int, int], tuple[int, int]] | None:
    """Parses the last board in ``text``; returns ``(size, holes, goal, player)`` or None if there is no
    complete board."""
    rows: list[list[str]] = []
    block: list[list[str]] = []
    for line in text.splitlines():
        cells = line.split()
        if cells and all(x in (PLAYER, GOAL, HOLE, ICE) for x in cells):
            block.append(cells)
        else:
            if block:
                rows = block
            block = []
    if block:
        rows = block
    n = len(rows)
    if n == 0 or any(len(r) != n for r in rows):
        return None
    holes = {(r, c) for r in range(n) for c in range(n) if rows[r][c] == HOLE}
    player = [(r, c) for r in range(n) for c in range(n) if rows[r][c] == PLAYER]
    goal = [(r, c) for r in range(n) for c in range(n) if rows[r][c] == GOAL]
    if len(player) != 1 or len(goal) != 1:
        return None
    return n, holes, goal[0], player[0]


def solve(conversation: list[Message]) -> str:
    """Scripted policy: the first move of a shortest hole-free path on the last board shown, as
    ``<answer>MOVE</answer>``. Uses the text observations only. Falls back to ``<answer>up</answer>`` when the last
    user message holds no board (e.g. after the game ended)."""
    parsed = parse_board(last_content(conversation))
    if parsed is None:
        return "<answer>up</answer>"
    size, holes, goal, player = parsed
    path = shortest_path(size, holes, player, goal)
    return f"<answer>{path[0] if path else 'up'}</answer>"
