"""Simulation: the real controller, manager and schedulers on a virtual clock (:mod:`agentrl.simulate.clock`).

So far the clock: an asyncio event loop whose time jumps to the next timer when nothing is ready, so code that
sleeps (cost models of engines, trainers and envs) runs in no wall time while every ``loop.time()``,
``asyncio.sleep``, timeout and deadline behaves as on a real clock. The controller's loop runs on it unchanged
(``tests/simulate``: its timeline equals the one computed by hand). Still to come: the engine, trainer and env cost
models calibrated from published figures, and ``agentrl simulate``.
"""

from agentrl.simulate.clock import VirtualTimeLoop, run_virtual

__all__ = ["VirtualTimeLoop", "run_virtual"]
