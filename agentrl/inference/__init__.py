"""agentrl.inference: one async interface (:class:`InferenceEngine`) over in-process vLLM (:mod:`.vllm_engine`),
K vLLM engines as Ray actors (:mod:`.replicas`, placed by :mod:`.placement`) and remote vLLM servers
(:mod:`.remote`); the last two share one router (:mod:`.router`). Weights reach engines as a state dict, or by a
trainer-side broadcast through vLLM's weight-transfer API (:mod:`.weight_transfer`). Importing this package does
not import vLLM."""

from agentrl.inference.base import FinishReason, Generation, InferenceEngine, SamplingParams
from agentrl.inference.config import WORKER_EXTENSION, EngineConfig
from agentrl.inference.factory import make_engine

__all__ = ["EngineConfig", "FinishReason", "Generation", "InferenceEngine", "SamplingParams", "WORKER_EXTENSION", "make_engine"]
