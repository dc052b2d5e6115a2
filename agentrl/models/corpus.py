"""Text the tiny model's tokenizer is trained on, generated offline and deterministically from a seed.

The corpus covers what the project's environments and agents actually exchange: chat-template markup, arithmetic
and ``\\boxed{}`` / ``<answer>`` answers, number guessing (higher/lower), grid moves (up/down/left/right), JSON tool
calls and tool responses, shell commands and small Python programs. When built-in envs are registered, their reset
observations are added too (best effort: an env that fails to build is skipped, never fatal).
"""

from __future__ import annotations

import json
import random
from typing import Iterator

WORDS = (
    "the a an is are was be to of and in on at for with by from as it this that you your we our they "
    "what which who how why when where yes no not can will should must may try again next first last "
    "answer question problem solve solution step think reason check result final value number digit sum "
    "difference product quotient equals plus minus times divided remainder even odd prime square root "
    "guess higher lower correct wrong too high low between range secret found turns left remaining "
    "up down left right north south east west move moves position goal wall grid row column start end "
    "reached blocked invalid action actions observation reward done episode environment agent assistant "
    "user system tool tools call calls function arguments name result error file files read write edit "
    "run test tests pass fail failed passed bug fix patch diff repository code line lines return value "
    "list dict string integer boolean object array key keys item items search query lookup calculator "
    "expression weather city temperature today date time please thank here there now then only each "
    "all some any more less most least same different true false none null ok done output input format"
).split()

NAMES = ("alice", "bob", "carol", "dave", "eve", "frank", "grace", "heidi", "ivan", "judy")
CITIES = ("paris", "london", "tokyo", "berlin", "madrid", "rome", "oslo", "lima", "cairo", "delhi")

PY_SNIPPETS = (
    "def add(a, b):\n    return a + b\n",
    "def is_even(n: int) -> bool:\n    return n % 2 == 0\n",
    "for i in range(10):\n    print(i)\n",
    "import json\n\ndata = json.loads(text)\nprint(data['key'])\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n",
    "if x is None:\n    raise ValueError('x must not be None')\n",
    "with open(path) as f:\n    lines = f.read().splitlines()\n",
    "def test_add():\n    assert add(2, 3) == 5\n",
)

SHELL = (
    "ls -la", "cat README.md", "python -m pytest -x -q", "git diff", "git status", "grep -rn 'def ' src/",
    "sed -n 1,40p main.py", "echo hello", "pwd", "cd /workspace && ls", "python main.py", "pip list",
)


def _arith(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 999), rng.randint(1, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b}", value


def _math_turns(rng: random.Random) -> list[dict]:
    expr, value = _arith(rng)
    answer = rng.choice([f"\\boxed{{{value}}}", f"<answer>{value}</answer>", f"The answer is {value}."])
    return [
        {"role": "user", "content": f"What is {expr}? Put the final answer in \\boxed{{}}."},
        {"role": "assistant", "content": f"{expr} = {value}. {answer}"},
        {"role": "user", "content": rng.choice(["Correct.", "Wrong, try again.", f"The answer {value} is correct."])},
    ]


def _guess_turns(rng: random.Random) -> list[dict]:
    lo, hi = 1, rng.choice([10, 50, 100, 1000])
    secret = rng.randint(lo, hi)
    msgs = [{"role": "user", "content": f"I picked a secret number between {lo} and {hi}. Guess it. Reply with <answer>N</answer>."}]
    for _ in range(rng.randint(2, 6)):
        guess = rng.randint(lo, hi)
        msgs.append({"role": "assistant", "content": f"<answer>{guess}</answer>"})
        if guess == secret:
            msgs.append({"role": "user", "content": f"Correct! The number was {secret}."})
            break
        hint = "higher" if guess < secret else "lower"
        msgs.append({"role": "user", "content": f"{guess} is too {'low' if hint == 'higher' else 'high'}. Go {hint}."})
    return msgs


def _grid_turns(rng: random.Random) -> list[dict]:
    w, h = rng.randint(3, 8), rng.randint(3, 8)
    x, y, gx, gy = rng.randrange(w), rng.randrange(h), rng.randrange(w), rng.randrange(h)
    rows = ["".join("G" if (c, r) == (gx, gy) else "A" if (c, r) == (x, y) else rng.choice("....#") for c in range(w)) for r in range(h)]
    msgs = [{"role": "user", "content": f"Grid {w}x{h}. You are at ({x}, {y}); the goal is at ({gx}, {gy}).\n" + "\n".join(rows) + "\nMove with one of: up, down, left, right."}]
    for _ in range(rng.randint(1, 4)):
        move = rng.choice(["up", "down", "left", "right"])
        msgs.append({"role": "assistant", "content": rng.choice([move, f"<answer>{move}</answer>", f"I move {move}."])})
        msgs.append({"role": "user", "content": rng.choice([f"You moved {move}. Now at ({x}, {y}).", "Blocked by a wall.", "Invalid action: reply up, down, left or right.", "You reached the goal!"])})
    return msgs


TOOLS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluates an arithmetic expression.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Looks up a key in the database.",
     "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Returns the weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "run_shell", "description": "Runs a shell command in the sandbox.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}, "required": ["command"]}}},
]


