"""A simulated training run: the real controller loop (:func:`agentrl.controller.run._loop`: manager, admission,
batch schedule, streamed steps, tail batching, weight-sync points) on the virtual clock, with the cost models of
:mod:`agentrl.simulate.models` in place of the engine, the trainer and the envs.

Outputs (:func:`simulate`): the run's virtual wall time, the trainer's and the engine's busy fractions, the
staleness histogram of trained tokens' trajectories (oldest token), and steps per hour.
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
from dataclasses import dataclass, field
from typing import Any

from agentrl.simulate.clock import run_virtual
from agentrl.simulate.models import EngineModel, ResponseModel, SimEngine, SimPolicy, SimTrainer, TrainerModel

SIM_ENV = "sim/Env-v0"


@dataclass
class SimulationConfig:
    """``run``: :class:`~agentrl.controller.config.TrainConfig` fields (``env.id`` defaults to ``sim/Env-v0``, whose
    ``env.kwargs`` are :class:`~agentrl.simulate.models.SimEnv`'s; no warm start or evaluation is simulated);
    ``engine``, ``trainer``, ``response``: the cost models."""

    run: dict[str, Any] = field(default_factory=dict)
    engine: EngineModel = field(default_factory=EngineModel)
    trainer: TrainerModel = field(default_factory=TrainerModel)
    response: ResponseModel = field(default_factory=ResponseModel)


def _register() -> None:
    from agentrl.registration import register, registered_ids

    if SIM_ENV not in registered_ids():
        register(SIM_ENV, entry_point="agentrl.simulate.models:SimEnv",
                 description="a simulated env: it only costs time (agentrl simulate)")


def train_config(sim: SimulationConfig, run_dir: str) -> Any:
    from agentrl.config import from_dict
    from agentrl.controller.config import TrainConfig

    _register()
    run = {"env": {"id": SIM_ENV}, **sim.run, "run_dir": run_dir, "progress": False, "tensorboard": False,
           "warm_start": {"episodes": 0}, "eval": {"episodes": 0}}
    return from_dict(TrainConfig, run, "run")


def simulate(sim: SimulationConfig, seed: int = 0) -> dict[str, Any]:
    """Runs ``sim`` on the virtual clock; returns its figures (module docstring)."""
    from agentrl.controller.ledger import TaskLedger
    from agentrl.controller.run import RunFiles, _loop
    from agentrl.controller.weights import WeightSync

    random.seed(seed)  # the envs' draws: the same seed gives the same simulation
    with tempfile.TemporaryDirectory(prefix="agentrl-sim-") as d:
        cfg = train_config(sim, d)
        cfg = dataclasses.replace(cfg, trajectory_log=dataclasses.replace(cfg.trajectory_log, per_step=0))
        engine, trainer = SimEngine(sim.engine), SimTrainer(sim.trainer)
        policy = SimPolicy(engine, sim.response, seed)

        async def main() -> dict[str, Any]:
            return await _loop(cfg, RunFiles(d), trainer, engine, WeightSync(trainer, engine), policy,
                               TaskLedger(cfg.env), 0, {}, None, None)

        _, wall = run_virtual(main())
    trained = sum(trainer.staleness.values())
    return {"wall_s": wall, "steps": cfg.steps, "steps_per_hour": 3600 * cfg.steps / wall if wall else float("inf"),
            "trainer_busy_frac": trainer.busy_s / wall if wall else 0.0,
            "engine_busy_frac": engine.busy_s / wall if wall else 0.0,
            "staleness": {int(k): v / trained for k, v in sorted(trainer.staleness.items())} if trained else {},
            "async_ratio": cfg.async_ratio}
