"""The inference backend's typed config and the factory that builds an engine from it.

YAML example (``inference:`` section of a run config)::

    backend: vllm            # or: remote
    model: tiny              # a model directory; "tiny" / "tiny-tool" = the project's tiny CPU models (built on first use)
    dtype: auto              # auto = the checkpoint's dtype (the tiny model is float32)
    max_model_len: 2048
    pause_mode: abort        # weight updates abort in-flight requests (resubmitted by the agent loop) or keep them
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.inference.base import InferenceEngine

WORKER_EXTENSION = "agentrl.inference.vllm_worker.WeightSyncExtension"


@dataclass
class EngineConfig:
    """How to generate. Fields used by one backend only say so.

    - ``backend``: ``"vllm"`` runs vLLM's ``AsyncLLM`` in this process (its engine core in a child process);
      ``"remote"`` talks to OpenAI-compatible vLLM servers at ``urls``.
    - ``model``: model directory (or hub name on hosts that can reach a hub); ``"tiny"`` means the project's tiny
      model, built into ``$AGENTRL_TINY_MODEL`` or ``~/.cache/agentrl/tiny-model`` if missing, and ``"tiny-tool"`` the
      tool-use demo's variant (``~/.cache/agentrl/tiny-tool-model``; ``agentrl.models.VARIANTS``). For ``remote``, the
      name the servers serve (``--served-model-name``; defaults to the path they were started with).
    - ``kv_cache_space_gib``: vLLM CPU only (``VLLM_CPU_KVCACHE_SPACE``); ``gpu_memory_utilization`` is also what
      the CPU backend checks against NUMA node 0's memory, hence 0.5 rather than vLLM's 0.9.
    - ``pause_mode``: what a weight update does to in-flight requests. ``"abort"``: they return their tokens so
      far with ``finish_reason="abort"``; ``"keep"``: they are frozen and continue with the new weights.
    - ``logprobs_mode``: which log-probabilities come back with sampled tokens. ``"processed_logprobs"`` (default):
      of the distribution actually sampled from (after temperature and top-k/top-p), i.e. the behavior policy mu;
      ``"raw_logprobs"``: of the model's unscaled logits. They agree when temperature = 1 and top_p = 1, top_k off.
    - ``weight_sync`` (remote only): ``"http"`` sends weights to each server's dev-mode ``/collective_rpc``
      (servers need ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls`` = :data:`WORKER_EXTENSION`);
      ``"file"`` writes one safetensors file under ``weight_dir`` that servers on the same host/file system read;
      ``"version_only"`` only sets the version label (weights are pushed by something else, e.g. NCCL).
    """

    backend: Literal["vllm", "remote"] = "vllm"
    model: str = "tiny"
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int = 2048
    kv_cache_space_gib: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    max_num_seqs: int | None = None
    tensor_parallel_size: int = 1
    seed: int = 0
    pause_mode: Literal["abort", "keep"] = "abort"
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    extra_engine_args: dict[str, Any] = field(default_factory=dict)
    # remote backend
    urls: list[str] = field(default_factory=list)
    api_key: str | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 2
    weight_sync: Literal["http", "file", "version_only"] = "http"
    weight_dir: str | None = None

    def validate(self) -> None:
        if not self.model:
            raise ValueError("model must name a model directory (or 'tiny')")
        if self.max_model_len < 16:
            raise ValueError(f"max_model_len must be >= 16, got {self.max_model_len}")
        if self.kv_cache_space_gib <= 0:
            raise ValueError(f"kv_cache_space_gib must be a positive integer (GiB), got {self.kv_cache_space_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.backend == "remote":
            if not self.urls:
                raise ValueError("urls: the remote backend needs at least one server URL (e.g. http://127.0.0.1:8000)")
            for u in self.urls:
                if not u.startswith(("http://", "https://")):
                    raise ValueError(f"urls: {u!r} must start with http:// or https://")
            if self.weight_sync == "file" and not self.weight_dir:
                raise ValueError("weight_dir: weight_sync='file' needs a directory the servers can read")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")

    def resolved_model(self) -> str:
        """The model path to load: a tiny variant's name (``"tiny"``, ``"tiny-tool"``) is built (if missing) and
        replaced by its directory."""
        from agentrl.models import VARIANTS, ensure_tiny_model

        if self.model in VARIANTS:
            return str(ensure_tiny_model(variant=self.model))
        return self.model


def make_engine(cfg: EngineConfig) -> InferenceEngine:
    """Builds the backend ``cfg.backend`` names. The vLLM engine starts here (tens of seconds on the CPU); call
    ``await engine.close()`` when done. Raises ``ValueError`` for an invalid config."""
    cfg.validate()
    if cfg.backend == "vllm":
        from agentrl.inference.vllm_engine import VLLMEngine

        return VLLMEngine(cfg)
    from agentrl.inference.remote import RemoteEngine

    return RemoteEngine.from_config(cfg)
