"""Trainer checkpoints: atomic save, load with validation, and discovery of the newest complete one; and the
weights leaving a trainer (:func:`save_trainer`, :func:`load_trainer`, :func:`inference_state_dict`).

Layout of a checkpoint directory: ``model/`` (HF ``save_pretrained`` weights plus the source model's non-weight
files, so it is a complete model directory an engine can load; with ``trainer.lora`` a PEFT adapter directory
instead, naming its base model), ``optimizer.pt``, ``rng.pt`` (python, numpy,
torch, CUDA RNG states) and ``trainer_state.json`` (``format``, ``optimizer_steps``, ``version``, the config).

Invariants: a save writes everything into a temp directory next to the target, fsyncs it and renames it into place,
so a crash at any point leaves the previous checkpoint (or none), never a partial one; ``trainer_state.json`` is
the completeness marker. Replacing an existing checkpoint moves it aside (``.name.old-*``) just before the rename
and deletes it after, and discovery accepts that aside copy when a crash hit between the two renames.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from agentrl.trainer.trainer import Trainer

CHECKPOINT_FORMAT = 1
STATE_FILE = "trainer_state.json"
# Files of the source model directory that are not weights; copied next to checkpointed weights so that a
# checkpoint's model/ directory is a complete HF model (tokenizer, chat template) the engine can load.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def find_latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """Returns the complete checkpoint directory under ``root`` with the highest ``optimizer_steps`` (then
    ``version``), or ``None``. A directory counts only if it holds ``trainer_state.json`` (the whole directory is
    renamed into place at once); temp directories (``.name.tmp-*``) are ignored, and a moved-aside ``.name.old-*``
    copy counts only when ``name`` itself is missing (a crash between the two renames of a replacing save)."""
    root = Path(root)
    if not root.is_dir():
        return None
    best: tuple[tuple[int, int], Path] | None = None
    for d in root.iterdir():
        if not d.is_dir():
            continue
        if d.name.startswith("."):
            base, sep, _ = d.name[1:].rpartition(".old-")
            if not sep or (root / base).exists():
                continue
        try:
            st = json.loads((d / STATE_FILE).read_text())
            key = (int(st["optimizer_steps"]), int(st["version"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or key > best[0]:
            best = (key, d)
    return None if best is None else best[1]


def _plain_architecture(config_file: Path) -> None:
    """FSDP2 swaps a sharded model's class for a generated subclass (``FSDPQwen2ForCausalLM``), and
    ``save_pretrained`` records the class name; an engine needs the model's own architecture name."""
    if not config_file.exists():
        return
    cfg = json.loads(config_file.read_text())
    archs = cfg.get("architectures") or []
    plain = [a[4:] if a.startswith("FSDP") else a for a in archs]
    if plain != archs:
        cfg["architectures"] = plain
        config_file.write_text(json.dumps(cfg, indent=2) + "\n")


