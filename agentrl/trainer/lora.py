"""LoRA on the trainer's side (``trainer.lora``): the PEFT wrapping, the adapter that leaves the trainer, adapter-only
checkpoints and the export of a merged model.

Flow: :func:`wrap` puts PEFT LoRA layers on ``target_modules`` of the float32 policy and freezes every base weight,
so the optimizer, the gradient all-reduce of ``replicate`` ranks and every loss see only the adapters' ``A``/``B``
matrices. After each update :func:`adapter_state_dict` is what travels to the engines (PEFT's file names,
``base_model.model.<module>.lora_A.weight``: the names vLLM reads from ``adapter_model.safetensors``) together with
:func:`adapter_config` (the ``adapter_config.json`` contents); the engine serves it through vLLM's LoRA support under
the policy version (:mod:`agentrl.inference.lora`). A checkpoint's ``model/`` directory is then a PEFT adapter
directory (adapter plus the base model's tokenizer files) whose ``adapter_config.json`` names the base model it was
trained on: :func:`merge` turns it into a plain HF model directory (``agentrl lora merge``), and ``agentrl eval``
and the gateway serve it as the policy.

Invariants: the base weights never change during a run (only the adapters have ``requires_grad``); a freshly
wrapped model equals its base exactly (PEFT initialises ``B = 0``), which is why version 0 is served without an
adapter; a checkpoint records ``lora`` so that a full checkpoint never loads into a LoRA trainer or the reverse.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from agentrl.inference.lora import is_adapter_dir
from agentrl.trainer.config import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def peft_config(cfg: LoraConfig, base_model: str | os.PathLike | None = None) -> Any:
    """The ``peft.LoraConfig`` of ``cfg`` (causal LM, no bias terms: vLLM serves ``A``/``B`` only)."""
    import peft

    return peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM",
                           base_model_name_or_path=None if base_model is None else str(base_model))


def adapter_config(cfg: LoraConfig, base_model: str | os.PathLike | None = None) -> dict[str, Any]:
    """The ``adapter_config.json`` contents of ``cfg`` as plain JSON data (what an engine writes next to each
    adapter it serves)."""
    data = peft_config(cfg, base_model).to_dict()
    return json.loads(json.dumps(data, default=lambda v: sorted(v) if isinstance(v, (set, frozenset)) else str(v)))


def wrap(model: torch.nn.Module, cfg: LoraConfig, base_model: str | os.PathLike | None = None) -> torch.nn.Module:
    """Returns ``model`` wrapped by PEFT with LoRA layers on ``cfg.target_modules``, base weights frozen. Raises
    ``ValueError`` naming ``trainer.lora.target_modules`` when none of them is in the model."""
    import peft

    try:
        wrapped = peft.get_peft_model(model, peft_config(cfg, base_model))
    except ValueError as e:  # PEFT: "Target modules ... not found in the base model"
        raise ValueError(f"trainer.lora.target_modules {cfg.target_modules}: {e}") from e
    # The base stays in float32 (master weights); adapters are created in the base layer's dtype, float32 too.
    return wrapped


def is_lora_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def adapter_state_dict(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The adapter weights under PEFT's file names, as detached contiguous CPU copies (cast to ``dtype`` when
    given): what a weight sync sends and ``adapter_model.safetensors`` holds."""
    from peft import get_peft_model_state_dict

    out = {}
    for name, t in get_peft_model_state_dict(model).items():
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.to("cpu", copy=True).contiguous()
    return out


def load_adapter_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Any) -> None:
    """Loads adapter weights saved by :func:`adapter_state_dict` into a wrapped ``model``; raises ``ValueError``
    naming ``where`` when the file does not fit (another rank or other target modules)."""
    from peft import set_peft_model_state_dict

    own = adapter_state_dict(model)
    bad = sorted(n for n in own if n not in state or tuple(state[n].shape) != tuple(own[n].shape))
    extra = sorted(set(state) - set(own))
    if bad or extra:
        raise ValueError(f"{where}: the adapter does not fit trainer.lora (rank / target_modules): missing or "
                         f"reshaped {bad[:4]}, unknown {extra[:4]}")
    set_peft_model_state_dict(model, state)


def adapter_base(path: str | os.PathLike) -> str:
    """The base model an adapter directory was trained on (its ``base_model_name_or_path``). Raises
    ``ValueError`` when the directory names none."""
    cfg = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}/{ADAPTER_CONFIG} names no base_model_name_or_path: pass the base model (--base)")
    return str(base)


def merge(adapter_dir: str | os.PathLike, out_dir: str | os.PathLike, base: str | os.PathLike | None = None) -> Path:
    """Writes the base model with the adapter of ``adapter_dir`` merged into its weights (``W + alpha/r * B A``)
    to ``out_dir``, a plain HF model directory (float32 weights, the adapter directory's tokenizer files, else
    the base's). ``base`` defaults to the adapter's ``base_model_name_or_path``. Returns ``out_dir``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter_dir, out = Path(adapter_dir), Path(out_dir)
    if not is_adapter_dir(adapter_dir):
        raise ValueError(f"{adapter_dir}: not an adapter directory ({ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} needed)")
    base_dir = Path(base) if base is not None else Path(adapter_base(adapter_dir))
    if not (base_dir / "config.json").is_file():
        raise ValueError(f"{base_dir}: the base model directory has no config.json")
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out), safe_serialization=True)
    for src in (adapter_dir, base_dir):
        for f in src.iterdir():
            if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")) \
                    and not (out / f.name).exists():
                shutil.copy2(f, out / f.name)
    return out
