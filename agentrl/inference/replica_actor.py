"""The engine replica's side of :mod:`agentrl.inference.replicas`: the Ray actor that owns one
:class:`~agentrl.inference.vllm_engine.VLLMEngine` and answers the driver's router with plain data.

Everything here runs inside the actor's process; the routing, the update fan-out and the retirement of dead
replicas are the driver's (:class:`~agentrl.inference.replicas.ReplicatedEngine`). A request here belongs to one
engine, so its tokens carry this replica's weight versions. An actor whose engine died (its engine-core process
killed) exits, so that the driver sees a dead replica and retires it, as it does an actor killed outright.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import ray

from agentrl.inference.base import Generation, SamplingParams
from agentrl.inference.config import EngineConfig


class EngineReplica:
    """One engine in a Ray actor (``ray.remote(EngineReplica)``). Methods return plain data."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.engine: Any = None
        self._payload: bytes | None = None

    def node_info(self) -> dict[str, Any]:
        """This actor's node id and the CPU cores it may use (to split cores between replicas on one node)."""
        return {"node_id": ray.get_runtime_context().get_node_id(), "cores": sorted(os.sched_getaffinity(0)),
                "pid": os.getpid()}

    async def start(self, cfg: EngineConfig, env: dict[str, str]) -> float:
        """Starts the engine (with ``env`` set first: thread binding); returns its start time in seconds."""
        from agentrl.inference.vllm_engine import VLLMEngine

        os.environ.update(env)
        self.engine = await VLLMEngine.create(dataclasses.replace(cfg, replicas=1))
        return self.engine.start_time_s

    async def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> Generation:
        try:
            return await self.engine.generate(prompt_ids, params, request_id=request_id)
        except Exception:
            self._exit_if_dead()
            raise

    def _exit_if_dead(self) -> None:
        """Ends this actor once its engine can generate no more: every call of the driver's then fails as a dead
        actor (``RayActorError``), which retires the replica; the engine's error alone would fail every request
        routed here, forever."""
        if self.engine is not None and self.engine.dead():
            ray.actor.exit_actor()

    async def generate_stream(self, prompt_ids: list[int], params: SamplingParams, request_id: str):
        """:meth:`generate` as a Ray streaming generator: each output step's new ids (a list), then the
        :class:`Generation`. A consumer that goes away aborts the request."""
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self.engine.generate_streaming(prompt_ids, params, request_id=request_id,
                                                                    on_tokens=queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (ids := await queue.get()) is not None:
                yield ids
            if not task.cancelled() and task.exception() is not None:
                self._exit_if_dead()
            yield task.result()
        finally:
            if not task.done():
                await self.engine.abort(request_id)
                await asyncio.gather(task, return_exceptions=True)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def version(self) -> int:
        return self.engine.version

    # state-dict path
    async def prepare(self, state_dict: dict[str, Any]) -> int:
        """Checks and packs ``state_dict`` for :meth:`load_prepared`; raises ValueError before anything pauses."""
        self._payload = await asyncio.to_thread(self.engine.prepare_weights, state_dict)
        return len(self._payload)

    async def pause(self, mode: str) -> None:
        await self.engine.pause(mode)

    async def load_prepared(self) -> None:
        payload, self._payload = self._payload, None
        if payload is None:
            raise RuntimeError("load_prepared without prepare")
        await self.engine.load_prepared(payload)

    async def commit(self, version: int) -> None:
        await self.engine.commit(version)

    # broadcast path (vLLM weight-transfer engines)
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        await self.engine.init_weight_transfer(init_info)

    async def start_weight_update(self, mode: str) -> None:
        await self.engine.start_weight_update(mode)

    async def receive_weights(self, update_info: dict[str, Any]) -> None:
        await self.engine.receive_weights(update_info)

    async def finish_weight_update(self) -> None:
        await self.engine.finish_weight_update()

    def check_update(self, update_info: dict[str, Any]) -> None:
        """Raises ValueError unless ``update_info`` names exactly the served checkpoint's tensors, shapes equal, or,
        serving LoRA, an adapter that fits the served one (:meth:`agentrl.inference.lora.AdapterSet.check`)."""
        from agentrl.inference.weights import check_shapes, checkpoint_schema, tied_embeddings

        got = {n: tuple(s) for n, s in zip(update_info["names"], update_info["shapes"])}
        if self.engine.adapter_set is not None:
            self.engine.adapter_set.check(got)
            return
        schema = checkpoint_schema(self.engine.model_path)
        if schema is None:
            return
        if tied_embeddings(self.engine.model_path) and "lm_head.weight" not in schema:
            got.pop("lm_head.weight", None)
        check_shapes(got, schema)

    # extras
    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        return await self.engine.prompt_logprobs(token_ids)

    async def weights_digest(self) -> str:
        return await self.engine.weights_digest()

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
