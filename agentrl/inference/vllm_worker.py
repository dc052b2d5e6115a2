"""Worker-side half of agentrl's weight sync: a vLLM worker extension (``worker_extension_cls``).

vLLM mixes this class into its worker class (CPU and GPU alike), so the engine can call these methods by name
through ``collective_rpc`` -- in process (``AsyncLLM.collective_rpc``) or on a server started with
``--worker-extension-cls agentrl.inference.vllm_worker.WeightSyncExtension`` (through the dev-mode
``POST /collective_rpc`` endpoint, which only passes strings: hence base64 and file-path variants).

This is the state-dict path (``engine.weight_sync: rpc``/``http``/``file``). The broadcast path (``nccl``/``gloo``)
goes through vLLM's weight-transfer engines instead (:mod:`agentrl.inference.weight_transfer`, registered below);
serving LoRA adapters, it receives through them into a sink, not the model
(:meth:`WeightSyncExtension.agentrl_receive_adapter`).
Why ``reload_weights`` and not ``model.load_weights``: on the CPU, vLLM repacks linear weights after loading (the
original ``weight`` tensor is removed); ``reload_weights`` restores the layers, loads, and re-runs that processing.

Payload: a safetensors-serialized state dict (HF checkpoint names, e.g. ``model.layers.0.mlp.up_proj.weight``),
complete (``reload_weights`` processes layer by layer and expects every tensor of a layer).
"""

from __future__ import annotations

import atexit
import base64
import gc
import hashlib
import logging
from typing import Any

# Registers agentrl's gloo weight-transfer backend with vLLM's factory in this (worker) process, before vLLM
# creates the worker's weight-transfer engine (engine.weight_sync: gloo).
import agentrl.inference.weight_transfer  # noqa: F401

# At exit this process skips the collector's last pass over vLLM's and torch's heap: on the CPU hosts it took ~3 s,
# past the 5 s vLLM waits before it kills its engine core (where the worker runs with executor: in_core), so every
# engine's close took 5 s. The process's memory goes back to the OS with it either way.
atexit.register(gc.freeze)


