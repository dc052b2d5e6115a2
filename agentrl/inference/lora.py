"""Versioned LoRA adapters on one vLLM engine (``EngineConfig.lora`` / ``lora_adapter``): the engine serves a frozen
base model and, for policy version ``v``, the trainer's adapter named ``v<v>`` (vLLM LoRA id ``v + 1``) through
vLLM's own LoRA support. A weight update carries only the adapter's tensors.

Flow: :meth:`AdapterSet.prepare` checks an adapter state dict (PEFT file names ``...lora_A.weight`` /
``...lora_B.weight``, 2-D tensors, the same names and shapes at every update) and packs it as safetensors bytes;
:meth:`AdapterSet.add` writes it with its ``adapter_config.json`` into a directory of its own and registers it
with vLLM (``add_lora``); :meth:`AdapterSet.commit` makes it the version new requests get. Version 0 without an
adapter is the bare base model (a fresh PEFT adapter has ``B = 0``: the same function).

The two weight paths differ only in how the tensors arrive. ``rpc``: the state dict comes to :meth:`AdapterSet.prepare`
through the object store (or in process). Broadcast (``weight_sync: nccl|gloo``): the trainer announces names and
shapes (:meth:`AdapterSet.check`, before anything pauses) and broadcasts the adapter tensors alone over vLLM's
weight-transfer group to the engine's workers, which hand them back (:meth:`AdapterSet.receive`); from there both
paths prepare, stage and register the adapter the same way, so versions, pause modes and unloading are the same.

Invariants:

- A request is bound to the adapter of the version current when it was submitted, for its whole life (vLLM keeps
  a request's ``lora_request``), so every token it generates carries that version exactly, whatever the pause mode:
  ``abort`` ends it at the update (the agent loop resubmits the rest with the new adapter), ``keep`` lets it finish
  with its own adapter. KV blocks are keyed by adapter in vLLM's prefix cache, so no KV of another adapter serves it.
- An adapter is unloaded (``remove_lora``, directory deleted) only when it is older than the current version and
  no request holds it (:meth:`AdapterSet.acquire` / :meth:`AdapterSet.release` count holders); the release of the last
  holder unloads it.
- All methods but :meth:`check` and :meth:`prepare` run on the engine's event loop, one at a time with the engine's
  update lock.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl import proctemp

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# vLLM's allowed values of max_lora_rank (vllm.config.lora.MaxLoRARanks)
_VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def is_adapter_dir(path: str) -> bool:
    """True when ``path`` is a local PEFT adapter directory."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and (p / ADAPTER_WEIGHTS).is_file()


def adapter_dir_config(path: str) -> dict[str, Any]:
    """``adapter_config.json`` of an adapter directory. Raises ``ValueError`` naming the path when it is not one."""
    p = Path(path)
    if not (p / ADAPTER_CONFIG).is_file() or not (p / ADAPTER_WEIGHTS).is_file():
        raise ValueError(f"{path}: not a LoRA adapter directory ({ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} needed)")
    return json.loads((p / ADAPTER_CONFIG).read_text())


