"""Checking and packing a trainer's state dict before it is sent to inference workers.

The check happens before the engine pauses: vLLM's in-place reload processes a model layer by layer and a bad
tensor found half-way would leave the served model partly updated, so a state dict is either accepted whole or
rejected with an error naming every bad entry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def checkpoint_schema(model_path: str) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape, read from the headers of the ``*.safetensors`` files in ``model_path`` (no tensor
    data is read). None when ``model_path`` is not a local directory with safetensors files."""
    from safetensors import safe_open

    root = Path(model_path)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        return None
    schema: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                schema[name] = tuple(st.get_slice(name).get_shape())
    return schema


def tied_embeddings(model_path: str) -> bool:
    """Whether the checkpoint's config ties ``lm_head`` to the input embedding."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(cfg.get("tie_word_embeddings", (cfg.get("text_config") or {}).get("tie_word_embeddings", False)))


def prepare_state_dict(
    state_dict: dict[str, Any], schema: dict[str, tuple[int, ...]] | None, dtype: Any, *, tied: bool = False
) -> dict[str, Any]:
    """Returns ``{name: contiguous CPU tensor}`` ready to serialize: floating tensors cast to ``dtype``, a tied
    ``lm_head.weight`` dropped when the checkpoint has none. Raises ``ValueError`` listing unknown names, missing
    names and shape mismatches against ``schema`` (skipped when ``schema`` is None), ``TypeError`` for a value
    that is not a tensor."""
    import torch

    if not state_dict:
        raise ValueError("state_dict is empty")
    out: dict[str, Any] = {}
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is a {type(t).__name__}, expected a torch.Tensor")
        if tied and name == "lm_head.weight" and (schema is None or name not in schema):
            continue  # HF state dicts list the tied head; vLLM ties it itself
        t = t.detach()
        out[name] = (t.to(dtype) if t.is_floating_point() else t).cpu().contiguous()
    if schema is not None:
        check_shapes({n: tuple(t.shape) for n, t in out.items()}, schema)
    return out


def check_shapes(shapes: dict[str, tuple[int, ...]], schema: dict[str, tuple[int, ...]]) -> None:
    """Raises ``ValueError`` listing unknown names, missing names and shape mismatches of ``shapes`` (name ->
    shape) against ``schema``."""
    problems = []
    unknown = sorted(set(shapes) - set(schema))
    missing = sorted(set(schema) - set(shapes))
    if unknown:
        problems.append(f"unknown tensors {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    if missing:
        problems.append(f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''} (send the complete state dict)")
    for name in sorted(set(shapes) & set(schema)):
        if tuple(shapes[name]) != tuple(schema[name]):
            problems.append(f"{name}: shape {tuple(shapes[name])} != checkpoint shape {tuple(schema[name])}")
    if problems:
        raise ValueError("state_dict does not fit the served model: " + "; ".join(problems))


def serialize(tensors: dict[str, Any]) -> bytes:
    """safetensors bytes of ``tensors`` (what :class:`WeightSyncExtension` loads)."""
    from safetensors.torch import save

    return save(tensors)
