"""Worker-side half of agentrl's weight sync: a vLLM worker extension (``worker_extension_cls``).

vLLM mixes this class into its worker class (CPU and GPU alike), so the engine can call these methods by name
through ``collective_rpc`` -- in process (``AsyncLLM.collective_rpc``) or on a server started with
``--worker-extension-cls agentrl.inference.vllm_worker.WeightSyncExtension`` (through the dev-mode
``POST /collective_rpc`` endpoint, which only passes strings: hence base64 and file-path variants).

This is the state-dict path (``engine.weight_sync: rpc``/``http``/``file``). The broadcast path (``nccl``/``gloo``)
goes through vLLM's weight-transfer engines instead (:mod:`agentrl.inference.weight_transfer`, registered below).
Why ``reload_weights`` and not ``model.load_weights``: on the CPU, vLLM repacks linear weights after loading (the
original ``weight`` tensor is removed); ``reload_weights`` restores the layers, loads, and re-runs that processing.

Payload: a safetensors-serialized state dict (HF checkpoint names, e.g. ``model.layers.0.mlp.up_proj.weight``),
complete (``reload_weights`` processes layer by layer and expects every tensor of a layer).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

# Registers agentrl's gloo weight-transfer backend with vLLM's factory in this (worker) process, before vLLM
# creates the worker's weight-transfer engine (engine.weight_sync: gloo).
import agentrl.inference.weight_transfer  # noqa: F401


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
        self.model_runner.reload_weights(weights_iterator=list(tensors.items()), is_checkpoint_format=True)
        self._agentrl_retie_lm_head()

    def agentrl_retie_lm_head(self) -> None:
        """Public for ``collective_rpc``: after a weight-transfer engine's update (vLLM's layer-wise reload)."""
        self._agentrl_retie_lm_head()

    def _agentrl_retie_lm_head(self) -> None:
        """Re-ties ``lm_head`` to the reloaded input embedding. Measured on vLLM 0.32 (CPU): after
        ``reload_weights`` a tied ``lm_head`` keeps computing logits from the old embedding (its packed GEMM
        handle, and possibly the parameter object, predate the reload), so log-probs stay wrong."""
        model: Any = self.model_runner.get_model()
        hf_config = self.model_runner.model_config.hf_config
        text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
        if not getattr(text_config, "tie_word_embeddings", False):
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

    def agentrl_weights_digest(self) -> str:
        """A sha256 over the model's parameters as the worker holds them (names sorted). Changes when any weight
        changes; used by tests to check that a load reached the worker."""
        h = hashlib.sha256()
        model: Any = self.model_runner.get_model()
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()