def _tool_turns(rng: random.Random) -> list[dict]:
    kind = rng.randrange(4)
    if kind == 0:
        expr, value = _arith(rng)
        call, result, question = {"name": "calculator", "arguments": {"expression": expr}}, str(value), f"Compute {expr}."
    elif kind == 1:
        who = rng.choice(NAMES)
        call, result, question = {"name": "lookup", "arguments": {"key": who}}, f"{who}: {rng.randint(18, 90)} years, lives in {rng.choice(CITIES)}", f"How old is {who}?"
    elif kind == 2:
        city = rng.choice(CITIES)
        call, result, question = {"name": "get_weather", "arguments": {"city": city, "unit": "celsius"}}, json.dumps({"city": city, "temperature": rng.randint(-10, 35)}), f"What is the weather in {city}?"
    else:
        cmd = rng.choice(SHELL)
        call, result, question = {"name": "run_shell", "arguments": {"command": cmd, "timeout": 10}}, f"exit code {rng.randint(0, 1)}\n" + rng.choice(PY_SNIPPETS), "Run the tests and fix the bug."
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": rng.choice([f"<answer>{result.splitlines()[0]}</answer>", f"The result is {result.splitlines()[0]}."])},
    ]


def _render(messages: list[dict], tools: list[dict] | None = None) -> str:
    """A plain-Python rendering in the chat template's format (so the tokenizer learns the markup's merges)."""
    parts = []
    if tools:
        parts.append("<|im_start|>system\n# Tools\n<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools><|im_end|>\n")
    for m in messages:
        if m["role"] == "tool":
            parts.append(f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>\n")
        else:
            parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    return "".join(parts)


def _env_texts(max_per_env: int = 8, skip: tuple[str, ...] = ()) -> Iterator[str]:
    """Reset observations of the registered built-in envs but ``skip`` (best effort; skips any env that fails)."""
    try:
        from agentrl.registration import make, registered_ids
    except Exception:
        return
    for env_id in sorted(registered_ids()):
        # Built-in envs only; SWE envs start sandboxes on reset, which a model build must not do.
        if not env_id.startswith("agentrl/") or "swe" in env_id.lower() or env_id in skip:
            continue
        for seed in range(max_per_env):
            try:
                env = make(env_id)
                try:
                    obs, _ = env.reset(seed=seed)
                finally:
                    env.close()
            except Exception:
                break
            if isinstance(obs, str):
                yield obs
            elif isinstance(obs, list):
                yield _render([m for m in obs if isinstance(m, dict) and isinstance(m.get("content"), str)])


def generate_corpus(seed: int = 0, n_dialogues: int = 3000, include_envs: bool = True,
                    skip_envs: tuple[str, ...] = ()) -> list[str]:
    """Returns the training texts (one string each). Same ``seed`` and same registered envs -> same corpus.
    ``skip_envs``: env ids whose reset observations stay out."""
    rng = random.Random(seed)
    texts: list[str] = []
    makers = (_math_turns, _guess_turns, _grid_turns, _tool_turns)
    for i in range(n_dialogues):
        maker = makers[i % len(makers)]
        msgs = maker(rng)
        if rng.random() < 0.5:
            msgs.insert(0, {"role": "system", "content": rng.choice(["You are a helpful assistant.", "You are an agent acting in an environment.", "Think step by step."])})
        texts.append(_render(msgs, TOOLS if maker is _tool_turns and rng.random() < 0.3 else None))
    for _ in range(n_dialogues // 2):
        texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))).capitalize() + rng.choice(".?!"))
    texts.extend(PY_SNIPPETS * 20)
    texts.extend(SHELL * 20)
    texts.append(" ".join(str(i) for i in range(1000)))
    if include_envs:
        texts.extend(list(_env_texts(skip=skip_envs)) * 4)  # few but exactly what the envs send: weigh them up
    return texts


def episode_texts(env_id: str, episodes: int, seed: int = 0, mistake_rate: float = 0.3) -> list[str]:
    """Returns ``episodes`` whole episodes of ``env_id`` rendered with the tiny model's chat template (tool schemas
    included when the env gives them): its scripted solver plays, with a fraction ``mistake_rate`` of the turns
    replaced by the env's scripted mistakes when it has them. For a tokenizer specialised on one env: its markup,
    words, names and tool calls become few tokens each."""
    from agentrl.registration import make
    from agentrl.envs import mistakes_for, solver_for
    from transformers.utils.chat_template_utils import render_jinja_template

    from agentrl.models.chat_template import CHAT_TEMPLATE

    solve = solver_for(env_id)
    try:
        mistake = mistakes_for(env_id)
    except LookupError:
        mistake = None
    rng = random.Random(seed)
    env = make(env_id)
    texts = []
    try:
        for i in range(episodes):
            obs, info = env.reset(seed=seed * 1_000_003 + i)
            convo = [dict(m) for m in obs]
            for _ in range(32):
                action = mistake(convo, rng) if mistake and rng.random() < mistake_rate else solve(convo)
                convo.append({"role": "assistant", "content": action})
                obs, _, terminated, truncated, _ = env.step(action)
                convo.extend(dict(m) for m in obs)
                if terminated or truncated:
                    break
            rendered, _ = render_jinja_template([convo], tools=info.get("tools"), chat_template=CHAT_TEMPLATE)
            texts.append(rendered[0])
    finally:
        env.close()
    return texts
