"""A simulated training run: the real controller loop (:func:`agentrl.controller.run._loop`: manager, admission,
batch schedule, streamed steps, tail batching, weight-sync points) on the virtual clock, with the cost models of
:mod:`agentrl.simulate.models` in place of the engine, the trainer and the envs.

Outputs (:func:`simulate`): the run's virtual wall time, the trainer's and the engine's busy fractions (GPU
utilisation: the share of the run a trainer step, or some request of an engine replica, was running; the engine's
is the mean over replicas), the staleness histogram of trained trajectories (oldest generated token), trained and
generated tokens, and steps per hour. ``hardware`` (:class:`~agentrl.simulate.presets.Hardware`) derives the engine's
and the trainer's costs from published figures for a named GPU and model; fields of ``engine`` and ``trainer`` set
to other than their defaults override the derived ones.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl.simulate.clock import run_virtual
from agentrl.simulate.models import ENV_RNG, LOCKSTEP, EngineModel, ResponseModel, SimEngine, SimPolicy, SimTrainer, TrainerModel
from agentrl.simulate.presets import Hardware, engine_model, trainer_fields

SIM_ENV = "sim/Env-v0"


@dataclass
class SimulationConfig:
    """``run``: :class:`~agentrl.controller.config.TrainConfig` fields (``env.id`` defaults to ``sim/Env-v0``, whose
    ``env.kwargs`` are :class:`~agentrl.simulate.models.SimEnv`'s; no warm start or evaluation is simulated);
    ``engine``, ``trainer``, ``response``: the cost models; ``hardware``: derive the engine's and the trainer's from a
    named GPU and model (module docstring)."""

    run: dict[str, Any] = field(default_factory=dict)
    hardware: Hardware | None = None
    engine: EngineModel = field(default_factory=EngineModel)
    trainer: TrainerModel = field(default_factory=TrainerModel)
    response: ResponseModel = field(default_factory=ResponseModel)


def _overlay(base: Any, given: Any) -> Any:
    """``base`` with the fields of ``given`` that differ from their defaults."""
    default = type(given)()
    changed = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)
               if getattr(given, f.name) != getattr(default, f.name)}
    return dataclasses.replace(base, **changed)


def cost_models(sim: SimulationConfig) -> tuple[EngineModel, TrainerModel]:
    """The engine's and the trainer's cost models of ``sim`` (hardware presets overlaid by explicit fields),
    validated."""
    engine, trainer = sim.engine, sim.trainer
    if sim.hardware is not None:
        sim.hardware.validate()
        engine = _overlay(engine_model(sim.hardware), engine)
        trainer = _overlay(TrainerModel(**trainer_fields(sim.hardware)), trainer)
    for part in (engine, trainer, sim.response):
        part.validate()
    return engine, trainer


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


def simulate(sim: SimulationConfig, seed: int = 0, runner: Callable[[Any], tuple[Any, float]] = run_virtual,
             ) -> dict[str, Any]:
    """Runs ``sim`` on the virtual clock; returns its figures (module docstring) and ``tasks``: the tasks each step
    trained (the controller's decisions). ``runner``: what runs the coroutine (a real event loop, for comparison)."""
    from agentrl.controller.ledger import TaskLedger
    from agentrl.controller.run import RunFiles, _loop
    from agentrl.controller.weights import WeightSync

    ENV_RNG.seed(seed)  # the envs' draws: the same seed gives the same simulation
    LOCKSTEP.reset()
    engine_m, trainer_m = cost_models(sim)
    with tempfile.TemporaryDirectory(prefix="agentrl-sim-") as d:
        cfg = train_config(sim, d)
        cfg = dataclasses.replace(cfg, trajectory_log=dataclasses.replace(cfg.trajectory_log, per_step=0))
        engine = SimEngine(engine_m)
        trainer = SimTrainer(trainer_m, engine)
        policy = SimPolicy(engine, sim.response, seed)
        end: list[float] = []

        async def main() -> dict[str, Any]:
            import asyncio

            try:
                return await _loop(cfg, RunFiles(d), trainer, engine, WeightSync(trainer, engine), policy,
                                   TaskLedger(cfg.env), 0, {}, None, None)
            finally:
                end.append(asyncio.get_running_loop().time())

        _, wall = runner(main())
        rows = [json.loads(x) for x in RunFiles(d).metrics.read_text().splitlines()]
    trained = sum(trainer.staleness.values())
    return {"wall_s": wall, "steps": cfg.steps, "steps_per_hour": 3600 * cfg.steps / wall if wall else float("inf"),
            "trainer_busy_frac": trainer.busy_s / wall if wall else 0.0,
            "engine_busy_frac": engine.busy_s(end[0]) / wall if wall else 0.0,
            "engine_mean_batch": engine.mean_batch(end[0]),
            "staleness": {int(k): v / trained for k, v in sorted(trainer.staleness.items())} if trained else {},
            "trained_tokens": trainer.tokens, "engine_requests": engine.requests,
            "engine_replicas": engine_m.replicas, "trainer_gpus": trainer_m.gpus,
            "async_ratio": cfg.async_ratio, "tasks": [r["tasks"] for r in rows]}
