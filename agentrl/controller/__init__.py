"""The training controller: the one place where the whole loop shows.

env → manager → agent loop → engine → trainer → weights → engine: :mod:`agentrl.controller.run` routes between
those parts and owns nothing else. Its rooms:

- :mod:`~agentrl.controller.config`: the run's typed config (:class:`TrainConfig`, :func:`load_config`);
- :mod:`~agentrl.controller.batches`: where each step's batch comes from (the manager's continuous run) and how it
  reaches the trainer (whole, or streamed group by group);
- :mod:`~agentrl.controller.tail`: tail batching's short and long rounds;
- :mod:`~agentrl.controller.warmstart`: the warm start on scripted demonstrations;
- :mod:`~agentrl.controller.heldout`: which seeds evaluation, training and demonstrations play (evaluation tasks
  held out by content);
- :mod:`~agentrl.controller.ledger`: the training tasks opened, trained, dropped and replayed after a resume;
- :mod:`~agentrl.controller.runlog`: what a run writes for ``agentrl view``.
"""

from typing import Any

__all__ = ["TrainConfig", "load_config", "train"]


def __getattr__(name: str) -> Any:
    # Lazy, so that readers of a run's files (``agentrl view`` imports the runlog) do not load the whole loop.
    if name == "train":
        from agentrl.controller.run import train

        return train
    if name in ("TrainConfig", "load_config"):
        from agentrl.controller import config

        return getattr(config, name)
    raise AttributeError(f"module 'agentrl.controller' has no attribute {name!r}")
