"""The trainer's half of the broadcast weight path (``engine.weight_sync: nccl`` on GPUs, ``gloo`` on CPUs).

Every trainer rank joins vLLM's weight-transfer group once (a :class:`WeightSender`, with the init arguments and
the control-plane client the driver got from the engine); after each update every rank calls :meth:`WeightSender.send`
(rank 0 broadcasts, the others only take part in the gathers a sharded model needs). The driver then labels the
new version on the engines (``ReplicatedEngine.commit_weight_update``). The weights never pass through the driver
or the object store. The engine half and the protocol are :mod:`agentrl.inference.weight_transfer`.

What is sent is exactly what the object-store path sends (:meth:`Trainer.state_dict_for_inference`: HF names,
the engine's dtype; with ``trainer.lora`` the adapter alone, under PEFT's names), so both paths load the same
tensors, and a LoRA sync moves the adapter's bytes, not the model's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch


def _source_class() -> type:
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class TrainerWeights(WeightSource):
        """The trainer's inference state dict as a vLLM ``WeightSource``. Its metadata is read once (names, dtypes
        and shapes never change during a run); each pass materializes the tensors anew."""

        def __init__(self, trainer: Any) -> None:
            self.trainer = trainer
            first = trainer.state_dict_for_inference()  # a collective under FSDP: every rank is here together
            self._meta = [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in first.items()]

        def metadata(self) -> list[Any]:
            return list(self._meta)

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            yield from self.trainer.state_dict_for_inference().items()

    return TrainerWeights


class WeightSender:
    """One trainer rank's sender. ``rank`` 0 drives the engines; the protocol is vLLM's (see module docstring)."""

    def __init__(self, trainer: Any, init_args: dict[str, Any], client: Any, rank: int) -> None:
        """``init_args``: the engine's ``trainer_init_args`` (a plain dict, so that the driver that passes them on
        never imports vLLM's weight-transfer modules); vLLM's init info is made of them here."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        from agentrl.inference.weight_transfer import trainer_init_info  # also registers the gloo backend here

        self.rank = rank
        self.source = _source_class()(trainer)
        # Rank 0 blocks here until every engine worker has joined the group.
        self.engine = WeightTransferTrainerFactory.trainer_init(trainer_init_info(**dict(init_args, rank=rank)),
                                                                client=client, source=self.source)

    def send(self) -> dict[str, float]:
        """Broadcasts the current weights; returns ``{"bytes", "seconds"}`` (bytes of one copy, as sent)."""
        t0 = time.perf_counter()
        self.engine.send_weights()
        nbytes = sum(int(torch.Size(m.shape).numel()) * torch.empty((), dtype=m.dtype).element_size()
                     for m in self.source.metadata())
        return {"bytes": float(nbytes), "seconds": time.perf_counter() - t0}
