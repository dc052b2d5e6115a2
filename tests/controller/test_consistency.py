"""The end-to-end mismatch checks (fp32, rollout temperature 0.7): the trainer's log-probs of the tokens the engine
sampled equal the engine's, before and after a real train_step and weight sync (Trainer.compute_logprobs against the
engine, not a separately loaded model), and a whole training run at α = 0 with a learning rate of ~0 stays on-policy
for 20 steps (no clipping, no IS truncation, KL(μ‖π) < 1e-6)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.7


def _compare(trainer, trajs) -> tuple[float, float, int]:
    """Returns (mean k3 KL(mu || pi), max |log mu - log pi|, tokens) over the generated tokens of ``trajs``."""
    logp = trainer.compute_logprobs(trajs)
    k3, diff, n = 0.0, 0.0, 0
    for i, t in enumerate(trajs):
        for pos in range(1, len(t.token_ids)):
            if t.loss_mask[pos]:
                d = float(logp[i, pos - 1]) - t.logprobs[pos]  # log(pi / mu)
                k3 += math.exp(d) - 1.0 - d
                diff = max(diff, abs(d))
                n += 1
    return k3 / max(n, 1), diff, n


async def test_engine_logprobs_equal_trainer_compute_logprobs_after_a_real_train_step(tmp_path):
    from transformers import AutoTokenizer

    from agentrl.inference.config import EngineConfig
    from agentrl.inference.vllm_engine import VLLMEngine
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.models import ensure_tiny_model
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig
    from agentrl.trainer.config import OptimizerConfig, TrainerConfig
    from agentrl.trainer.trainer import Trainer

    model = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(str(model))
    trainer = Trainer(TrainerConfig(optimizer=OptimizerConfig(lr=3e-3), temperature=TEMPERATURE, device="cpu",
                                    dtype="float32", micro_batch_size=16), model)
    engine = await VLLMEngine.create(EngineConfig(model=str(model), max_model_len=1024, pause_mode="abort", seed=0,
                                                        executor="in_core"))
    try:
        assert engine.cfg.logprobs_mode == "processed_logprobs"  # mu: the distribution actually sampled from
        policy = AgentLoopPolicy(engine, tok, RolloutConfig(temperature=TEMPERATURE, max_tokens_per_turn=16,
                                                            max_turns=3, max_context_tokens=1024))
        mcfg = ManagerConfig(num_groups=2, group_size=4, max_turns=3)

        async def rollout(seed0: int):
            specs = [EpisodeSpec("agentrl/FrozenLake-v0", {"size": 3}, seed=seed0 + i) for i in range(10)]
            async with EnvManager(mcfg, policy) as mgr:
                return await mgr.collect_groups(specs)

        groups = await rollout(0)
        trajs = [t for g in groups for t in g.trajectories]
        k3, diff, n = _compare(trainer, trajs)
        assert n > 50 and k3 < 1e-6 and diff < 1e-3, (k3, diff, n)

        # A real update (lr 3e-3). The untrained policy's rewards are mostly equal within a group, which would give
        # zero advantages and no update at all: alternate +1/-1 instead.
        metrics = trainer.train_step(groups, advantages=[(-1.0) ** i for i in range(len(trajs))])
        assert metrics["mismatch/kl_k3"] < 1e-6 and metrics["is/truncated_frac"] == 0.0
        await engine.update_weights(trainer.state_dict_for_inference(), 1)

        groups = await rollout(100)
        trajs = [t for g in groups for t in g.trajectories]
        assert {v for t in trajs for v, m in zip(t.versions, t.loss_mask) if m} == {1}
        k3, diff, n = _compare(trainer, trajs)
        assert n > 50 and k3 < 1e-6 and diff < 1e-3, (k3, diff, n)
        # the update really changed the policy (the check above is not vacuous)
        moved = trainer.compute_logprobs(trajs[:4])
        trainer_before = Trainer(TrainerConfig(temperature=TEMPERATURE, device="cpu", dtype="float32"), model)
        assert float((moved - trainer_before.compute_logprobs(trajs[:4])).abs().max()) > 1e-2
    finally:
        await engine.close()


def test_twenty_steps_at_alpha_0_with_lr_0_stay_on_policy(tmp_path):
    """Issue 12, defect 9 (also a row of benchmarks/RESULTS-offpolicy.md): the learning rate is 1e-30 (the config
    refuses 0; the weights do not move in float32), so every step's proximal policy is the behaviour policy."""
    import subprocess

    run_dir = tmp_path / "lr0"
    args = [sys.executable, "-m", "agentrl.cli", "train", str(ROOT / "configs" / "quickstart.yaml"), "steps=20",
            "async_ratio=0", "manager.num_groups=2", "manager.group_size=2", "warm_start.episodes=0",
            "eval.episodes=0", "rollout.max_turns=3", "manager.max_turns=3", f"rollout.temperature={TEMPERATURE}",
            "trainer.optimizer.lr=1e-30", "trainer.dtype=float32", "checkpoint_every=20", "progress=false",
            "tensorboard=false", "engine.executor=in_core", f"run_dir={run_dir}"]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 21))
    for r in rows:
        assert r["train/mismatch/kl_k3"] < 1e-6, r
        assert r["train/ratio/clip_frac"] < 1e-3 and r["train/is/truncated_frac"] < 1e-3, r
        assert r["train/staleness/max"] == 0
        assert r["weights/path"] == "in_driver"  # the one path test_train.py runs at α = 1 only
