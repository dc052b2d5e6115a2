"""The tool-use demo's pieces that need no engine: its config, the warm start's scripted mistakes, the tool metrics
every step and evaluation report. (Its learning run is a benchmark: benchmarks/bench_tooluse_demo.py.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.config import ConfigError
from agentrl.envs.tool_lookup import mistake
from agentrl.controller.run import load_config, tool_metrics

ROOT = Path(__file__).resolve().parents[2]
TOOLUSE = ROOT / "configs" / "tooluse.yaml"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def test_tooluse_config_loads_and_uses_the_envs_mistakes():
    cfg = load_config(TOOLUSE)
    assert cfg.env.id == "agentrl/ToolLookup-v0" and cfg.engine.model == "tiny-tool"
    assert cfg.async_ratio >= 1 and cfg.warm_start.episodes > 0 and cfg.warm_start.noise > 0
    assert cfg.warm_start.noise_actions == []  # empty: ToolLookupEnv.mistake plays the noise


def test_noise_without_actions_needs_an_env_with_scripted_mistakes():
    with pytest.raises(ConfigError, match=r"warm_start.noise_actions must list the random actions.*FrozenLake-v0 has no "
                                          r"scripted mistakes"):
        load_config(QUICKSTART, ["warm_start.noise_actions=[]"])
    assert load_config(QUICKSTART, ["warm_start.noise_actions=[]", "warm_start.noise=0"]).warm_start.noise == 0


def test_noisy_plays_the_mistake_function_deterministically():
    from agentrl.envs.tool_lookup import solve
    from agentrl.controller.warmstart import noisy

    convo = [{"role": "system", "content": "x"}, {"role": "user", "content": "How old is Ann?"}]
    meta = SimpleNamespace(trajectory_id="t0", env_id="agentrl/ToolLookup-v0", seed=None)
    assert noisy(solve, mistake, 0.0)(convo, meta) == solve(convo)
    always = noisy(solve, mistake, 1.0, seed=3)
    assert always(convo, meta) == always(convo, meta) != solve(convo)
    with pytest.raises(ValueError, match="noise > 0 needs actions"):
        noisy(solve, [], 0.5)


def test_tool_metrics_are_per_episode_means():
    trajs = [SimpleNamespace(info={"chat/tool_parse_errors": 2, "invalid_actions": 3, "parse_errors": 2}),
             SimpleNamespace(info={"chat/tool_parse_errors": 0, "invalid_actions": 0, "parse_errors": 0}),
             SimpleNamespace(info={})]  # an episode that failed before its first step
    m = tool_metrics(trajs)
    assert m == {"parse_errors_per_episode": pytest.approx(2 / 3), "invalid_actions_per_episode": 1.0}
    assert tool_metrics([SimpleNamespace(info={"chat/tool_parse_errors": 1})]) == {"parse_errors_per_episode": 1.0}
    assert tool_metrics([]) == {}


def test_noisy_demonstrations_repeat_across_runs_at_the_same_seeds():
    """Trajectory ids carry a per-manager random prefix: the noise must follow the episode's env seed instead, or
    every run at the same config and seed warm-starts from different demonstrations."""
    from agentrl.envs.tool_lookup import solve
    from agentrl.controller.warmstart import noisy

    convo = [{"role": "system", "content": "x"}, {"role": "user", "content": "How old is Ann?"}]
    act = noisy(solve, mistake, 0.5, seed=3)

    def plays(prefix: str) -> list[str]:
        return [act(convo, SimpleNamespace(trajectory_id=f"{prefix}-g{i}#{k}.{k}", group_id=f"{prefix}-g{i}",
                                           env_id="agentrl/ToolLookup-v0", seed=i))
                for i in range(20) for k in range(2)]

    run_a, run_b = plays("a1b2c3"), plays("d4e5f6")
    assert run_a == run_b
    assert 5 < sum(a != solve(convo) for a in run_a) < 35  # the noise is still there, per episode
    assert any(run_a[2 * i] != run_a[2 * i + 1] for i in range(20))  # and differs within a group of one seed
