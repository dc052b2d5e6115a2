"""agentrl.inference: one async interface (:class:`InferenceEngine`) over in-process vLLM (:mod:`.vllm_engine`)
and remote vLLM servers (:mod:`.remote`). Importing this package does not import vLLM."""

from agentrl.inference.base import FinishReason, Generation, InferenceEngine, SamplingParams
from agentrl.inference.config import WORKER_EXTENSION, EngineConfig, make_engine

__all__ = ["EngineConfig", "FinishReason", "Generation", "InferenceEngine", "SamplingParams", "WORKER_EXTENSION", "make_engine"]
