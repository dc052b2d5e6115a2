"""Typed trainer configuration: optimizer, batching, precision, policy loss and advantage estimator.

Every hyper-parameter is a declared, typed dataclass field. Built through :func:`agentrl.config.from_dict` /
:func:`agentrl.config.load`, an unknown key (a typo), a wrong type or a value outside a ``Literal`` raises
:class:`agentrl.config.ConfigError` naming the key path; each ``validate()`` adds the cross-field checks and raises
``ValueError``. :class:`agentrl.trainer.Trainer` calls :meth:`TrainerConfig.validate` again, so a config built in
Python without the loader is checked too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

LossName = Literal["ppo", "decoupled_ppo", "tis", "cispo", "topr", "gspo"]
ISLevel = Literal["token", "sequence", "geometric"]
Aggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
KLEstimator = Literal["k1", "k2", "k3"]
AdvantageEstimator = Literal["grpo", "grpo_no_std", "rloo", "turn_return", "gigpo"]
# Estimators that return one advantage per turn (agentrl/trainer/turn_credit.py) rather than per trajectory.
TURN_ESTIMATORS: frozenset[str] = frozenset({"turn_return", "gigpo"})

# Losses whose importance weight / ratio involves the engine's behavior log-probs.
LOSSES_USING_BEHAVIOR: frozenset[str] = frozenset({"decoupled_ppo", "tis", "cispo", "topr"})

# Defaults that depend on the loss when the user leaves the key unset (null). GSPO's are the paper's (Zheng et al.
# 2025): a sequence-level objective (the mean over sequences) and a clip range of 3e-4 / 4e-4 on the length-normalised
# sequence ratio; a token-level 0.2 would never bind on a geometric-mean ratio.
DEFAULT_CLIP_EPS = 0.2
GSPO_CLIP_LOW, GSPO_CLIP_HIGH = 3e-4, 4e-4


@dataclass
class OptimizerConfig:
    """AdamW. ``lr`` ramps linearly from ``lr / warmup_steps`` to ``lr`` over the first ``warmup_steps`` optimizer
    steps, then stays constant."""

    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0

    def validate(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"optimizer.lr must be a positive finite number, got {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optimizer.betas must be two numbers in [0, 1), got {self.betas}")
        if self.eps <= 0:
            raise ValueError(f"optimizer.eps must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay must be >= 0, got {self.weight_decay}")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")


@dataclass
class LossConfig:
    """The policy loss (see ``agentrl/trainer/losses.py`` for the formulas).

    - ``name``: ``ppo`` (PPO-clip, ratio to ``ratio_base``), ``decoupled_ppo`` (AReaL: ratio to the proximal policy,
      times the truncated IS weight ``min(pi_prox/mu, C)``), ``tis`` (plain policy gradient times
      ``min(pi_prox/mu, C)``), ``cispo``, ``topr``, ``gspo``.
    - ``clip_eps``: PPO/GSPO/CISPO clip range; ``eps_low`` / ``eps_high`` override its lower / upper side
      (``clip(r, 1 - eps_low, 1 + eps_high)``). Unset (null, the default): 0.2, except GSPO, whose sides default
      to the paper's 3e-4 / 4e-4 (:attr:`clip_low` / :attr:`clip_high` give the values in force).
    - ``is_cap``: truncation cap C of the IS weight (decoupled_ppo, tis).
    - ``is_level``: importance weights per token, per sequence (product over the sequence's loss tokens) or as the
      geometric mean over the sequence (length-normalised). Applies to the behavior-correction weight of
      decoupled_ppo / tis and to the ratio ``pi_theta/mu`` of cispo / topr; ppo and gspo have no behavior weight.
    - ``ratio_base``: the "old" policy of ppo/gspo ratios: ``proximal`` (the trainer's log-probs at step start, as
      in synchronous PPO) or ``behavior`` (the engine's log-probs: "naive" PPO under staleness).
    - ``ratio_mask``: optional ``[low, high]`` band on the behavior ratio ``pi_prox/mu`` (at ``is_level``); tokens
      (or whole sequences) outside the band contribute no loss. The normaliser is unchanged.
    - ``aggregation``: over the whole optimizer batch: mean over all loss tokens, mean over sequences of the
      per-sequence token sum, or mean over sequences of the per-sequence token mean. Unset (null, the default):
      ``token_mean``, except GSPO: ``seq_mean_token_mean`` (the paper's sequence mean, so a long sequence does not
      weigh more than a short one). :attr:`effective_aggregation` gives the value in force.
    - ``kl_coef`` > 0 adds ``kl_coef * KL(pi_theta || pi_ref)`` (estimator ``kl_estimator`` per token) to a frozen
      reference model loaded from the starting weights.
    - ``entropy_coef`` > 0 subtracts ``entropy_coef * entropy`` (an exploration bonus).
    - ``topr_signal``: TOPR's sign split uses the trajectory ``reward`` (the paper's form) or the ``advantage``.
    """

    name: LossName = "decoupled_ppo"
    clip_eps: float | None = None
    eps_low: float | None = None
    eps_high: float | None = None
    is_cap: float = 2.0
    is_level: ISLevel = "token"
    ratio_base: Literal["proximal", "behavior"] = "proximal"
    ratio_mask: list[float] | None = None
    aggregation: Aggregation | None = None
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    topr_signal: Literal["reward", "advantage"] = "reward"

    @property
    def clip_low(self) -> float:
        """The lower clip range in force: ``eps_low``, else ``clip_eps``, else the loss's default."""
        if self.eps_low is not None:
            return self.eps_low
        if self.clip_eps is not None:
            return self.clip_eps
        return GSPO_CLIP_LOW if self.name == "gspo" else DEFAULT_CLIP_EPS

    @property
    def clip_high(self) -> float:
        """The upper clip range in force: ``eps_high``, else ``clip_eps``, else the loss's default."""
        if self.eps_high is not None:
            return self.eps_high
        if self.clip_eps is not None:
            return self.clip_eps
        return GSPO_CLIP_HIGH if self.name == "gspo" else DEFAULT_CLIP_EPS

    @property
    def effective_aggregation(self) -> str:
        """The aggregation in force: ``aggregation``, else the loss's default (GSPO: ``seq_mean_token_mean``)."""
        if self.aggregation is not None:
            return self.aggregation
        return "seq_mean_token_mean" if self.name == "gspo" else "token_mean"

    def validate(self) -> None:
        if self.clip_eps is not None and not self.clip_eps > 0:
            raise ValueError(f"loss.clip_eps must be > 0 or null, got {self.clip_eps}")
        for name in ("eps_low", "eps_high"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ValueError(f"loss.{name} must be >= 0, got {v}")
        if not self.is_cap > 0:
            raise ValueError(f"loss.is_cap must be > 0, got {self.is_cap}")
        if self.ratio_mask is not None:
            band = self.ratio_mask
            if len(band) != 2 or not (0 <= band[0] < band[1]):
                raise ValueError(f"loss.ratio_mask must be [low, high] with 0 <= low < high, got {band}")
        if self.kl_coef < 0:
            raise ValueError(f"loss.kl_coef must be >= 0, got {self.kl_coef}")
        if self.entropy_coef < 0:
            raise ValueError(f"loss.entropy_coef must be >= 0, got {self.entropy_coef}")

    @property
    def needs_proximal(self) -> bool:
        """True when the loss itself reads the trainer's step-start log-probs (not only for metrics)."""
        if self.name in ("decoupled_ppo", "tis") or self.ratio_mask is not None:
            return True
        return self.name in ("ppo", "gspo") and self.ratio_base == "proximal"


@dataclass
class AdvantageConfig:
    """Group-relative advantages (formulas, and the bias argument for the turn-level ones, in
    ``agentrl/trainer/advantages.py`` and ``agentrl/trainer/turn_credit.py``).

    Per trajectory, from its final ``reward``: ``grpo``: ``(R_i - mean_g R) / (std_g R + eps)``; ``grpo_no_std``:
    ``R_i - mean_g R``; ``rloo``: ``R_i - mean_{j != i} R_j``. Per turn, from the per-step rewards:
    ``turn_return`` (discounted return-to-go minus a leave-one-out baseline at the same turn index over all members)
    and ``gigpo`` (episode-level GRPO plus ``step_weight`` times a GRPO over the turns taken from the same env
    state). ``std_unbiased`` picks the sample (n-1) or population (n) standard deviation; ``gamma`` in [0, 1] is
    the discount of the turn-level returns; ``step_weight`` >= 0 is GiGPO's weight of the step-level term.
    """

    estimator: AdvantageEstimator = "grpo"
    eps: float = 1e-6
    std_unbiased: bool = True
    gamma: float = 1.0
    step_weight: float = 1.0

    def validate(self) -> None:
        if not self.eps >= 0:
            raise ValueError(f"advantage.eps must be >= 0, got {self.eps}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"advantage.gamma must be in [0, 1], got {self.gamma}")
        if not (self.step_weight >= 0 and math.isfinite(self.step_weight)):
            raise ValueError(f"advantage.step_weight must be a finite number >= 0, got {self.step_weight}")


# The linear layers vLLM can serve a LoRA adapter on in every decoder it supports (Qwen2/Llama naming).
LORA_DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Layers the engine would not apply an adapter to exactly: the embedding is tied to the output head in the small
# models this project trains, and vLLM 0.32 serves adapters on linear layers only.
LORA_REFUSED_TARGETS = frozenset({"embed_tokens", "lm_head"})


@dataclass
class LoraConfig:
    """LoRA adapters (``trainer.lora``; off when the section is absent): the trainer wraps the model with PEFT,
    freezes every base weight and trains only the adapters' ``A``/``B`` matrices in every loss; the engines serve the
    adapter through vLLM's LoRA support and weight syncs carry only the adapter (:mod:`agentrl.trainer.lora`)."""

    rank: int = 16
    """``r``: the adapters' rank (>= 1); the engine reserves vLLM's next allowed rank at or above it."""
    alpha: float = 32.0
    """``lora_alpha``: the adapter's output is scaled by ``alpha / rank``."""
    dropout: float = 0.0
    """``lora_dropout`` in [0, 1) on the adapter's input during training passes (0: the training forward is
    deterministic, so the proximal pass can be reused)."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_DEFAULT_TARGETS))
    """Names (suffixes) of the linear layers that get an adapter; ``embed_tokens`` / ``lm_head`` are refused."""

    def validate(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora.rank must be >= 1, got {self.rank}")
        if self.rank > 512:
            raise ValueError(f"lora.rank must be <= 512 (vLLM's largest servable rank), got {self.rank}")
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise ValueError(f"lora.alpha must be a positive finite number, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(f"lora.target_modules must be a non-empty list of module names, got {self.target_modules}")
        bad = sorted(set(self.target_modules) & LORA_REFUSED_TARGETS)
        if bad:
            raise ValueError(f"lora.target_modules: {bad} cannot be served exactly (vLLM applies adapters to the "
                             "linear layers only, and the tiny models tie embed_tokens to lm_head); use "
                             f"{LORA_DEFAULT_TARGETS}")


@dataclass
class TrainerConfig:
    """Everything the :class:`~agentrl.trainer.Trainer` needs besides the model path.

    Batching: one :meth:`Trainer.train_step` call consumes a batch of trajectories, splits it into
    ``num_mini_batches`` consecutive mini-batches of trajectories (one optimizer step each) and repeats that
    ``ppo_epochs`` times. Each mini-batch is split into micro-batches for gradient accumulation: sequences sorted by
    length, at most ``micro_batch_size`` sequences and, when ``micro_batch_tokens`` is set, at most that many tokens
    (padded layout: ``sequences x longest length``; packed layout: the sum of lengths; a single longer sequence, or
    the segments of one segmented trajectory, still form one micro-batch). The loss is normalised over the whole
    mini-batch, so the gradient does not depend on the micro-batch split. ``packing: true`` concatenates a
    micro-batch's sequences into one row whose position ids restart per sequence (transformers then builds the
    block-diagonal causal mask); ``false`` right-pads them, with no 2-D attention mask since causal attention is
    already exact for right padding.

    Precision: parameters and optimizer state are always float32 (master weights: a bf16 AdamW step at a small
    learning rate rounds most updates away). ``dtype`` is the compute precision: ``bfloat16`` runs forward and
    backward passes under ``torch.autocast`` in bfloat16 (``mixed_precision: bf16`` is the older spelling of the
    same thing); log-softmax and its accumulations are always float32. The frozen reference model (``kl_coef > 0``)
    is stored in the compute dtype, since no optimizer steps it.

    Log-probs (``logprob_impl``) are computed from the last hidden states in chunks of tokens, never as a full
    ``[tokens, vocabulary]`` tensor: ``torch`` (our chunked projection + log-softmax + gather with a recomputing
    backward), ``liger`` (Liger-Kernel's fused linear cross-entropy, Triton; GPU only), ``auto`` (``liger`` on CUDA
    when it is installed and no gradient of the entropy is needed, else ``torch``), or ``full`` (the model's own
    full logits: the reference path, and the fallback for heads that are not a plain linear layer, e.g. softcapped
    logits, which the trainer detects at start).

    Speed: ``compile_layers`` wraps each decoder layer in ``torch.compile`` (GPU; fuses the small ops);
    ``gradient_checkpointing`` recomputes activations of every ``checkpoint_every``-th decoder layer (1: all).

    ``temperature`` divides the logits before the log-softmax in every log-prob path so that trainer log-probs are
    those of the distribution the engine sampled from. ``max_seq_len`` truncates longer trajectories (tail dropped,
    counted in the ``batch/truncated_seqs`` metric). ``record_logprobs``: how many trajectories per step the
    trainer keeps its log-probs of (:meth:`Trainer.take_logprob_records`).

    Data parallelism: ``world_size: N`` runs N trainer ranks (Ray actors joined by ``torch.distributed``; see
    :mod:`agentrl.trainer.dp_group`); each step's batch (each of its mini-batches) is split between them by loss-token
    count and the update equals one rank's on the whole batch. ``sharding``: ``replicate`` (whole model on every
    rank, gradients all-reduced), ``fsdp`` (FSDP2 shards, bf16/fp32 compute over fp32 master shards), or ``auto``
    (``fsdp`` on CUDA, ``replicate`` on CPU). ``micro_batch_size`` and ``micro_batch_tokens`` are per rank.
    """

    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    micro_batch_size: int = 8
    micro_batch_tokens: int | None = None
    packing: bool = False
    prefix_tree: bool = False
    """Lay each micro-batch out as a prefix tree (:mod:`agentrl.trainer.prefix_tree`): a token prefix that several
    of its sequences share (a group's prompt, the history every split-mode segment repeats, a forked session) is
    computed once, with a tree attention mask and depth position ids; log-probs and gradients equal the flat
    layout's. Overrides ``packing``; micro-batches then hold trajectories in the order of their token ids (those that
    share a prefix side by side) and ``micro_batch_tokens`` counts the distinct prefixes they compute. Attention:
    on the CPU ``sdpa`` or ``eager`` with a dense 4-D mask (``U * U`` bytes for ``U`` distinct prefixes per
    micro-batch); on CUDA the models load with ``flex_attention`` and a block mask built from the tree. With
    ``world_size > 1`` the ranks shard by tree (trajectories sharing a prefix on one rank, balanced by the tokens
    the trees compute), replicated or FSDP. Metrics: ``batch/tree_tokens`` (tokens the training forwards
    computed), ``batch/flat_tokens`` (tokens the flat layout computes for the same passes), ``batch/tree_ratio``."""
    num_mini_batches: int = 1
    ppo_epochs: int = 1
    max_grad_norm: float | None = 1.0
    dtype: Literal["float32", "bfloat16"] = "float32"
    mixed_precision: Literal["none", "bf16"] = "none"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    logprob_impl: Literal["auto", "torch", "liger", "full"] = "auto"
    temperature: float = 1.0
    max_seq_len: int | None = None
    gradient_checkpointing: bool = False
    checkpoint_every: int = 1
    compile_layers: bool = False
    disable_dropout: bool = True
    compute_entropy: bool = True
    log_mismatch_metrics: bool = True
    seed: int = 0
    world_size: int = 1
    sharding: Literal["auto", "replicate", "fsdp"] = "auto"
    record_logprobs: int = 0  # per train_step, trajectories whose trainer log-probs are kept (agentrl.trainer.records)
    lora: LoraConfig | None = None
    """LoRA adapters instead of full fine-tuning (:class:`LoraConfig`); ``null`` (default): every weight trains."""

    @property
    def compute_dtype(self) -> str:
        """``bfloat16`` when forward/backward passes run under bf16 autocast, else ``float32``."""
        return "bfloat16" if self.dtype == "bfloat16" or self.mixed_precision == "bf16" else "float32"

    def validate(self) -> None:
        self.optimizer.validate()
        self.loss.validate()
        self.advantage.validate()
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1 or null, got {self.micro_batch_tokens}")
        if self.num_mini_batches < 1:
            raise ValueError(f"num_mini_batches must be >= 1, got {self.num_mini_batches}")
        if self.ppo_epochs < 1:
            raise ValueError(f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or null, got {self.max_grad_norm}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a positive finite number, got {self.temperature}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2 or null, got {self.max_seq_len}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1 (1 = every decoder layer), got {self.checkpoint_every}")
        if self.record_logprobs < 0:
            raise ValueError(f"record_logprobs must be >= 0, got {self.record_logprobs}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.lora is not None:
            self.lora.validate()
            if self.sharding == "fsdp":
                # FSDP2 would shard the frozen base and the adapters alike, and the adapter-only state dicts the
                # engine and checkpoints read are not gathered from shards: not exact, so not offered.
                raise ValueError("trainer.lora with trainer.sharding: fsdp is not supported; use trainer.sharding: "
                                 "replicate (only the adapters' gradients are all-reduced)")
