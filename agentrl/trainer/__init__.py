"""agentrl.trainer: policy losses, group advantages, the ``Trainer`` and its Ray actor.

Names resolve lazily so that importing the configs does not import torch, transformers or ray.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "TrainerConfig": "agentrl.trainer.config",
    "OptimizerConfig": "agentrl.trainer.config",
    "LossConfig": "agentrl.trainer.config",
    "AdvantageConfig": "agentrl.trainer.config",
    "compute_advantages": "agentrl.trainer.advantages",
    "group_advantages": "agentrl.trainer.advantages",
    "filter_groups": "agentrl.trainer.dynamic_sampling",
    "policy_loss": "agentrl.trainer.losses",
    "Trainer": "agentrl.trainer.trainer",
    "find_latest_checkpoint": "agentrl.trainer.checkpoint",
    "TrainerWorker": "agentrl.trainer.actor",
    "TrainerActor": "agentrl.trainer.actor",
    "create_trainer_actor": "agentrl.trainer.actor",
    "TrainerGroup": "agentrl.trainer.dp_group",
    "TrainerRankError": "agentrl.trainer.dp_group",
    "create_trainer": "agentrl.trainer.dp_group",
    "stop_trainer": "agentrl.trainer.dp_group",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agentrl.trainer' has no attribute {name!r}")
