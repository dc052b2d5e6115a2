"""The trainer's per-token log-prob records, for the viewer: what the trainer computed for a trajectory's tokens at
training time, next to what the engine reported when it sampled them.

With ``TrainerConfig.record_logprobs = n > 0``, every :meth:`Trainer.train_step` records the first ``n``
trajectories of its batch (batch order puts whole groups first) before the update, with the weights the step
trains from. :meth:`Trainer.take_logprob_records` returns and clears them::

    {"trajectory_id": str, "version": int, "logprobs": list[float]}   # logprobs[t]: log p(token_ids[t + 1] | ...)

one log-prob per token position ``1 .. n-1`` (temperature applied, as in the loss). At most :data:`MAX_PENDING`
records are kept between two takes (the oldest go first), so a caller that never takes them leaks nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

MAX_PENDING = 4096


def capture(trainer: Any, trajectories: Sequence[Any]) -> None:
    """Records the first ``trainer.config.record_logprobs`` trajectories of a batch (those with at least 2 tokens,
    all inside the vocabulary; the others are the trainer's to reject)."""
    n = trainer.config.record_logprobs
    if n <= 0:
        return
    picked = [t for t in trajectories
              if len(t.token_ids) >= 2 and all(0 <= x < trainer.vocab_size for x in t.token_ids)][:n]
    if not picked:
        return
    logp = trainer.compute_logprobs(picked)
    pending = trainer.__dict__.setdefault("_logprob_records", deque(maxlen=MAX_PENDING))
    for i, t in enumerate(picked):
        pending.append({"trajectory_id": t.id, "version": trainer.version,
                        "logprobs": logp[i, : len(t.token_ids) - 1].tolist()})


def take(trainer: Any) -> list[dict[str, Any]]:
    """Returns the pending records (oldest first) and clears them."""
    pending = trainer.__dict__.get("_logprob_records")
    if not pending:
        return []
    out = list(pending)
    pending.clear()
    return out