class WeightSyncExtension:
    """Methods added to vLLM's worker. ``self`` is the vLLM worker (has ``model_runner``)."""

    def agentrl_load_weights(self, payload: bytes | str) -> int:
        """Loads a safetensors-serialized state dict (raw bytes, or base64 text when sent over HTTP) into the model
        in place. Returns the number of tensors received."""
        from safetensors.torch import load as st_load

        raw = base64.b64decode(payload) if isinstance(payload, str) else bytes(payload)
        tensors = st_load(raw)
        self._agentrl_reload(tensors)
        return len(tensors)

    def agentrl_load_weights_from_file(self, path: str) -> int:
        """Like :meth:`agentrl_load_weights`, reading one ``.safetensors`` file (for servers on the same host or a
        shared file system). Returns the number of tensors loaded."""
        from safetensors.torch import load_file

        tensors = load_file(path)
        self._agentrl_reload(tensors)
        return len(tensors)

    def _agentrl_reload(self, tensors: dict[str, Any]) -> None:
        quiet_expected_reload_warnings(_ties_embeddings(self))
        self.model_runner.reload_weights(weights_iterator=list(tensors.items()), is_checkpoint_format=True)
        self._agentrl_retie_lm_head()

    def agentrl_retie_lm_head(self) -> None:
        """Public for ``collective_rpc``: after a weight-transfer engine's update (vLLM's layer-wise reload)."""
        quiet_expected_reload_warnings(_ties_embeddings(self))
        self._agentrl_retie_lm_head()

    def _agentrl_retie_lm_head(self) -> None:
        """Re-ties ``lm_head`` to the reloaded input embedding. Measured on vLLM 0.32 (CPU): after
        ``reload_weights`` a tied ``lm_head`` keeps computing logits from the old embedding (its packed GEMM
        handle, and possibly the parameter object, predate the reload), so log-probs stay wrong."""
        model: Any = self.model_runner.get_model()
        if not _ties_embeddings(self):
            return
        lm_head = getattr(model, "lm_head", None)
        embed = None
        for name, module in model.named_modules():
            if name.endswith("embed_tokens"):
                embed = module
                break
        if lm_head is None or embed is None or not hasattr(lm_head, "weight") or not hasattr(embed, "weight"):
            return
        lm_head.weight = embed.weight
        quant_method = getattr(lm_head, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(lm_head)

    def agentrl_receive_adapter(self, update_info: dict[str, Any]) -> bytes | None:
        """The broadcast path serving LoRA: receives one round of adapter tensors from the trainer over the
        weight-transfer group with the backend's own receive (nccl or gloo, packed or not), into
        :class:`_AdapterSink` instead of the model, whose base weights stay as they are. Returns the tensors as
        safetensors bytes from the engine's first worker (every worker receives them all), None from the others;
        the engine registers them as the adapter of the new version
        (:meth:`agentrl.inference.lora.AdapterSet.receive`)."""
        from safetensors.torch import save

        engine = getattr(self, "weight_transfer_engine", None)
        if engine is None:
            raise RuntimeError("no weight-transfer engine in this worker: start the engine with weight_sync nccl "
                               "or gloo")
        sink = _AdapterSink()
        engine.set_weight_update_target(sink, engine.model_config)
        try:
            engine.update_weights(update_info)
        finally:
            engine.reset_weight_update_target()
        return save(sink.tensors) if self.rank == 0 else None

    def agentrl_weights_digest(self) -> str:
        """A sha256 over the model's parameters as the worker holds them (names sorted). Changes when any weight
        changes; used by tests to check that a load reached the worker."""
        h = hashlib.sha256()
        model: Any = self.model_runner.get_model()
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def agentrl_process(self) -> dict[str, Any]:
        """How this worker process was started and bound: ``forked_from`` (the engine core's pid when it was forked
        from it, :mod:`agentrl.inference.vllm_executor`; else None), ``core_forked_from`` (the driver's pid when the
        engine core was forked from it), ``threads`` (torch's intra-op threads) and ``cpus`` (its CPU affinity).
        Used by tests."""
        import os

        import torch

        from agentrl.inference import vllm_executor

        return {"forked_from": vllm_executor.FORKED_FROM, "core_forked_from": vllm_executor.CORE_FORKED_FROM,
                "threads": torch.get_num_threads(),
                "cpus": sorted(os.sched_getaffinity(0))}


class _AdapterSink:
    """The weight-transfer engine's update target while an adapter arrives: the backend hands each received tensor
    (or a packed buffer's views of them) to ``load_weights``, which keeps a CPU copy by name."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}

    def load_weights(self, weights: Any) -> set[str]:
        for name, t in weights:
            self.tensors[name] = t.detach().to("cpu", copy=True).contiguous()
        return set(self.tensors)


def _ties_embeddings(worker: Any) -> bool:
    hf_config = worker.model_runner.model_config.hf_config
    text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
    return bool(getattr(text_config, "tie_word_embeddings", False))


class _ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's layer-wise reload warning "<Layer>: Failed to load weights" for the layers a complete HF state
    dict never holds: the rotary embedding (its cos/sin cache is derived, not stored) and, when the model ties its
    embeddings, the LM head (it has no tensor of its own; :meth:`WeightSyncExtension._agentrl_retie_lm_head` re-ties
    it after every reload). vLLM keeps those layers' previous tensors, which is right for both; the warning, twice
    per training step, only alarms users. Any other layer's warning (a real missing tensor) still shows."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = {"RotaryEmbedding"}

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and record.args[0] in self.layers)  # type: ignore[index]


_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_filter = _ExpectedReloadWarnings()


def quiet_expected_reload_warnings(tied_lm_head: bool) -> logging.Filter:
    """Installs (once per process) the filter of :class:`_ExpectedReloadWarnings` on vLLM's reload logger; returns
    it. ``tied_lm_head``: the served model ties its LM head to the input embedding."""
    if tied_lm_head:
        _filter.layers.add("ParallelLMHead")
    logger = logging.getLogger(_RELOAD_LOGGER)
    if _filter not in logger.filters:
        logger.addFilter(_filter)
    return _filter


quiet_expected_reload_warnings(tied_lm_head=False)  # the rotary embedding's, from the first reload on
