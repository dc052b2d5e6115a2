"""The trainer: a transformers causal LM, AdamW, micro-batched policy-gradient steps on trajectories.

Plain Python (no Ray): :mod:`agentrl.trainer.actor` wraps it as a Ray actor.

Data layout. A trajectory of ``n`` tokens gives ``T = n - 1`` target positions: position ``t`` predicts
``token_ids[t + 1]`` from ``token_ids[: t + 1]``, so every per-token field of the trajectory is shifted by one
(``loss_mask[1:]``, ``logprobs[1:]``, ``versions[1:]``). Sequences are right-padded with token 0 under an attention
mask; padded positions have mask 0 and never reach the loss.

Versions. ``version`` counts weight updates: it starts at 0 (or the checkpoint's) and increases by exactly one per
:meth:`Trainer.train_step` or :meth:`Trainer.sft_step` call, whatever ``num_mini_batches``/``ppo_epochs`` are, so
the weights after the call are "version v" for the engine. ``optimizer_steps`` counts optimizer steps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentrl.config import from_dict, to_dict
from agentrl.trainer.advantages import compute_advantages
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer import records
from agentrl.trainer.losses import policy_loss
from agentrl.trajectory import Group, Trajectory

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
_STATE_FILE = "trainer_state.json"
# Files of the source model directory that are not weights; copied next to checkpointed weights so that a
# checkpoint's model/ directory is a complete HF model (tokenizer, chat template) the engine can load.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


@dataclass
class _Seq:
    """One trajectory prepared for training. Token tensors have length ``n``; per-target tensors ``n - 1``."""

    ids: Tensor  # [n] long
    mask: Tensor  # [n-1] float, loss mask of the targets
    behav: Tensor  # [n-1] float, engine log-probs of the targets
    versions: Tensor  # [n-1] long, -1 on non-generated targets
    adv: float
    reward: float
    prox: Tensor | None = None  # [n-1]
    ref: Tensor | None = None  # [n-1]

    @property
    def length(self) -> int:
        return int(self.ids.numel())


@dataclass
class _Micro:
    """A padded micro-batch. ``L`` = longest sequence, ``T = L - 1``."""

    input_ids: Tensor  # [b, L]
    attention_mask: Tensor  # [b, L]
    mask: Tensor  # [b, T]
    behav: Tensor  # [b, T]
    adv: Tensor  # [b]
    reward: Tensor  # [b]
    prox: Tensor | None  # [b, T]
    ref: Tensor | None  # [b, T]
    num_tokens: int  # real (unpadded) tokens


def _pad(rows: list[Tensor], length: int, value: float | int, dtype: torch.dtype) -> Tensor:
    out = torch.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out


def _collate(seqs: list[_Seq], device: torch.device) -> _Micro:
    L = max(s.length for s in seqs)
    T = L - 1

    def opt(rows: list[Tensor | None]) -> Tensor | None:
        if any(r is None for r in rows):
            return None
        return _pad(rows, T, 0.0, torch.float32).to(device)  # type: ignore[arg-type]

    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        attn[i, : s.length] = 1
    return _Micro(
        input_ids=_pad([s.ids for s in seqs], L, 0, torch.long).to(device),
        attention_mask=attn.to(device),
        mask=_pad([s.mask for s in seqs], T, 0.0, torch.float32).to(device),
        behav=_pad([s.behav for s in seqs], T, 0.0, torch.float32).to(device),
        adv=torch.tensor([s.adv for s in seqs], dtype=torch.float32, device=device),
        reward=torch.tensor([s.reward for s in seqs], dtype=torch.float32, device=device),
        prox=opt([s.prox for s in seqs]),
        ref=opt([s.ref for s in seqs]),
        num_tokens=sum(s.length for s in seqs),
    )


def _split_micro(seqs: list[_Seq], max_seqs: int, max_tokens: int | None) -> list[list[_Seq]]:
    """Groups ``seqs`` (sorted by length, longest first, to limit padding) into micro-batches of at most
    ``max_seqs`` sequences and at most ``max_tokens`` padded tokens (a longer single sequence stays alone)."""
    order = sorted(range(len(seqs)), key=lambda i: -seqs[i].length)
    out: list[list[_Seq]] = []
    cur: list[_Seq] = []
    cur_max = 0
    for i in order:
        s = seqs[i]
        new_max = max(cur_max, s.length)
        if cur and (len(cur) >= max_seqs or (max_tokens is not None and new_max * (len(cur) + 1) > max_tokens)):
            out.append(cur)
            cur, new_max = [], s.length
        cur.append(s)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


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
            # A replacing save moves the old copy aside as ".name.old-*" just before renaming the new one in;
            # a crash between the two renames leaves only the aside copy, which is still a complete checkpoint.
            base, sep, _ = d.name[1:].rpartition(".old-")
            if not sep or (root / base).exists():
                continue
        try:
            st = json.loads((d / _STATE_FILE).read_text())
            key = (int(st["optimizer_steps"]), int(st["version"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or key > best[0]:
            best = (key, d)
    return None if best is None else best[1]


class Trainer:
    """Holds the policy model, its optimizer and (when ``loss.kl_coef > 0``) a frozen reference model.

    Construct with a validated :class:`TrainerConfig` and the path of a HF causal LM directory. Raises
    ``ValueError`` for an invalid config and ``NotImplementedError`` for ``world_size > 1``.
    """

    def __init__(self, config: TrainerConfig, model_path: str | os.PathLike) -> None:
        from transformers import AutoModelForCausalLM

        if isinstance(config, dict):
            config = from_dict(TrainerConfig, config, "trainer config")
        config.validate()
        if config.world_size > 1:
            raise NotImplementedError(
                "world_size > 1 (data-parallel trainer actors) is not implemented yet: run one trainer actor "
                "(world_size: 1); see agentrl/trainer/actor.py for how torch.distributed/FSDP plug in"
            )
        self.config = config
        self.model_path = Path(model_path)
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            if config.device == "cuda" and not torch.cuda.is_available():
                raise ValueError("device: cuda was requested but torch.cuda.is_available() is False")
            self.device = torch.device(config.device)
        self._param_dtype = torch.float32 if config.dtype == "float32" else torch.bfloat16

        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)

        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=self._param_dtype)
        self.model.to(self.device)
        self.model.config.use_cache = False
        if config.disable_dropout:
            self._disable_dropout(self.model)
        if config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])

        self.ref_model = None
        if config.loss.kl_coef > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=self._param_dtype)
            self.ref_model.to(self.device).eval()
            self.ref_model.config.use_cache = False
            self._disable_dropout(self.ref_model)
            for p in self.ref_model.parameters():
                p.requires_grad_(False)

        opt = config.optimizer
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=opt.lr,
            betas=(float(opt.betas[0]), float(opt.betas[1])),
            eps=opt.eps,
            weight_decay=opt.weight_decay,
        )
        self._version = 0
        self._optimizer_steps = 0

    # ------------------------------------------------------------------------------------------ properties
    @property
    def version(self) -> int:
        """Number of weight updates applied (train_step and sft_step calls), restored from checkpoints."""
        return self._version

    @property
    def optimizer_steps(self) -> int:
        return self._optimizer_steps

    # --------------------------------------------------------------------------------------------- helpers
    @staticmethod
    def _disable_dropout(model: torch.nn.Module) -> None:
        # Dropout would make the proximal (no-grad) and training forward passes disagree for identical weights.
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
            if hasattr(m, "attention_dropout") and isinstance(m.attention_dropout, float):
                m.attention_dropout = 0.0

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.config.mixed_precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _lr(self) -> float:
        opt = self.config.optimizer
        if opt.warmup_steps > 0:
            return opt.lr * min(1.0, (self._optimizer_steps + 1) / opt.warmup_steps)
        return opt.lr

    def _forward(
        self, model: torch.nn.Module, mb: _Micro, *, entropy: bool, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Returns ``logp: [b, T]`` of the targets (float32, temperature-scaled) and, if asked, ``entropy: [b, T]``
        of the full next-token distribution (with gradient only if ``entropy_grad``)."""
        with self._autocast():
            out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
        logits = out.logits[:, :-1].float()  # [b, T, V]
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        logsm = torch.log_softmax(logits, dim=-1)
        logp = logsm.gather(-1, mb.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [b, T]
        ent = None
        if entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = -(logsm.exp() * logsm).sum(-1)
        return logp, ent

    def _prepare(
        self, trajectories: Sequence[Trajectory], advantages: Sequence[float] | None
    ) -> tuple[list[_Seq], dict[str, float]]:
        """Validates and tensorises the batch. Invalid trajectories (misaligned fields, token ids outside the
        vocabulary, fewer than 2 tokens) are dropped with a warning and counted; trajectories longer than
        ``max_seq_len`` lose their tail. Raises ``ValueError`` if nothing trainable remains."""
        if advantages is not None and len(advantages) != len(trajectories):
            raise ValueError(f"got {len(advantages)} advantages for {len(trajectories)} trajectories")
        max_len = self.config.max_seq_len
        seqs: list[_Seq] = []
        dropped = truncated = 0
        for i, t in enumerate(trajectories):
            try:
                t.validate()
                if len(t.token_ids) < 2:
                    raise ValueError(f"trajectory {t.id}: needs at least 2 tokens, has {len(t.token_ids)}")
                bad = [x for x in t.token_ids if not 0 <= x < self.vocab_size]
                if bad:
                    raise ValueError(f"trajectory {t.id}: token id {bad[0]} outside vocabulary [0, {self.vocab_size})")
                adv = 0.0 if advantages is None else float(advantages[i])
                if not math.isfinite(adv) or not math.isfinite(float(t.reward)):
                    raise ValueError(f"trajectory {t.id}: non-finite advantage {adv} or reward {t.reward}")
                behav = [float(x) for x in t.logprobs]
                if any(not math.isfinite(x) for x, m in zip(behav, t.loss_mask) if m):
                    raise ValueError(f"trajectory {t.id}: non-finite behavior logprob on a generated token")
            except ValueError as e:
                log.warning("dropping trajectory from the batch: %s", e)
                dropped += 1
                continue
            # A segmented trajectory (template mode "split") is one sequence per segment, each with exactly its own
            # context and the trajectory's advantage.
            for a, b in t.segment_slices():
                if b - a < 2:
                    continue
                n = b - a
                if max_len is not None and n > max_len:
                    n = max_len
                    truncated += 1
                lm = t.loss_mask[a + 1:a + n]
                seqs.append(
                    _Seq(
                        ids=torch.tensor(t.token_ids[a:a + n], dtype=torch.long),
                        mask=torch.tensor(lm, dtype=torch.float32),
                        behav=torch.tensor([x if m else 0.0 for x, m in zip(behav[a + 1:a + n], lm)],
                                           dtype=torch.float32),
                        versions=torch.tensor(t.versions[a + 1:a + n], dtype=torch.long),
                        adv=adv,
                        reward=float(t.reward),
                    )
                )
        if not seqs:
            raise ValueError(f"no trainable trajectory in a batch of {len(trajectories)} ({dropped} invalid)")
        info = {"batch/dropped_invalid": float(dropped), "batch/truncated_seqs": float(truncated)}
        return seqs, info

    @torch.no_grad()
    def _fill_logprobs(self, seqs: list[_Seq], model: torch.nn.Module, attr: str) -> None:
        model.eval()
        for group in _split_micro(seqs, self.config.micro_batch_size, self.config.micro_batch_tokens):
            mb = _collate(group, self.device)
            logp, _ = self._forward(model, mb, entropy=False)
            logp = logp.float().cpu()
            for j, s in enumerate(group):
                setattr(s, attr, logp[j, : s.length - 1].clone())

    # ------------------------------------------------------------------------------------------ public API
    @torch.no_grad()
    def compute_logprobs(self, batch: Sequence[Trajectory] | Sequence[Sequence[int]]) -> Tensor:
        """Returns ``logp: [B, T]`` (float32, CPU, no grad) with the current weights, where ``T = longest - 1`` and
        ``logp[i, t] = log pi(tokens_i[t+1] | tokens_i[:t+1])`` (temperature applied); 0.0 beyond each sequence.
        Accepts trajectories or plain token-id lists. Compare with a trajectory's engine log-probs as
        ``logp[i, t]`` vs ``traj.logprobs[t + 1]``. A segmented trajectory's tokens are scored within their own
        segment; ``logp`` is 0.0 at the first token of each later segment (it has no context there)."""
        if any(isinstance(b, Trajectory) and b.segments for b in batch):
            flat = [(i, a, b) for i, t in enumerate(batch) for a, b in t.segment_slices()]  # type: ignore[union-attr]
            parts = self.compute_logprobs([batch[i].token_ids[a:b] for i, a, b in flat])  # type: ignore[union-attr]
            out = torch.zeros(len(batch), max(len(t.token_ids) for t in batch) - 1)  # type: ignore[union-attr]
            for row, (i, a, b) in zip(parts, flat):
                out[i, a:b - 1] = row[: b - a - 1]
            return out
        ids = [list(b.token_ids) if isinstance(b, Trajectory) else list(b) for b in batch]
        for i, x in enumerate(ids):
            if len(x) < 2:
                raise ValueError(f"sequence {i}: needs at least 2 tokens, has {len(x)}")
            if any(not 0 <= v < self.vocab_size for v in x):
                raise ValueError(f"sequence {i}: token id outside vocabulary [0, {self.vocab_size})")
        seqs = [
            _Seq(ids=torch.tensor(x, dtype=torch.long), mask=torch.ones(len(x) - 1), behav=torch.zeros(len(x) - 1),
                 versions=torch.zeros(len(x) - 1, dtype=torch.long), adv=0.0, reward=0.0)
            for x in ids
        ]
        self._fill_logprobs(seqs, self.model, "prox")
        T = max(len(x) for x in ids) - 1
        return _pad([s.prox for s in seqs], T, 0.0, torch.float32)  # type: ignore[misc]

    def train_step(
        self,
        batch: Sequence[Trajectory] | Sequence[Group],
        advantages: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """One policy update on ``batch`` (trajectories, or groups flattened in order).

        ``advantages``: one per trajectory (aligned with the flattened batch); when ``None`` they are computed with
        ``config.advantage`` per group (``Group`` objects, or trajectories grouped by ``group_id``). At the start of
        the step the proximal log-probs (and reference log-probs if ``kl_coef > 0``) are recomputed without
        gradient. Then ``ppo_epochs`` x ``num_mini_batches`` optimizer steps follow, each accumulating gradients
        over micro-batches with the loss normalised over the whole mini-batch, clipping the gradient norm to
        ``max_grad_norm``. A mini-batch whose loss or gradient norm is not finite, or which has no loss token, is
        skipped (``train/skipped_steps``). ``version`` increases by one.

        Returns flat float metrics: ``loss``, ``loss/policy``, ``loss/kl``, ``kl/ref``, ``grad_norm``, ``lr``,
        ``entropy``, ``ratio/clip_frac``, ``ratio/mean``, ``is/weight_mean``, ``is/weight_max``,
        ``is/truncated_frac``, ``is/masked_frac``, ``mismatch/kl_k1``, ``mismatch/kl_k3`` (``KL(mu || pi_prox)``),
        ``staleness/mean``, ``staleness/max``, ``staleness/hist/<k>`` (share of loss tokens ``k`` versions old),
        ``reward/{mean,std,min,max}``, ``adv/{mean,std,min,max,zero_frac}``, ``batch/{num_seqs,num_tokens,
        loss_tokens,mean_seq_len,dropped_invalid,truncated_seqs}``, ``perf/{step_s,prox_s,tokens_per_s}``,
        ``train/skipped_steps``, ``version``, ``optimizer_steps`` (keys absent when they do not apply).
        """
        t_start = time.perf_counter()
        trajs: list[Trajectory] = (
            [t for g in batch for t in g.trajectories] if batch and isinstance(batch[0], Group) else list(batch)  # type: ignore[union-attr]
        )
        if not trajs:
            raise ValueError("train_step got an empty batch")
        records.capture(self, trajs)
        if advantages is None:
            advantages = compute_advantages(batch, self.config.advantage)  # type: ignore[arg-type]
        seqs, metrics = self._prepare(trajs, advantages)
        metrics.update(self._batch_stats(seqs))
        seqs = [s for s in seqs if s.mask.sum() > 0]  # nothing to learn from the others; skip their forward
        cfg = self.config
        need_prox = cfg.loss.needs_proximal or cfg.log_mismatch_metrics
        t_prox = time.perf_counter()
        if seqs and need_prox:
            self._fill_logprobs(seqs, self.model, "prox")
        if seqs and self.ref_model is not None:
            self._fill_logprobs(seqs, self.ref_model, "ref")
        metrics["perf/prox_s"] = time.perf_counter() - t_prox

        mini = self._mini_batches(seqs)
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        maxima: dict[str, float] = {}
        losses: dict[str, list[float]] = {}
        grad_norms: list[float] = []
        skipped = 0
        for _ in range(cfg.ppo_epochs):
            for mb_seqs in mini:
                res = self._optimizer_step(mb_seqs, sums, weights, maxima)
                if res is None:
                    skipped += 1
                    continue
                mb_losses, gnorm = res
                grad_norms.append(gnorm)
                for k, v in mb_losses.items():
                    losses.setdefault(k, []).append(v)
        for k, v in sums.items():
            metrics[k] = v / max(weights[k], 1e-12)
        metrics.update(maxima)
        for k, vs in losses.items():
            metrics[k] = sum(vs) / len(vs)
        if grad_norms:
            metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
        metrics["train/skipped_steps"] = float(skipped + (0 if mini else 1))
        return self._finish_step(metrics, t_start)

    def take_logprob_records(self) -> list[dict[str, Any]]:
        """Returns and clears the per-token log-prob records (see :mod:`agentrl.trainer.records`)."""
        return records.take(self)

    def _finish_step(self, metrics: dict[str, float], t_start: float) -> dict[str, float]:
        """Bumps ``version`` (one per train_step / sft_step) and adds the per-step lr, timing and counters."""
        metrics["lr"] = self._lr()
        self._version += 1
        elapsed = time.perf_counter() - t_start
        metrics["perf/step_s"] = elapsed
        metrics["perf/tokens_per_s"] = metrics["batch/num_tokens"] / max(elapsed, 1e-9)
        metrics["version"] = float(self._version)
        metrics["optimizer_steps"] = float(self._optimizer_steps)
        return metrics

    def _mini_batches(self, seqs: list[_Seq]) -> list[list[_Seq]]:
        if not seqs:
            return []
        k = min(self.config.num_mini_batches, len(seqs))
        size, rem = divmod(len(seqs), k)
        out, start = [], 0
        for i in range(k):
            end = start + size + (1 if i < rem else 0)
            out.append(seqs[start:end])
            start = end
        return out

    def _optimizer_step(
        self,
        seqs: list[_Seq],
        sums: dict[str, float],
        weights: dict[str, float],
        maxima: dict[str, float],
    ) -> tuple[dict[str, float], float] | None:
        """Accumulates gradients over micro-batches of ``seqs`` and steps. Returns the mini-batch's loss terms and
        gradient norm, or ``None`` if the step was skipped (non-finite loss/gradient or no loss tokens)."""
        cfg = self.config
        num_tokens = float(sum(float(s.mask.sum()) for s in seqs))
        num_seqs = float(sum(1 for s in seqs if s.mask.sum() > 0))
        if num_tokens == 0:
            return None
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        want_entropy = cfg.compute_entropy or cfg.loss.entropy_coef > 0
        loss_terms: dict[str, float] = {}
        finite = True
        local_sums: dict[str, float] = {}
        local_w: dict[str, float] = {}
        local_max: dict[str, float] = {}
        for group in _split_micro(seqs, cfg.micro_batch_size, cfg.micro_batch_tokens):
            mb = _collate(group, self.device)
            logp, ent = self._forward(self.model, mb, entropy=want_entropy, entropy_grad=cfg.loss.entropy_coef > 0)
            loss, m = policy_loss(
                cfg.loss, logp=logp, mask=mb.mask, adv=mb.adv, prox_logp=mb.prox, behav_logp=mb.behav,
                reward=mb.reward, ref_logp=mb.ref, entropy=ent, num_tokens=num_tokens, num_seqs=num_seqs,
            )
            if not torch.isfinite(loss):
                finite = False
                break
            loss.backward()
            w = float(mb.mask.sum())
            loss_terms["loss"] = loss_terms.get("loss", 0.0) + float(loss.detach())
            for k, v in m.items():
                if k.startswith("loss/"):
                    # Already normalised by the whole mini-batch: the micro-batch shares add up.
                    loss_terms[k] = loss_terms.get(k, 0.0) + v
                elif k.endswith("_max"):
                    local_max[k] = max(local_max.get(k, -math.inf), v)
                else:
                    local_sums[k] = local_sums.get(k, 0.0) + v * w
                    local_w[k] = local_w.get(k, 0.0) + w
        params = [p for p in self.model.parameters() if p.requires_grad]
        if finite:
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
            gnorm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            finite = math.isfinite(gnorm)
        if not finite:
            log.warning("skipping an optimizer step: non-finite loss or gradient norm")
            self.optimizer.zero_grad(set_to_none=True)
            return None
        lr = self._lr()
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._optimizer_steps += 1
        for k, v in local_sums.items():
            sums[k] = sums.get(k, 0.0) + v
            weights[k] = weights.get(k, 0.0) + local_w[k]
        for k, v in local_max.items():
            maxima[k] = max(maxima.get(k, -math.inf), v)
        return loss_terms, gnorm

    def _batch_stats(self, seqs: list[_Seq]) -> dict[str, float]:
        """Reward, advantage, size and staleness statistics of the prepared batch (before any update)."""
        out: dict[str, float] = {}
        rewards = np.array([s.reward for s in seqs], dtype=np.float64)
        adv = np.array([s.adv for s in seqs], dtype=np.float64)
        for name, arr in (("reward", rewards), ("adv", adv)):
            out[f"{name}/mean"] = float(arr.mean())
            out[f"{name}/std"] = float(arr.std())
            out[f"{name}/min"] = float(arr.min())
            out[f"{name}/max"] = float(arr.max())
        out["adv/zero_frac"] = float(np.mean(np.abs(adv) < 1e-8))
        lengths = [s.length for s in seqs]
        out["batch/num_seqs"] = float(len(seqs))
        out["batch/num_tokens"] = float(sum(lengths))
        out["batch/mean_seq_len"] = float(np.mean(lengths))
        vers = torch.cat([s.versions[s.mask > 0] for s in seqs])
        out["batch/loss_tokens"] = float(vers.numel())
        if vers.numel():
            stale = (self._version - vers).numpy()
            out["staleness/mean"] = float(stale.mean())
            out["staleness/max"] = float(stale.max())
            values, counts = np.unique(stale, return_counts=True)
            for v, c in zip(values, counts):
                out[f"staleness/hist/{int(v)}"] = float(c) / stale.size
        return out

    def sft_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One supervised step: mean negative log-likelihood over all loss-mask tokens of the batch (micro-batched,
        gradient-clipped), for warm starts on scripted demonstrations. ``version`` increases by one. Returns
        ``sft/nll`` (before the update), ``grad_norm``, ``lr``, ``batch/*``, ``perf/step_s``, ``perf/tokens_per_s``,
        ``version``, ``optimizer_steps``, ``train/skipped_steps``."""
        t_start = time.perf_counter()
        if not trajectories:
            raise ValueError("sft_step got an empty batch")
        seqs, metrics = self._prepare(list(trajectories), None)
        metrics["batch/num_seqs"] = float(len(seqs))
        metrics["batch/num_tokens"] = float(sum(s.length for s in seqs))
        seqs = [s for s in seqs if s.mask.sum() > 0]
        num_tokens = float(sum(float(s.mask.sum()) for s in seqs))
        metrics["batch/loss_tokens"] = num_tokens
        cfg = self.config
        skipped = 1.0
        if num_tokens > 0:
            self.model.train()
            self.optimizer.zero_grad(set_to_none=True)
            nll_total = 0.0
            ok = True
            for group in _split_micro(seqs, cfg.micro_batch_size, cfg.micro_batch_tokens):
                mb = _collate(group, self.device)
                logp, _ = self._forward(self.model, mb, entropy=False)
                loss = -(logp * mb.mask).sum() / num_tokens
                if not torch.isfinite(loss):
                    ok = False
                    break
                loss.backward()
                nll_total += float(loss.detach())
            if ok:
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
                gnorm = float(torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], max_norm))
                ok = math.isfinite(gnorm)
            if ok:
                for g in self.optimizer.param_groups:
                    g["lr"] = self._lr()
                self.optimizer.step()
                self._optimizer_steps += 1
                skipped = 0.0
                metrics["sft/nll"] = nll_total
                metrics["grad_norm"] = gnorm
            self.optimizer.zero_grad(set_to_none=True)
        metrics["train/skipped_steps"] = skipped
        return self._finish_step(metrics, t_start)

    def state_dict_for_inference(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """Returns ``{name: tensor}`` with the HF parameter/buffer names of the model (``model.layers.0...``,
        ``lm_head.weight`` also present when tied), detached CPU copies (optionally cast to ``dtype``), safe to
        ship while the trainer keeps stepping."""
        out: dict[str, Tensor] = {}
        for name, t in self.model.state_dict().items():
            t = t.detach()
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            out[name] = t.to("cpu", copy=True).contiguous()
        return out

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        """Writes model (HF ``save_pretrained`` under ``path/model``, with the source model's tokenizer files),
        optimizer state, RNG states (python, numpy, torch, CUDA), ``optimizer_steps``, ``version`` and the config to
        ``path``, atomically: everything goes to a temp directory next to ``path`` that is fsynced and renamed into
        place, so a crash mid-save leaves the previous checkpoint (or none), never a partial one. An existing
        ``path`` is replaced (it is moved aside first and deleted after the rename). Returns ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Leftovers of saves to this path that were killed mid-way (one trainer saves a given path at a time).
        for stale in path.parent.glob(f".{path.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tag = uuid.uuid4().hex[:8]
        tmp = path.parent / f".{path.name}.tmp-{tag}"
        tmp.mkdir()
        try:
            self.model.save_pretrained(str(tmp / "model"), safe_serialization=True)
            if self.model_path.is_dir():
                for f in self.model_path.iterdir():
                    if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and not (tmp / "model" / f.name).exists():
                        shutil.copy2(f, tmp / "model" / f.name)
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            rng = {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            }
            torch.save(rng, tmp / "rng.pt")
            state = {
                "format": CHECKPOINT_FORMAT,
                "optimizer_steps": self._optimizer_steps,
                "version": self._version,
                "config": to_dict(self.config),
                "source_model_path": str(self.model_path),
                "saved_at": time.time(),
            }
            (tmp / _STATE_FILE).write_text(json.dumps(state, indent=2))
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

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores model weights, optimizer state, RNG states, ``optimizer_steps`` and ``version`` from a
        directory written by :meth:`save_checkpoint`. If ``path`` is missing because a crash hit between the two
        renames of a replacing save, the moved-aside copy (``.name.old-*``) is used. Returns the saved state
        (``optimizer_steps``, ``version``, ``config`` as a dict, ...). Raises ``FileNotFoundError`` /
        ``ValueError`` for a missing or incompatible checkpoint."""
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / _STATE_FILE).exists():
            aside = sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.is_dir() else []
            aside = [d for d in aside if (d / _STATE_FILE).exists()]
            if not aside:
                raise FileNotFoundError(f"no complete checkpoint at {path} ({_STATE_FILE} missing)")
            path = aside[-1]
        state = json.loads((path / _STATE_FILE).read_text())
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: checkpoint format {state.get('format')} != {CHECKPOINT_FORMAT}")
        files = sorted((path / "model").glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path / 'model'}: no *.safetensors weights")
        sd: dict[str, Tensor] = {}
        for f in files:
            sd.update(load_file(str(f)))
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        if unexpected:
            raise ValueError(f"{path}: weights not in the model: {sorted(unexpected)[:5]}")
        loaded_ptrs = {self.model.state_dict()[k].data_ptr() for k in sd}
        really_missing = [k for k in missing if self.model.state_dict()[k].data_ptr() not in loaded_ptrs]
        if really_missing:  # tied weights (lm_head <- embed_tokens) are legitimately absent from the file
            raise ValueError(f"{path}: checkpoint lacks weights {really_missing[:5]}")
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True))
        rng = torch.load(path / "rng.pt", weights_only=False)  # our own file: holds numpy/python state objects
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self._optimizer_steps = int(state["optimizer_steps"])
        self._version = int(state["version"])
        return state
