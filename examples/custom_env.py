"""Define a new text environment, register it, make it, and play it with a scripted policy.

Run: .venv/bin/python examples/custom_env.py

The env asks for a word spelled backwards. It follows the agentrl.Env contract: ``reset`` returns the opening chat
messages, ``step`` returns the messages to append, all randomness comes from ``self.np_random`` (seeded by
``reset(seed=...)``), and a wrong or malformed answer is an observation with a documented reward, not an error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import agentrl
from agentrl.policy import EpisodeMeta, ScriptedPolicy

WORDS = ("planet", "rocket", "garden", "silver", "window", "forest", "candle", "bridge")


class ReverseWordEnv(agentrl.Env):
    """Spell a word backwards.

    Observation: a system message with the rules and a user message ``Reverse: planet``.
    Action: the reversed word, bare or as ``<answer>tenalp</answer>`` (case-insensitive).
    Reward: 1.0 for the right answer; 0.0 for a wrong one, after which the agent may try again.
    Termination: on the right answer, or after ``max_tries`` answers. Truncation: never.
    Invalid action: an empty answer is a wrong answer (reward 0.0, one try used).
    """

    description = "Spell a random word backwards (example of a custom env)."

    def __init__(self, max_tries: int = 2):
        super().__init__()
        self.max_tries = max_tries
        self.word, self.tries = "", 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        self.tries = 0
        return [
            {"role": "system", "content": "Spell the word backwards. Reply like <answer>olleh</answer>."},
            {"role": "user", "content": f"Reverse: {self.word}"},
        ], {"word": self.word}

    def step(self, action: str):
        self.tries += 1
        text = action.split("<answer>")[-1].split("</answer>")[0].strip().lower()
        if text == self.word[::-1]:
            return [{"role": "user", "content": "Correct."}], 1.0, True, False, {"correct": True}
        out_of_tries = self.tries >= self.max_tries
        msg = "Wrong." + (f" It was {self.word[::-1]}." if out_of_tries else " Try again.")
        return [{"role": "user", "content": msg}], 0.0, out_of_tries, False, {"correct": False}


def reverse_policy(conversation: list[dict[str, Any]], meta: EpisodeMeta) -> str:
    """A scripted policy: reads the word from the first user message and reverses it."""
    task = next(m["content"] for m in conversation if m["role"] == "user")
    return f"<answer>{task.removeprefix('Reverse: ')[::-1]}</answer>"


async def play(env: agentrl.Env, policy: ScriptedPolicy, seed: int) -> float:
    """Plays one episode with the async API the environment manager uses; returns the total reward."""
    session = policy.session(EpisodeMeta(trajectory_id=f"demo-{seed}", group_id="demo", env_id="example/ReverseWord-v0", seed=seed))
    new_messages, _ = await env.areset(seed=seed)
    total = 0.0
    while True:
        action = await session.act(new_messages)
        new_messages, reward, terminated, truncated, _ = await env.astep(action.text)
        total += float(reward)
        print(f"  seed {seed}: {action.text!r} -> {new_messages[-1]['content']!r} (reward {reward})")
        if terminated or truncated:
            break
    await session.aclose()
    return total


def main() -> None:
    # A string entry point works too ("mypackage.envs:ReverseWordEnv"); a class is fine for a script.
    agentrl.register("example/ReverseWord-v0", entry_point=ReverseWordEnv, max_episode_steps=4,
                     description=ReverseWordEnv.description)
    env = agentrl.make("example/ReverseWord-v0")

    from gymnasium.utils.env_checker import check_env

    check_env(env.unwrapped, skip_render_check=True)
    print("check_env: ok")

    policy = ScriptedPolicy(reverse_policy)
    returns = [asyncio.run(play(env, policy, seed)) for seed in range(3)]
    print(f"returns: {returns}")
    assert returns == [1.0, 1.0, 1.0], returns
    print("solved every episode")


if __name__ == "__main__":
    main()
