"""Simulated runs: the cost models, and the real controller on them giving the timeline their costs imply."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.simulate import run_virtual
from agentrl.simulate.models import EngineModel, ResponseModel, SimEngine, TrainerModel
from agentrl.simulate.run import SimulationConfig, simulate


def test_the_engine_model_charges_prefill_and_batch_dependent_decode_steps():
    eng = SimEngine(EngineModel(prefill_s_per_token=0.001, decode_step_s=0.1, decode_step_s_per_seq=0.05, chunk=1))

    async def main():
        a = asyncio.create_task(eng.generate_tokens(1000, 4))  # prefill 1 s, then 4 steps
        b = asyncio.create_task(eng.generate_tokens(1000, 4))
        return await asyncio.gather(a, b)

    (va, vb), took = run_virtual(main())
    # both prefill together (1 s), then decode as a batch of 2: 4 x (0.1 + 0.05 x 2) = 0.8 s
    assert took == pytest.approx(1.8) and va == vb == [0, 0, 0, 0] and eng.busy_s == pytest.approx(1.8)
    assert TrainerModel(flops_per_token=6e9, peak_flops=1e15, mfu=0.5, gpus=4).step_s(1_000_000) == pytest.approx(3.0)


def test_a_simulated_run_takes_the_time_its_costs_imply():
    # a step: 1 turn (10 tokens x 0.1 s decode + 2 s env) = 3 s of rollout, then 4 x 10 tokens x 0.1 s = 4 s of
    # training; synchronous (alpha 0): 3 steps x 7 s.
    sim = SimulationConfig(
        run={"steps": 3, "async_ratio": 0, "manager": {"num_groups": 2, "group_size": 2, "max_turns": 4},
             "env": {"id": "sim/Env-v0", "kwargs": {"turns": 1, "latency": 2.0}}},
        engine=EngineModel(decode_step_s=0.1, chunk=1),
        trainer=TrainerModel(flops_per_token=0.1, peak_flops=1.0, mfu=1.0, gpus=1),
        response=ResponseModel(response_mean=10, prompt_tokens=0))
    r = simulate(sim)
    assert r["wall_s"] == pytest.approx(21.0) and r["staleness"] == {0: 1.0}
    assert r["trainer_busy_frac"] == pytest.approx(12 / 21)


def test_the_cli_sweeps_and_reports_speed_ups(capsys):
    from agentrl.cli import main

    rc = main(["simulate", "configs/simulate_env_latency.yaml", "run.steps=3",
               "run.manager.num_groups=2", "run.manager.group_size=2", "--sweep", "run.async_ratio=0,1", "--json"])
    assert rc == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [r["run.async_ratio"] for r in rows] == ["0", "1"]
    assert rows[1]["wall_s"] < rows[0]["wall_s"]  # slow envs: running ahead pays
    assert max(int(k) for k in rows[1]["staleness"]) <= 1 and list(rows[0]["staleness"]) == ["0"]
