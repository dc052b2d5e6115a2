"""Building an engine from its config: the one place that knows every backend class (the config module stays a
plain description, importable by the backends themselves)."""

from __future__ import annotations

from agentrl.inference.base import InferenceEngine
from agentrl.inference.config import EngineConfig


def make_engine(cfg: EngineConfig) -> InferenceEngine:
    """Builds the backend ``cfg.backend`` names. vLLM engines start here (tens of seconds on the CPU); call
    ``await engine.close()`` when done. Raises ``ValueError`` for an invalid config, and
    :class:`~agentrl.inference.placement.ResourceError` when Ray cannot host ``replicas`` (before any model
    loads)."""
    cfg.validate()
    if cfg.uses_replica_actors():
        from agentrl.inference.replicas import ReplicatedEngine

        return ReplicatedEngine(cfg)
    if cfg.backend == "vllm":
        from agentrl.inference.vllm_engine import VLLMEngine

        return VLLMEngine(cfg)
    from agentrl.inference.remote import RemoteEngine

    return RemoteEngine.from_config(cfg)
