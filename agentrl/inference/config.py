"""The inference backend's typed config and the factory that builds an engine from it.

YAML example (``inference:`` section of a run config)::

    backend: vllm            # or: remote
    model: tiny              # a model directory; "tiny" / "tiny-tool" = the project's tiny CPU models (built on first use)
    dtype: auto              # auto = the checkpoint's dtype (the tiny model is float32)
    max_model_len: 2048
    pause_mode: abort        # weight updates abort in-flight requests (resubmitted by the agent loop) or keep them
    replicas: 1              # K > 1: K engines as Ray actors behind one router (see agentrl.inference.replicas)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


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
    - ``weight_sync``: how new weights reach the engines. ``"auto"``: ``"rpc"`` for ``vllm``, ``"http"`` for
      ``remote``. vllm: ``"rpc"`` hands the trainer's state dict to ``update_weights`` (through Ray's object store
      to replicas, then vLLM's ``collective_rpc``); ``"nccl"`` (GPU) / ``"gloo"`` (CPU) also start vLLM's
      weight-transfer engine in every worker, so the trainer can broadcast to them
      (:mod:`agentrl.inference.weight_transfer`; ``update_weights`` keeps working too). remote: ``"http"`` sends
      weights to each server's dev-mode ``/collective_rpc`` (servers need ``VLLM_SERVER_DEV_MODE=1`` and
      ``--worker-extension-cls`` = :data:`WORKER_EXTENSION`); ``"file"`` writes one safetensors file under
      ``weight_dir`` that servers on the same host/file system read; ``"version_only"`` only sets the version
      label (weights are pushed by something else).
    - ``replicas`` (vllm only): ``1`` runs the engine in this process, unless ``weight_sync`` is ``nccl``/``gloo``
      (the trainer must reach the engine through Ray). ``K > 1`` starts K engines as Ray actors in a placement
      group, each with ``tensor_parallel_size`` GPUs on GPU hosts, behind one least-loaded, sticky-per-trajectory
      router (:mod:`agentrl.inference.replicas`).
    - Placement of replicas (Ray): ``num_cpus`` Ray CPUs per replica (placement only: vLLM's engine core is a
      child process Ray does not meter; 0.5 lets two CPU replicas share the core a 2-core host has left beside
      the trainer); ``resources``: extra custom Ray resources per replica (e.g. ``{inference_node: 1}``);
      ``label_selector``: Ray node labels a replica's node must have (e.g. ``{agentrl/role: inference}``);
      ``placement_strategy``: the placement group's strategy (``PACK`` fills a node first, ``SPREAD`` spreads
      best-effort, ``STRICT_*`` insist).
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
    executor: Literal["auto", "in_core"] = "auto"
    """Where vLLM runs the model when it uses one device (vllm only). ``"auto"``: vLLM's choice on GPU hosts; on CPU
    hosts a worker process beside the engine-core process, forked from it rather than spawned as vLLM CPU would
    (:mod:`agentrl.inference.vllm_executor`: ready as soon as ``in_core``, bound to its cores as vLLM binds it).
    ``"in_core"``: in the engine-core process on every host: one process fewer, an engine that closes ~1.5 s
    sooner, and up to ~15 % fewer tokens/s at batch 32 on the 2-core CPU machines
    (``benchmarks/bench_engine_start.py``). For tests; the sampled tokens and log-probs are the same. Either way,
    on CPU hosts the engine-core process is forked from the driver, not spawned."""
    seed: int = 0
    pause_mode: Literal["abort", "keep"] = "abort"
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    extra_engine_args: dict[str, Any] = field(default_factory=dict)
    # remote backend
    urls: list[str] = field(default_factory=list)
    api_key: str | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 2
    weight_sync: Literal["auto", "rpc", "nccl", "gloo", "http", "file", "version_only"] = "auto"
    weight_dir: str | None = None
    # engine replicas (vllm backend)
    replicas: int = 1
    num_cpus: float = 0.5
    resources: dict[str, float] = field(default_factory=dict)
    label_selector: dict[str, str] = field(default_factory=dict)
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    start_timeout_s: float = 600.0
    lora: dict[str, Any] | None = None
    """Serve LoRA adapters on the frozen base ``model`` (vllm only): the PEFT ``adapter_config.json`` contents of
    the adapters weight updates will carry (``agentrl train`` sets it from ``trainer.lora``). Updates then carry only
    the adapter (``weight_sync: rpc``: through the object store; ``nccl``/``gloo``: broadcast by the trainer to the
    engines' workers), registered with vLLM under its version (:mod:`agentrl.inference.lora`)."""
    lora_adapter: str | None = None
    """A PEFT adapter directory to serve from the start as version 0 on the base ``model``. A ``model`` that is
    itself an adapter directory (a LoRA run's ``checkpoints/*/model``) means the same on the base model its
    ``adapter_config.json`` names: so ``agentrl eval``, the gateway and rollouts take an adapter as the policy."""

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
        if self.executor == "in_core" and self.tensor_parallel_size != 1:
            raise ValueError(f"executor: 'in_core' runs one device's worker; tensor_parallel_size is "
                             f"{self.tensor_parallel_size} (use executor: auto)")
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
        sync = self.resolved_weight_sync()
        allowed = ("rpc", "nccl", "gloo") if self.backend == "vllm" else ("http", "file", "version_only")
        if sync not in allowed:
            raise ValueError(f"weight_sync: {sync!r} is not for backend {self.backend!r}; use one of {allowed}")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.backend == "remote" and self.replicas != 1:
            raise ValueError("replicas: the remote backend routes over its urls; start more servers and list them "
                             "in urls instead")
        if self.num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {self.num_cpus}")
        for k, v in self.resources.items():
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"resources.{k} must be a number >= 0, got {v!r}")
            if k in ("CPU", "GPU", "memory"):
                raise ValueError(f"resources.{k}: set CPUs with num_cpus; GPUs follow tensor_parallel_size")
        # lora with weight_sync rpc, nccl or gloo: updates carry the adapter alone on either path (inference.lora)
        if self.resolved_lora() is not None and self.backend != "vllm":
            raise ValueError("lora: the remote backend cannot serve versioned adapters exactly; use backend: vllm")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {self.start_timeout_s}")

    def adapter_path(self) -> str | None:
        """The adapter directory served from the start: ``lora_adapter``, else ``model`` when it is one."""
        from agentrl.inference.lora import is_adapter_dir

        if self.lora_adapter:
            return self.lora_adapter
        return self.model if is_adapter_dir(self.model) else None

    def resolved_lora(self) -> dict[str, Any] | None:
        """The adapter config served: ``lora``, else that of :meth:`adapter_path`, else None."""
        if self.lora is not None:
            return self.lora
        path = self.adapter_path()
        if path:
            from agentrl.inference.lora import adapter_dir_config

            return adapter_dir_config(path)
        return None

    def resolved_weight_sync(self) -> str:
        """``weight_sync`` with ``"auto"`` resolved for the backend."""
        if self.weight_sync != "auto":
            return self.weight_sync
        return "rpc" if self.backend == "vllm" else "http"

    def broadcasts_weights(self) -> bool:
        """Whether the trainer sends weights straight to the engines' workers (``nccl``/``gloo``)."""
        return self.backend == "vllm" and self.resolved_weight_sync() in ("nccl", "gloo")

    def uses_replica_actors(self) -> bool:
        """Whether the engines run as Ray actors (:class:`~agentrl.inference.replicas.ReplicatedEngine`)."""
        return self.backend == "vllm" and (self.replicas > 1 or self.broadcasts_weights())

    def resolved_model(self) -> str:
        """The model path to load: a tiny variant's name (``"tiny"``, ``"tiny-tool"``) is built (if missing) and
        replaced by its directory."""
        from agentrl.inference.lora import adapter_dir_config, is_adapter_dir
        from agentrl.models import VARIANTS, ensure_tiny_model

        if not self.lora_adapter and is_adapter_dir(self.model):
            base = adapter_dir_config(self.model).get("base_model_name_or_path")
            if not base:
                raise ValueError(f"model: {self.model} is a LoRA adapter that names no base model "
                                 "(base_model_name_or_path); set model to the base and lora_adapter to the adapter")
            return base
        if self.model in VARIANTS:
            return str(ensure_tiny_model(variant=self.model))
        return self.model

    def resolved_dtype(self, model_path: str) -> str:
        """``dtype`` with ``"auto"`` resolved to the checkpoint's own dtype (``model_path``'s ``config.json``). vLLM
        CPU's "auto" turns a float32 checkpoint into bfloat16, which would silently break the float32 logprob match
        with the trainer."""
        if self.dtype != "auto":
            return self.dtype
        import json
        from pathlib import Path

        try:
            hf = json.loads((Path(model_path) / "config.json").read_text())
        except (OSError, ValueError):
            return "auto"
        found = hf.get("dtype") or hf.get("torch_dtype") or (hf.get("text_config") or {}).get("dtype")
        return found if found in ("float32", "bfloat16", "float16") else "auto"
