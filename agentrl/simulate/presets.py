"""Cost parameters for named GPUs and models, derived from published figures (each one's source beside it).

The engine's decode step is memory-bound at small batches: it reads the weights once per step. Two published vLLM
measurements of Llama-3.1-8B (bf16, 16.06 GB of weights) at one request fix how close vLLM gets to the HBM
bandwidth:

- H100-80GB (HBM3, 3.35 TB/s): TPOT p50 6.48 ms at concurrency 1 (vLLM 0.21.0, ``bench run
  llm.inference.chatbot-short``; https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/). Ideal
  16.06 GB / 3.35 TB/s = 4.79 ms: 74 % of the bandwidth.
- A100-40GB (1.555 TB/s): about 75 tokens/s at concurrency 1, "roughly 77 % of the memory-bandwidth ceiling"
  (vLLM 0.23.0, 1024 in / 128 out; https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on).
- Cross-check: vLLM's nightly benchmark, H200 (4.8 TB/s), latency_llama8B_tp1, batch 8, 32 in / 128 out: 833 ms,
  i.e. 6.5 ms a step (https://buildkite.com/vllm/performance-benchmark/builds/9515); the model below gives 4.5 ms
  + 8 x 0.029 ms + prefill, so it is optimistic on the fastest memory (a fixed per-step CPU cost it omits).

So ``decode_step_s = weight bytes / (bandwidth x 0.75)``. Measured on an H200 here (``benchmarks/bench_decode_gpu.py``,
plain PyTorch under CUDA graphs, BENCHMARKS.md): the step's matmuls read Llama-3.1-8B's weights at 4.0 TB/s (0.84 of
the datasheet), but the rest of a small-batch step (norms, rotary, cache writes, attention) costs a fixed ~60-70 us
per layer, so at batch 1-8 this model gives 0.67-0.75 of the measured step (0.26-0.43 at 1.5B); ``Hardware.layer_s``
adds such a per-layer term (default 0). The per-sequence cost is the batch's compute: fitted to
Llama-3.1-8B's peak vLLM output throughput on one H100, ~12,500 tokens/s (FlashInfer, max_num_seqs 256;
https://www.morphllm.com/vllm-benchmarks): at 256 sequences a step is 20.5 ms, of which 6.5 ms weights and ~6.7 ms
KV reads (ShareGPT contexts, ~500 tokens), leaving 7.3 ms / 256 = 29 us a sequence = 2 x 8e9 FLOPs / (989 TFLOP/s x
0.56); so ``decode_step_s_per_seq = 2 x params / (peak x 0.56)``. The KV-cache read per 1000 context tokens is
``2 (K, V) x layers x kv_heads x head_dim x 2 bytes x 1000 / (bandwidth x 0.75)`` (the models' config.json).

Assumptions (not measured figures; change them in the config): prefill runs at 50 % MFU
(``prefill_s_per_token = 2 x params / (peak x 0.5)``); tensor parallelism over ``tp`` GPUs divides the step costs by
``tp`` at 80 % efficiency (Lambda's vLLM report: data parallelism beats tensor parallelism when the model fits one
GPU; https://github.com/LambdaLabsML/vllm-benchmark); a weight sync moves the bf16 weights at 25 GB/s (half of a
400 Gb/s InfiniBand link) plus 1 s to pause, load and resume; the trainer's ``flops_per_token`` is 8 x params (6 for
forward and backward, 2 for the proximal policy's recompute) at MFU 0.3 (prime-rl reports 26.8 % for RL on one H100).
agentrl's own trainer, measured on one H200 (BENCHMARKS.md; 6 x params count), reaches 29-30 % at 3B with
``compile_layers`` and checkpointing every second layer (21-23 % without), 25 % at 1.5B, 7-8 % at 0.5B.

GPU figures are the vendors' datasheets (dense bf16 tensor FLOP/s, HBM bandwidth): H800 has the H100's compute
and memory (its NVLink is 400 GB/s, not 900). Model figures are the Hugging Face configs.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.simulate.engine import EngineModel

# name: (dense bf16 FLOP/s, HBM bytes/s)
GPUS: dict[str, tuple[float, float]] = {
    "H100": (989e12, 3.35e12),
    "H800": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
    "H20": (148e12, 4.0e12),
    "A100-80GB": (312e12, 2.039e12),
    "A100-40GB": (312e12, 1.555e12),
}

# name: (parameters, layers, KV heads, head dim)
MODELS: dict[str, tuple[float, int, int, int]] = {
    "Qwen2.5-1.5B": (1.54e9, 28, 2, 128),
    "Qwen2.5-3B": (3.09e9, 36, 2, 128),
    "Qwen2.5-7B": (7.62e9, 28, 4, 128),
    "Qwen2.5-14B": (14.7e9, 48, 8, 128),
    "Qwen2.5-32B": (32.8e9, 64, 8, 128),
    "Qwen3-8B": (8.19e9, 36, 8, 128),
    "Llama-3.1-8B": (8.03e9, 32, 8, 128),
}

BANDWIDTH_EFF = 0.75   # vLLM decode at batch 1 vs the HBM roofline (two measurements above: 74 %, 77 %)
DECODE_MFU = 0.56      # per-sequence compute, fitted to 12,500 tokens/s for Llama-3.1-8B on one H100
PREFILL_MFU = 0.5      # assumption
TP_EFF = 0.8           # assumption
SYNC_BYTES_S = 25e9    # assumption: half of a 400 Gb/s link
SYNC_FIXED_S = 1.0     # assumption


@dataclass
class Hardware:
    """A cluster: ``gpus`` of kind ``gpu`` serving and training ``model``. ``trainer_gpus`` = 0 co-locates the
    trainer and the engine on all ``gpus`` (they take turns: the engine is paused while a step trains, as in
    synchronous colocated training); otherwise the trainer gets ``trainer_gpus`` and the engine the rest, as
    ``(gpus - trainer_gpus) / tp`` replicas. ``mfu``: the trainer's."""

    gpu: str = "H100"
    model: str = "Qwen2.5-7B"
    gpus: int = 8
    trainer_gpus: int = 0
    tp: int = 1
    mfu: float = 0.3
    layer_s: float = 0.0
    """Fixed seconds per layer per decode step, on top of the weight read: the norms, rotary embedding, cache
    writes and small kernels that do not shrink with bandwidth. 0 keeps the published-figure calibration (which
    folds them into ``BANDWIDTH_EFF``); ~6e-5 is the floor measured on an H200 (module docstring)."""

    def validate(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"hardware.gpu must be one of {', '.join(GPUS)}, got {self.gpu!r}")
        if self.model not in MODELS:
            raise ValueError(f"hardware.model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.tp < 1 or self.gpus < 1 or not 0 <= self.trainer_gpus < self.gpus:
            raise ValueError(f"hardware: need gpus >= 1, tp >= 1 and 0 <= trainer_gpus < gpus, got gpus={self.gpus} "
                             f"tp={self.tp} trainer_gpus={self.trainer_gpus}")
        if (self.gpus - self.trainer_gpus) % self.tp:
            raise ValueError(f"hardware: the engine's {self.gpus - self.trainer_gpus} GPUs are not a multiple of "
                             f"tp={self.tp}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"hardware.mfu must be in (0, 1], got {self.mfu}")
        if not 0 <= self.layer_s < 1:
            raise ValueError(f"hardware.layer_s must be in [0, 1) seconds, got {self.layer_s}")


def engine_model(hw: Hardware) -> EngineModel:
    """The engine's costs for ``hw`` (module docstring)."""
    peak, bw = GPUS[hw.gpu]
    params, layers, kv_heads, head_dim = MODELS[hw.model]
    scale = 1.0 if hw.tp == 1 else 1.0 / (hw.tp * TP_EFF)
    weight_bytes = 2 * params
    kv_bytes_per_token = 2 * layers * kv_heads * head_dim * 2
    return EngineModel(
        replicas=(hw.gpus - hw.trainer_gpus) // hw.tp,
        prefill_s_per_token=2 * params / (peak * PREFILL_MFU) * scale,
        decode_step_s=(weight_bytes / (bw * BANDWIDTH_EFF) + layers * hw.layer_s) * scale,
        decode_step_s_per_seq=2 * params / (peak * DECODE_MFU) * scale,
        decode_step_s_per_ktoken=kv_bytes_per_token * 1000 / (bw * BANDWIDTH_EFF) * scale,
        sync_s=SYNC_FIXED_S + weight_bytes / SYNC_BYTES_S,
    )


def trainer_fields(hw: Hardware) -> dict[str, float | int | bool]:
    """The trainer's costs for ``hw``: :class:`~agentrl.simulate.models.TrainerModel` fields."""
    params = MODELS[hw.model][0]
    return {"flops_per_token": 8 * params, "peak_flops": GPUS[hw.gpu][0], "mfu": hw.mfu,
            "gpus": hw.trainer_gpus or hw.gpus, "exclusive": hw.trainer_gpus == 0}