def vllm_max_rank(config: dict[str, Any]) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that serves an adapter of ``config["r"]``."""
    r = int(config.get("r", 0))
    for allowed in _VLLM_RANKS:
        if allowed >= r:
            return allowed
    raise ValueError(f"lora rank {r} is above vLLM's largest max_lora_rank {_VLLM_RANKS[-1]}")


class AdapterSet:
    """The adapters one engine serves, by policy version (see the module docstring)."""

    def __init__(self, llm: Any, config: dict[str, Any], dtype: Any) -> None:
        self.llm, self.config, self.dtype = llm, dict(config), dtype
        self.root = Path(proctemp.make("agentrl-lora-", directory=True))  # swept if the process is killed
        self.current = 0
        self._requests: dict[int, Any] = {}  # version -> vllm LoRARequest (absent: the bare base model)
        self._holders: Counter[int] = Counter()
        self._schema: dict[str, tuple[int, ...]] | None = None
        self._staged: bytes | None = None

    # ---- checks (any thread) ------------------------------------------------------------------------------
    def check(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Raises ``ValueError`` naming every bad entry unless ``shapes`` (tensor name -> shape) is an adapter this
        engine serves: LoRA ``A``/``B`` matrices under PEFT's file names, of the configured rank, and the same names
        and shapes at every update. Both paths call it before anything pauses (the broadcast path with the names
        and shapes the trainer announces, :meth:`prepare` with the tensors)."""
        if not shapes:
            raise ValueError("the adapter state dict is empty")
        # a per-module rank_pattern (an adapter directory given by the user) has no one rank to check against
        rank, problems = (0 if self.config.get("rank_pattern") else int(self.config.get("r", 0))), []
        for name, shape in shapes.items():
            if not (name.endswith(".lora_A.weight") or name.endswith(".lora_B.weight")) or len(shape) != 2:
                problems.append(f"{name}: not a LoRA A/B matrix (a full state dict sent to a LoRA engine?)")
            elif rank and shape[0 if name.endswith(".lora_A.weight") else 1] != rank:
                problems.append(f"{name}: shape {tuple(shape)} is not of the served rank r={rank}")
        shapes = {n: tuple(s) for n, s in shapes.items()}
        if self._schema is not None and not problems and shapes != self._schema:
            problems.append(f"names or shapes differ from the first adapter served: "
                            f"{sorted(set(shapes) ^ set(self._schema))[:4] or 'shapes'}")
        if problems:
            raise ValueError("adapter does not fit the served LoRA config: " + "; ".join(problems[:5]))
        self._schema = shapes

    def prepare(self, state_dict: dict[str, Any]) -> bytes:
        """Checks ``state_dict`` (adapter tensors under PEFT's file names, :meth:`check`) and returns it as
        safetensors bytes in the engine's dtype. Raises ``ValueError``/``TypeError`` naming every bad entry."""
        import torch
        from safetensors.torch import save

        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"state_dict[{name!r}] is a {type(t).__name__}, expected a torch.Tensor")
        self.check({n: tuple(t.shape) for n, t in state_dict.items()})
        return save({n: t.detach().to(self.dtype).cpu().contiguous() for n, t in state_dict.items()})

    # ---- on the engine loop --------------------------------------------------------------------------------
    async def add(self, payload: bytes, version: int) -> None:
        """Registers the adapter ``payload`` (from :meth:`prepare`) as ``version``; not yet current. Replaces an
        unused adapter of the same version; raises ``ValueError`` when that one is in use."""
        d = self.root / f"v{version}"
        if version in self._requests:
            if self._holders[version]:
                raise ValueError(f"version {version}: an adapter with this version is in use; versions must increase")
            await self._unload(version)
        d.mkdir(parents=True)
        (d / ADAPTER_WEIGHTS).write_bytes(payload)
        (d / ADAPTER_CONFIG).write_text(json.dumps(self.config))
        await self.register(version, str(d))

    async def register(self, version: int, path: str) -> None:
        """Registers the adapter directory ``path`` (left in place) as ``version`` with vLLM."""
        from vllm.lora.request import LoRARequest

        req = LoRARequest(lora_name=f"v{version}", lora_int_id=version + 1, lora_path=path)
        if not await self.llm.add_lora(req):
            raise RuntimeError(f"vLLM refused the adapter of version {version} ({path})")
        self._requests[version] = req

    def stage(self, payload: bytes) -> None:
        """Keeps a prepared adapter for :meth:`commit` (the phased update knows the version only at commit)."""
        self._staged = payload

    async def receive(self, update_info: dict[str, Any]) -> int:
        """The broadcast path (``weight_sync: nccl|gloo``): the engine's workers take one round of adapter tensors
        from the trainer over the weight-transfer group, through the backend's own receive
        (:meth:`~agentrl.inference.vllm_worker.WeightSyncExtension.agentrl_receive_adapter`), and the first worker
        hands them back; from here they are checked and staged as an rpc update's are (:meth:`prepare`,
        :meth:`stage`), and :meth:`commit` registers them. Returns the bytes staged."""
        from safetensors.torch import load

        replies = await self.llm.collective_rpc("agentrl_receive_adapter", args=(update_info,))
        raw = next((r for r in replies if r is not None), None)
        if raw is None:
            raise RuntimeError("no engine worker returned the broadcast adapter")
        payload = await asyncio.to_thread(lambda: self.prepare(load(bytes(raw))))
        self.stage(payload)
        return len(payload)

    async def commit(self, version: int) -> None:
        """Makes ``version`` current (adding the staged adapter first, if any) and unloads adapters nobody holds."""
        staged, self._staged = self._staged, None
        if staged is not None:
            await self.add(staged, version)
        self.current = version
        await self._collect()

    def acquire(self) -> tuple[int, Any]:
        """The current version and its ``LoRARequest`` (None: the base model) for a new request; the caller must
        :meth:`release` the version when the request ends."""
        v = self.current
        self._holders[v] += 1
        return v, self._requests.get(v)

    async def release(self, version: int) -> None:
        self._holders[version] -= 1
        if self._holders[version] <= 0:
            del self._holders[version]
            await self._collect()

    def holders(self) -> dict[int, int]:
        """Version -> requests holding its adapter now."""
        return {v: n for v, n in self._holders.items() if n > 0}

    def loaded(self) -> list[int]:
        """The versions whose adapters are registered with vLLM, ascending."""
        return sorted(self._requests)

    async def _collect(self) -> None:
        # Only versions older than the current one: an adapter added for an update that has not committed yet is
        # newer, and a request released during that update's abort-mode pause must not unload it.
        for v in list(self._requests):
            if v < self.current and not self._holders.get(v):
                await self._unload(v)

    async def _unload(self, version: int) -> None:
        req = self._requests.pop(version, None)
        if req is None:  # a concurrent release got there first
            return
        await self.llm.remove_lora(req.lora_int_id)
        if Path(req.lora_path).parent == self.root:  # ours; an adapter directory given by the user stays
            shutil.rmtree(req.lora_path, ignore_errors=True)

    def close(self) -> None:
        """Removes the adapters written here and lets go of the engine (see :meth:`VLLMEngine.close`)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.llm = None