def save(path: str | os.PathLike, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
         source_model_path: Path, state: dict[str, Any], model_state: dict[str, torch.Tensor] | None = None,
         optimizer_state: dict[str, Any] | None = None) -> Path:
    """Writes a checkpoint of ``model``/``optimizer``/the RNG states with ``state`` (``optimizer_steps``,
    ``version``, ``config``, ...) to ``path`` atomically (see module docstring). Returns ``path``.
    ``model_state`` / ``optimizer_state`` replace the module's own state dicts (FSDP: the full state dicts gathered
    from the shards)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of saves to this path that were killed mid-way (one trainer saves a given path at a time).
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tag = uuid.uuid4().hex[:8]
    tmp = path.parent / f".{path.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        if model_state is not None:
            model.save_pretrained(str(tmp / "model"), safe_serialization=True, state_dict=model_state)
        elif hasattr(model, "peft_config"):  # a LoRA trainer: model/ is the adapter directory
            model.save_pretrained(str(tmp / "model"), safe_serialization=True, save_embedding_layers=False)
        else:
            model.save_pretrained(str(tmp / "model"), safe_serialization=True)
        _plain_architecture(tmp / "model" / "config.json")
        if source_model_path.is_dir():
            for f in source_model_path.iterdir():
                if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and not (tmp / "model" / f.name).exists():
                    shutil.copy2(f, tmp / "model" / f.name)
        torch.save(optimizer_state if optimizer_state is not None else optimizer.state_dict(),  # type: ignore[union-attr]
                   tmp / "optimizer.pt")
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        torch.save(rng, tmp / "rng.pt")
        full = {"format": CHECKPOINT_FORMAT, **state, "source_model_path": str(source_model_path),
                "saved_at": time.time()}
        (tmp / STATE_FILE).write_text(json.dumps(full, indent=2))
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = path.parent / f".{path.name}.old-{tag}"
        os.rename(path, old)
    os.rename(tmp, path)
    _fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def load(path: str | os.PathLike, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         device: torch.device) -> dict[str, Any]:
    """Restores weights (cast to the model's dtype), optimizer state and RNG states from a checkpoint written by
    :func:`save` (or its moved-aside copy after a crash between renames). Returns the saved state dict. Raises
    ``FileNotFoundError`` / ``ValueError`` for a missing or incompatible checkpoint."""
    path, state = read_state(path)
    sd = read_weights(path)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected:
        raise ValueError(f"{path}: weights not in the model: {sorted(unexpected)[:5]}")
    own = model.state_dict()
    loaded_ptrs = {own[k].data_ptr() for k in sd}
    really_missing = [k for k in missing if own[k].data_ptr() not in loaded_ptrs]
    if really_missing:  # tied weights (lm_head <- embed_tokens) are legitimately absent from the file
        raise ValueError(f"{path}: checkpoint lacks weights {really_missing[:5]}")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    restore_rng(path)
    return state


def read_state(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Returns ``(directory, trainer_state.json contents)`` of the checkpoint at ``path`` (or its moved-aside copy
    after a crash between the renames of a replacing save). Raises ``FileNotFoundError`` / ``ValueError``."""
    path = Path(path)
    if not (path / STATE_FILE).exists():
        aside = sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.is_dir() else []
        aside = [d for d in aside if (d / STATE_FILE).exists()]
        if not aside:
            raise FileNotFoundError(f"no complete checkpoint at {path} ({STATE_FILE} missing)")
        path = aside[-1]
    state = json.loads((path / STATE_FILE).read_text())
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')} != {CHECKPOINT_FORMAT}")
    return path, state


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's model weights (``model/*.safetensors``) as ``{hf_name: cpu tensor}``."""
    from safetensors.torch import load_file

    files = sorted((path / "model").glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path / 'model'}: no *.safetensors weights")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


def restore_rng(path: Path) -> None:
    """Restores the python, numpy, torch (and CUDA) RNG states saved in ``path/rng.pt``."""
    rng = torch.load(path / "rng.pt", weights_only=False)  # our own file: holds numpy/python state objects
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


# ------------------------------------------------------------------------------------------- a trainer's weights
def inference_state_dict(trainer: Trainer, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Returns ``{name: tensor}`` with the HF parameter/buffer names of the trainer's model (``model.layers.0...``,
    ``lm_head.weight`` also present when tied), detached CPU copies, safe to ship while the trainer keeps
    stepping. Floating tensors are cast to ``dtype``; by default to bfloat16 when the trainer computes in
    bfloat16 (what the engine runs; half the bytes of the float32 master weights), else left float32.
    Under FSDP this gathers the shards (a collective: every rank must call it) and only rank 0 gets the
    tensors (the others get ``{}``)."""
    if dtype is None and trainer._compute_dtype == torch.bfloat16:
        dtype = torch.bfloat16
    if trainer.config.lora is not None:
        from agentrl.trainer.lora import adapter_state_dict

        return adapter_state_dict(trainer.model, dtype)
    if trainer.sharding == "fsdp":
        from agentrl.trainer.dp_rank import full_state_dict

        state = full_state_dict(trainer.model)
    else:
        state = trainer.model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.to("cpu", copy=True).contiguous()
    return out


def save_trainer(trainer: Trainer, path: str | os.PathLike) -> Path:
    """Writes the trainer's model (HF ``save_pretrained`` under ``path/model``, float32, with the source model's
    tokenizer files), optimizer state, RNG states (python, numpy, torch, CUDA), ``optimizer_steps``, ``version``
    and config to ``path`` with :func:`save` (atomic: a crash mid-save leaves the previous checkpoint, or none). An
    existing ``path`` is replaced. Returns ``path``. As a data-parallel rank: every rank must call it; rank 0
    writes the whole model and optimizer (replicated: its own; FSDP: gathered from the shards), with
    ``world_size`` and ``sharding`` in ``trainer_state.json``, and RNG states of rank 0 (every rank restores
    those)."""
    from agentrl.config import to_dict

    state = {"optimizer_steps": trainer.optimizer_steps, "version": trainer.version,
             "config": to_dict(trainer.config), "world_size": trainer._world, "sharding": trainer.sharding,
             "lora": trainer.config.lora is not None}
    if trainer.sharding == "fsdp":
        return save_sharded(path, trainer.model, trainer.optimizer, trainer.model_path, state)
    if trainer.rank != 0:
        return Path(path)  # replicate: every rank holds the same model and optimizer state; rank 0 writes it
    return save(path, model=trainer.model, optimizer=trainer.optimizer, source_model_path=trainer.model_path,
                state=state)


def load_trainer(trainer: Trainer, path: str | os.PathLike) -> dict[str, Any]:
    """Restores the trainer's model weights, optimizer state and RNG states from a directory written by
    :func:`save_trainer` (or its moved-aside copy after a crash between the renames of a replacing save). Returns
    the saved state (``optimizer_steps``, ``version``, ``config`` as a dict, ...), which the trainer adopts. Raises
    ``FileNotFoundError`` / ``ValueError`` for a missing or incompatible checkpoint, including one saved with
    another number of data-parallel ranks (or another sharding)."""
    where, saved = read_state(path)
    saved_world = int(saved.get("world_size", 1))
    if saved_world != trainer._world:
        raise ValueError(
            f"{where}: the checkpoint was saved by {saved_world} trainer rank(s) but this run has "
            f"trainer.world_size={trainer._world}; resume with trainer.world_size={saved_world} (a checkpoint "
            f"holds the whole model, but its optimizer and RNG states belong to the rank layout that saved it)")
    if bool(saved.get("lora")) != (trainer.config.lora is not None):
        kind = "LoRA adapter" if saved.get("lora") else "full model"
        raise ValueError(f"{where}: a {kind} checkpoint cannot resume a run with trainer.lora "
                         f"{'unset' if trainer.config.lora is None else 'set'}: resume with the trainer.lora that "
                         "saved it")
    if trainer.config.lora is not None:
        from agentrl.trainer.lora import load_adapter_weights

        load_adapter_weights(trainer.model, read_weights(where), where)
        trainer.optimizer.load_state_dict(torch.load(where / "optimizer.pt", map_location=trainer.device,
                                                     weights_only=True))
        restore_rng(where)
        return saved
    if trainer.sharding == "fsdp":
        if saved.get("sharding") != "fsdp":
            raise ValueError(f"{where}: saved with trainer.sharding {saved.get('sharding')!r}, this run uses "
                             "fsdp: resume with the sharding that saved it")
        load_sharded(where, trainer.model, trainer.optimizer)
        return saved
    if saved.get("sharding") == "fsdp":  # its optimizer state is keyed by parameter names, not indices
        raise ValueError(f"{where}: saved with trainer.sharding 'fsdp', this run uses {trainer.sharding!r}: "
                         "resume with trainer.sharding=fsdp")
    return load(where, model=trainer.model, optimizer=trainer.optimizer, device=trainer.device)


# ------------------------------------------------------------------------------------- FSDP (sharded) models
def save_sharded(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 source_model_path: Path, state: dict[str, Any]) -> Path:
    """Checkpoints an FSDP model: the full model and optimizer state are gathered (collectives: every rank calls
    this) and rank 0 writes them as a normal checkpoint (:func:`save`; the optimizer
    state keyed by parameter names). Returns ``path``."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from agentrl.trainer.dp_rank import full_state_dict

    model_state = full_state_dict(model)
    optim_state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                      cpu_offload=True))
    if dist.get_rank() != 0:
        return Path(path)
    return save(path, model=model, optimizer=None, source_model_path=source_model_path, state=state,
                     model_state=model_state, optimizer_state=optim_state)


def load_sharded(where: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Loads a checkpoint written by :func:`save_sharded` into an FSDP model and its optimizer on every rank (each
    reads the files and keeps its shard), and restores rank 0's RNG states."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    # strict=False: the file omits tied weights (lm_head.weight <- embed_tokens.weight)
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, read_weights(where), options=opts)
    osd = torch.load(where / "optimizer.pt", map_location="cpu", weights_only=True)
    set_optimizer_state_dict(model, optimizer, osd, options=opts)
    restore_rng(where)
