"""How the trainer's weights reach the engines after an update, and what it cost.

The shortest path the engine allows, chosen once from the engine and its config:

- ``broadcast`` (``engine.weight_sync: nccl`` on GPUs, ``gloo`` on CPUs, with engine replicas as Ray actors):
  every trainer rank joins vLLM's weight-transfer group once; after each update rank 0 broadcasts straight to
  the engines' workers (:mod:`agentrl.trainer.weight_broadcast`), then the driver labels the version on every
  replica. Nothing passes through the driver or the object store.
- ``object_store`` (``rpc`` with replicas as Ray actors): the trainer puts its inference state dict into Ray's
  object store itself and the driver hands the reference to the replicas; the tensors never enter the driver.
- ``in_driver`` (one engine inside the driver, ``replicas: 1``): the engine is in this process, so the state dict
  comes here once.
- ``remote`` (vLLM servers): the driver sends the weights the way ``weight_sync`` (``http``/``file``) says.

Every sync returns the metrics row's ``weights/path``, ``weights/bytes`` (one engine's copy) and
``weights/sync_s``. With ``trainer.lora`` every path carries the adapter alone (:mod:`agentrl.inference.lora`), so
``weights/bytes`` is the adapter's size.
"""

from __future__ import annotations

import time
from typing import Any

PATH_CODES = {"in_driver": 0, "object_store": 1, "broadcast": 2, "remote": 3}


def weight_path(engine: Any) -> str:
    """The path :class:`WeightSync` takes for ``engine``."""
    from agentrl.inference.replicas import ReplicatedEngine

    if isinstance(engine, ReplicatedEngine):
        return "broadcast" if engine.cfg.broadcasts_weights() else "object_store"
    from agentrl.inference.vllm_engine import VLLMEngine

    return "in_driver" if isinstance(engine, VLLMEngine) else "remote"


class WeightSync:
    """Pushes the trainer's weights to ``engine`` (see the module docstring). Call :meth:`start` once before the
    first :meth:`push`."""

    def __init__(self, trainer: Any, engine: Any, prepared: Any = None) -> None:
        """``prepared``: the trainer's ``prepare_weight_broadcast`` call, made while the engines started."""
        self.trainer, self.engine = trainer, engine
        self.path = weight_path(engine)
        self._prepared = prepared
        self._joined = False

    async def start(self) -> None:
        if self.path != "broadcast" or self._joined:
            return
        if self._prepared is not None:
            await self._prepared
        # rank 0 hosts the transfer group's rendezvous: its node's address and a port free there now
        address, port = await self.trainer.rendezvous.remote()
        args = self.engine.trainer_init_args(address, port)  # the trainer builds vLLM's init info from them
        await self.trainer.join_weight_broadcast.remote(args, self.engine.weight_sync_client())
        self._joined = True

    async def push(self, version: int) -> dict[str, Any]:
        """Makes the trainer's current weights the engine's ``version``; returns the ``weights/*`` metrics."""
        t0 = time.perf_counter()
        if self.path == "broadcast":
            await self.start()
            sent = await self.trainer.broadcast_weights.remote()
            await self.engine.commit_weight_update(version)
            nbytes = sent["bytes"]
        elif self.path == "object_store":
            (ref,) = await self.trainer.state_dict_ref.remote()
            nbytes = await self.engine.update_weights(ref, version)
        else:
            nbytes = await self.engine.update_weights(await self.trainer.state_dict_for_inference.remote(), version)
        return {"weights/path": self.path, "weights/path_code": PATH_CODES[self.path],
                "weights/bytes": float(nbytes or 0), "weights/sync_s": time.perf_counter() - t0}

