"""Each loss's value and gradient against numbers worked out by hand (comments show the arithmetic).

Common example: B = 2 sequences, T = 3 positions, the last position of each row is padding (mask 0) and holds
garbage that must not matter. Row 0 has advantage +1, row 1 advantage -1. Token ratios ``r = pi_theta/pi_old``:
row 0: [1.5, 0.5], row 1: [0.5, 1.5]; with eps = 0.2 the clip band is [0.8, 1.2].
"""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config import ConfigError, from_dict
from agentrl.trainer.config import LossConfig, TrainerConfig
from agentrl.trainer.losses import (
    aggregate,
    cispo_loss,
    decoupled_ppo_loss,
    gspo_loss,
    kl_per_token,
    log_ratio_at_level,
    policy_loss,
    ppo_clip_loss,
    tis_loss,
    topr_loss,
)

L = math.log
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])


def _logp(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def _ratio_example() -> tuple[torch.Tensor, torch.Tensor]:
    """old = 0 everywhere on real tokens, so logp = log r. Padding: logp 5, old -7 (r = e^12, garbage)."""
    logp = _logp([[L(1.5), L(0.5), 5.0], [L(0.5), L(1.5), 5.0]])
    old = torch.tensor([[0.0, 0.0, -7.0], [0.0, 0.0, -7.0]], dtype=torch.float64)
    return logp, old


def _close(t: torch.Tensor, expected: list[list[float]] | float, tol: float = 1e-9) -> None:
    exp = torch.tensor(expected, dtype=torch.float64)
    assert torch.allclose(t.detach().to(torch.float64), exp, atol=tol, rtol=0), (t, exp)


def test_aggregations_by_hand() -> None:
    per = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # token mean: (1 + 2 + 4) / 3
    _close(aggregate(per, mask, "token_mean"), 7 / 3, 1e-6)
    # seq mean of token sums: ((1 + 2) + 4) / 2
    _close(aggregate(per, mask, "seq_mean_token_sum"), 3.5, 1e-6)
    # seq mean of token means: (1.5 + 4) / 2
    _close(aggregate(per, mask, "seq_mean_token_mean"), 2.75, 1e-6)
    # whole-batch normalisers given by a micro-batching caller
    _close(aggregate(per, mask, "token_mean", num_tokens=10), 0.7, 1e-6)
    _close(aggregate(per, mask, "seq_mean_token_sum", num_seqs=7), 1.0, 1e-6)


def test_ppo_clip_value_and_grad() -> None:
    logp, old = _ratio_example()
    loss, m = ppo_clip_loss(logp, old, ADV, MASK, eps_low=0.2, eps_high=0.2)
    # row0 A=+1: r=1.5 -> min(1.5, 1.2) = 1.2 (clipped, grad 0); r=0.5 -> min(0.5, 0.8) = 0.5 (grad of -r is -r)
    # row1 A=-1: r=0.5 -> min(-0.5, -0.8) = -0.8 (clipped); r=1.5 -> min(-1.5, -1.2) = -1.5 (grad of r is r)
    # losses: [-1.2, -0.5, 0.8, 1.5], mean over 4 tokens = 0.6 / 4
    _close(loss, 0.15)
    loss.backward()
    _close(logp.grad, [[0.0, -0.5 / 4, 0.0], [0.0, 1.5 / 4, 0.0]])
    assert m["ratio/clip_frac"] == pytest.approx(0.5)
    assert m["ratio/mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 1.5) / 4)


def test_ppo_clip_asymmetric_band_and_seq_sum() -> None:
    logp, old = _ratio_example()
    # eps_low 0.6 -> band [0.4, 1.2]: row1 r=0.5 is now inside, min(-0.5, -0.5) = -0.5 with grad of r = 0.5
    loss, _ = ppo_clip_loss(logp, old, ADV, MASK, eps_low=0.6, eps_high=0.2, aggregation="seq_mean_token_sum")
    # sequence sums: row0 -1.2 - 0.5 = -1.7, row1 0.5 + 1.5 = 2.0; mean over 2 sequences = 0.15
    _close(loss, 0.15)
    loss.backward()
    # row0 token1 unclipped -> -0.5 / 2; row1 both unclipped -> r / 2 = 0.25, 0.75
    _close(logp.grad, [[0.0, -0.25, 0.0], [0.25, 0.75, 0.0]])


def _prox_behav() -> tuple[torch.Tensor, torch.Tensor]:
    """prox = 0 (so r as in the common example); behav so that pi_prox/mu = [3, 0.5] and [1, 1.5]."""
    prox = torch.tensor([[0.0, 0.0, -7.0], [0.0, 0.0, -7.0]], dtype=torch.float64)
    behav = torch.tensor([[-L(3.0), -L(0.5), 9.0], [0.0, -L(1.5), 9.0]], dtype=torch.float64)
    return prox, behav


def test_decoupled_ppo_token_level() -> None:
    logp, _ = _ratio_example()
    prox, behav = _prox_behav()
    loss, m = decoupled_ppo_loss(logp, prox, behav, ADV, MASK, eps_low=0.2, eps_high=0.2, is_cap=2.0)
    # w = min([3, 0.5, 1, 1.5], 2) = [2, 0.5, 1, 1.5]; PPO terms [-1.2, -0.5, 0.8, 1.5]
    # w * term = [-2.4, -0.25, 0.8, 2.25]; sum 0.4; / 4 tokens = 0.1
    _close(loss, 0.1)
    loss.backward()
    # grads: PPO grads [0, -0.5, 0, 1.5] times w, / 4
    _close(logp.grad, [[0.0, -0.25 / 4, 0.0], [0.0, 2.25 / 4, 0.0]])
    assert m["is/truncated_frac"] == pytest.approx(0.25)  # only the 3
    assert m["is/weight_mean"] == pytest.approx((3 + 0.5 + 1 + 1.5) / 4)  # raw weights
    assert m["is/weight_max"] == pytest.approx(3.0)


def test_decoupled_ppo_sequence_and_geometric_levels() -> None:
    prox, behav = _prox_behav()
    # sequence level: row0 w = min(3 * 0.5, 2) = 1.5; row1 w = min(1 * 1.5, 2) = 1.5 -> 1.5 * 0.6 / 4
    logp, _ = _ratio_example()
    loss, m = decoupled_ppo_loss(logp, prox, behav, ADV, MASK, is_cap=2.0, is_level="sequence")
    _close(loss, 1.5 * 0.6 / 4)
    assert m["is/truncated_frac"] == 0.0
    # geometric: row0 w = sqrt(3 * 0.5), row1 w = sqrt(1 * 1.5): both sqrt(1.5)
    logp, _ = _ratio_example()
    loss, _ = decoupled_ppo_loss(logp, prox, behav, ADV, MASK, is_cap=2.0, is_level="geometric")
    _close(loss, math.sqrt(1.5) * 0.6 / 4)
    loss.backward()
    _close(logp.grad, [[0.0, -0.5 * math.sqrt(1.5) / 4, 0.0], [0.0, 1.5 * math.sqrt(1.5) / 4, 0.0]])
    # sequence level with a cap that binds on row 0: cap 1.2 -> both rows 1.2
    logp, _ = _ratio_example()
    loss, m = decoupled_ppo_loss(logp, prox, behav, ADV, MASK, is_cap=1.2, is_level="sequence")
    _close(loss, 1.2 * 0.6 / 4)
    assert m["is/truncated_frac"] == pytest.approx(1.0)


def test_tis_value_and_grad() -> None:
    logp, _ = _ratio_example()
    prox, behav = _prox_behav()
    loss, m = tis_loss(logp, prox, behav, ADV, MASK, is_cap=2.0)
    # -w * r * A: row0 (A=1): -2*1.5 = -3, -0.5*0.5 = -0.25; row1 (A=-1): 1*0.5 = 0.5, 1.5*1.5 = 2.25
    # sum -0.5, / 4 = -0.125; d(r)/dlogp = r, so the gradient equals the per-token loss / 4
    _close(loss, -0.125)
    loss.backward()
    _close(logp.grad, [[-3 / 4, -0.25 / 4, 0.0], [0.5 / 4, 2.25 / 4, 0.0]])
    assert m["is/truncated_frac"] == pytest.approx(0.25)


def test_decoupled_ppo_equals_tis_at_a_batch_first_optimizer_step() -> None:
    """With one optimizer step per batch (``ppo_epochs: 1``, ``num_mini_batches: 1``, the quickstart's) the
    proximal policy is the policy being differentiated (r = 1), so the clip around it cannot bind and decoupled PPO's
    gradient is TIS's; only later mini-batches (r != 1) tell them apart. benchmarks/RESULTS-offpolicy.md relies on
    this to read its decoupled PPO and TIS rows."""
    prox, behav = _prox_behav()
    grads = {}
    for name, fn in (("decoupled", decoupled_ppo_loss), ("tis", tis_loss)):
        logp = prox.clone().requires_grad_(True)  # r = 1: the first step on a batch
        fn(logp, prox, behav, ADV, MASK, is_cap=2.0)[0].backward()
        grads[name] = logp.grad
    assert torch.equal(grads["decoupled"], grads["tis"]) and grads["tis"].abs().sum() > 0
    grads = {}
    for name, fn in (("decoupled", decoupled_ppo_loss), ("tis", tis_loss)):
        logp, _ = _ratio_example()  # r = 1.5 / 0.5: a later mini-batch, where the clip binds
        fn(logp, prox, behav, ADV, MASK, is_cap=2.0)[0].backward()
        grads[name] = logp.grad
    assert not torch.allclose(grads["decoupled"], grads["tis"])


def test_cispo_value_and_grad() -> None:
    logp = _logp([[-1.0, -2.0, 3.0], [-0.5, -3.0, 3.0]])
    # behav chosen so that pi_theta/mu = [1.5, 0.5] and [1.0, 1.1]
    behav = torch.tensor([[-1.0 - L(1.5), -2.0 - L(0.5), 0.0], [-0.5, -3.0 - L(1.1), 0.0]], dtype=torch.float64)
    loss, m = cispo_loss(logp, behav, ADV, MASK, eps_low=0.2, eps_high=0.2)
    # w = clip(ratio, 0.8, 1.2) = [1.2, 0.8, 1.0, 1.1]; per = -w * A * logp
    # row0 (A=1): -1.2*-1 = 1.2, -0.8*-2 = 1.6; row1 (A=-1): 1.0*-0.5 = -0.5, 1.1*-3 = -3.3; sum -1.0, / 4
    _close(loss, -0.25)
    loss.backward()
    # grad = -w * A / 4; every token keeps a gradient, even the clipped ones
    _close(logp.grad, [[-1.2 / 4, -0.8 / 4, 0.0], [1.0 / 4, 1.1 / 4, 0.0]])
    assert m["is/truncated_frac"] == pytest.approx(0.5)
    assert m["is/weight_max"] == pytest.approx(1.5)


def test_topr_value_and_grad() -> None:
    logp = _logp([[-1.0, -2.0, 3.0], [-0.5, -3.0, 3.0]])
    # row1's ratios pi_theta/mu = [0.5, 2.0]; row0's ratios must not matter (R >= 0 gets no weight)
    behav = torch.tensor([[5.0, -9.0, 0.0], [-0.5 - L(0.5), -3.0 - L(2.0), 0.0]], dtype=torch.float64)
    reward = torch.tensor([2.0, -1.0])
    loss, m = topr_loss(logp, behav, reward, MASK)
    # row0 R=2: -2 * logp = [2, 4]; row1 R=-1: -clip(ratio, 0, 1) * (-1) * logp = [0.5 * -0.5, 1 * -3]
    # sum 2 + 4 - 0.25 - 3 = 2.75; / 4
    _close(loss, 2.75 / 4)
    loss.backward()
    _close(logp.grad, [[-2 / 4, -2 / 4, 0.0], [0.5 / 4, 1.0 / 4, 0.0]])
    assert m["is/truncated_frac"] == pytest.approx(0.5)  # of row1's two tokens, the 2.0 was capped
    assert m["topr/neg_frac"] == pytest.approx(0.5)


def test_gspo_value_and_grad() -> None:
    # row0 token ratios [1.5, 0.5] -> s0 = sqrt(0.75), inside [0.8, 1.2], A=+1: each token -s0
    # row1 ratios [0.5, 0.5] -> s1 = 0.5, A=-1: min(-0.5, -0.8) = -0.8 (clipped): each token 0.8, no grad
    logp = _logp([[L(1.5), L(0.5), 5.0], [L(0.5), L(0.5), 5.0]])
    old = torch.tensor([[0.0, 0.0, -7.0], [0.0, 0.0, -7.0]], dtype=torch.float64)
    loss, m = gspo_loss(logp, old, ADV, MASK, eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_mean")
    s0 = math.sqrt(0.75)
    _close(loss, (-s0 + 0.8) / 2)
    loss.backward()
    # L = (1/2) * (-s0 + 0.8); d s0 / d logp_t = s0 / |y| = s0 / 2 -> dL/dlogp_0t = -s0 / 4
    _close(logp.grad, [[-s0 / 4, -s0 / 4, 0.0], [0.0, 0.0, 0.0]])
    assert m["ratio/clip_frac"] == pytest.approx(0.5)


def test_kl_estimators_by_hand() -> None:
    logp = torch.tensor([L(2.0)], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.0], dtype=torch.float64)
    # d = log 2; k1 = log 2; k2 = (log 2)^2 / 2; k3 = q/p - 1 - log(q/p) = 0.5 - 1 + log 2
    _close(kl_per_token(logp, ref, "k1"), [L(2.0)])
    _close(kl_per_token(logp, ref, "k2"), [L(2.0) ** 2 / 2])
    k3 = kl_per_token(logp, ref, "k3")
    _close(k3, [0.5 - 1 + L(2.0)])
    k3.sum().backward()
    # d/dlogp (e^{-d} - 1 + d) = 1 - e^{-d} = 1 - 0.5
    _close(logp.grad, [0.5])


def test_policy_loss_ppo_with_kl_and_entropy_terms() -> None:
    # r = 1 everywhere (prox = logp), so the PPO term is -A per token with gradient -A
    logp = _logp([[L(0.5), L(0.25), 0.0], [L(0.5), L(0.5), 0.0]])
    prox = logp.detach().clone()
    ref = torch.tensor([[0.0, L(0.25), 0.0], [L(0.5), L(0.25), 0.0]], dtype=torch.float64)
    entropy = torch.tensor([[1.0, 2.0, 50.0], [3.0, 4.0, 50.0]], dtype=torch.float64)
    cfg = LossConfig(name="ppo", kl_coef=0.5, kl_estimator="k3")
    loss, m = policy_loss(cfg, logp=logp, mask=MASK, adv=ADV, prox_logp=prox, ref_logp=ref, entropy=entropy)
    # PPO: [-1, -1, 1, 1] -> mean 0. KL k3 with q/p = ref - logp: tokens [q/p = 2, 1, 1, 0.5]
    # k3 = q/p - 1 - log(q/p): [1 - log 2, 0, 0, -0.5 + log 2] -> sum 0.5, mean 0.125; times 0.5 = 0.0625
    _close(loss, 0.0625)
    assert m["loss/policy"] == pytest.approx(0.0)
    assert m["loss/kl"] == pytest.approx(0.125)
    assert m["entropy"] == pytest.approx(2.5)  # padding's 50 ignored
    loss.backward()
    # PPO grad -A/4; KL grad 0.5 * (1 - q/p) / 4: [0.5*-1, 0, 0, 0.5*0.5] / 4
    _close(logp.grad, [[(-1 - 0.5) / 4, -1 / 4, 0.0], [1 / 4, (1 + 0.25) / 4, 0.0]])


def test_policy_loss_ratio_mask_band() -> None:
    logp, _ = _ratio_example()
    prox, behav = _prox_behav()
    cfg = LossConfig(name="decoupled_ppo", is_cap=2.0, ratio_mask=[0.6, 2.5])
    loss, m = policy_loss(cfg, logp=logp, mask=MASK, adv=ADV, prox_logp=prox, behav_logp=behav)
    # pi_prox/mu = [3, 0.5, 1, 1.5]: 3 and 0.5 leave [0.6, 2.5] -> their terms drop, the normaliser stays 4
    # remaining w * term: 0.8 + 2.25 = 3.05 -> / 4
    _close(loss, 3.05 / 4)
    assert m["is/masked_frac"] == pytest.approx(0.5)
    # KL(mu || pi_prox) estimates over the 4 tokens: d = log(pi_prox/mu) = [log 3, log .5, 0, log 1.5]
    d = [L(3), L(0.5), 0.0, L(1.5)]
    assert m["mismatch/kl_k1"] == pytest.approx(-sum(d) / 4)
    assert m["mismatch/kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 4)
    loss.backward()
    _close(logp.grad, [[0.0, 0.0, 0.0], [0.0, 2.25 / 4, 0.0]])


def test_policy_loss_behavior_ratio_base_and_topr_advantage_signal() -> None:
    logp, _ = _ratio_example()
    behav = torch.zeros(2, 3, dtype=torch.float64)
    cfg = LossConfig(name="ppo", ratio_base="behavior")
    loss, _ = policy_loss(cfg, logp=logp, mask=MASK, adv=ADV, behav_logp=behav)
    _close(loss, 0.15)  # same numbers as test_ppo_clip_value_and_grad, the ratio now taken to mu = 1
    cfg = LossConfig(name="topr", topr_signal="advantage")
    logp = _logp([[-1.0, -2.0, 0.0], [-0.5, -3.0, 0.0]])
    loss, _ = policy_loss(cfg, logp=logp, mask=MASK, adv=ADV, behav_logp=logp.detach().clone())
    # ratio 1 everywhere. row0 (A=+1): -1 * logp = [1, 2]; row1 (A=-1): -clip(1, 0, 1) * (-1) * logp = [-0.5, -3]
    # sum 1 + 2 - 0.5 - 3 = -0.5, / 4
    _close(loss, -0.125)


def test_policy_loss_missing_inputs_are_named() -> None:
    logp, _ = _ratio_example()
    with pytest.raises(ValueError, match="behav_logp"):
        policy_loss(LossConfig(name="decoupled_ppo"), logp=logp, mask=MASK, adv=ADV, prox_logp=logp.detach())
    with pytest.raises(ValueError, match="reward"):
        policy_loss(LossConfig(name="topr"), logp=logp, mask=MASK, adv=ADV, behav_logp=logp.detach())
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(LossConfig(name="ppo", kl_coef=0.1), logp=logp, mask=MASK, adv=ADV, prox_logp=logp.detach())


@pytest.mark.parametrize("name", ["ppo", "decoupled_ppo", "tis", "cispo", "topr", "gspo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_micro_batch_losses_add_up_to_the_batch_loss(name: str, aggregation: str) -> None:
    g = torch.Generator().manual_seed(0)
    B, T = 4, 5
    base = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    prox = base + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    behav = base + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.5, -1.0, 2.0, -0.3], dtype=torch.float64)
    reward = torch.tensor([1.0, -1.0, 0.0, -2.0], dtype=torch.float64)
    cfg = LossConfig(name=name, aggregation=aggregation, ratio_mask=[0.7, 1.4] if name == "tis" else None)

    full_logp = base.clone().requires_grad_(True)
    full, _ = policy_loss(cfg, logp=full_logp, mask=mask, adv=adv, prox_logp=prox, behav_logp=behav, reward=reward)
    full.backward()
    n_tok, n_seq = float(mask.sum()), 4.0
    parts = []
    grads = []
    for rows in ([0, 1], [2, 3]):
        lp = base[rows].clone().requires_grad_(True)
        part, _ = policy_loss(cfg, logp=lp, mask=mask[rows], adv=adv[rows], prox_logp=prox[rows],
                              behav_logp=behav[rows], reward=reward[rows], num_tokens=n_tok, num_seqs=n_seq)
        part.backward()
        parts.append(part.detach())
        grads.append(lp.grad)
    assert torch.allclose(sum(parts), full.detach(), atol=1e-12)
    assert torch.allclose(torch.cat(grads), full_logp.grad, atol=1e-12)


def test_loss_config_typos_and_bad_values_are_errors() -> None:
    with pytest.raises(ConfigError, match="clip_esp"):
        from_dict(TrainerConfig, {"loss": {"clip_esp": 0.2}}, "t.yaml")
    with pytest.raises(ConfigError, match="loss.name"):
        from_dict(TrainerConfig, {"loss": {"name": "ppo2"}}, "t.yaml")
    with pytest.raises(ConfigError, match="ratio_mask"):
        from_dict(TrainerConfig, {"loss": {"ratio_mask": [2.0, 1.0]}}, "t.yaml")
    with pytest.raises(ConfigError, match="is_cap"):
        from_dict(TrainerConfig, {"loss": {"is_cap": 0}}, "t.yaml")
    with pytest.raises(ConfigError, match="micro_batch_size"):
        from_dict(TrainerConfig, {"micro_batch_size": 0}, "t.yaml")
    with pytest.raises(ConfigError, match="optimizer.lr"):
        from_dict(TrainerConfig, {"optimizer": {"lr": "fast"}}, "t.yaml")
    cfg = from_dict(
        TrainerConfig,
        {"loss": {"name": "cispo", "eps_low": 1.0, "eps_high": 0.28, "is_level": "geometric"},
         "advantage": {"estimator": "rloo"}, "optimizer": {"betas": [0.9, 0.95]}, "micro_batch_tokens": 4096},
        "t.yaml",
    )
    assert cfg.loss.clip_low == 1.0 and cfg.loss.clip_high == 0.28
    assert cfg.optimizer.betas == (0.9, 0.95)
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainerConfig(micro_batch_size=-1).validate()


def test_gspo_defaults_follow_the_paper_unless_set() -> None:
    # issue 12 #4: GSPO used token-mean aggregation and clip 0.2, so a long sequence weighed more and the clip
    # never bound on the length-normalised ratio
    cfg = from_dict(TrainerConfig, {"loss": {"name": "gspo"}}, "t.yaml").loss
    assert (cfg.clip_low, cfg.clip_high, cfg.effective_aggregation) == (3e-4, 4e-4, "seq_mean_token_mean")
    assert cfg.clip_eps is None and cfg.aggregation is None  # "unset" stays visible
    user = LossConfig(name="gspo", clip_eps=0.2, aggregation="token_mean")
    assert (user.clip_low, user.clip_high, user.effective_aggregation) == (0.2, 0.2, "token_mean")
    assert LossConfig(name="gspo", eps_high=1e-3).clip_high == 1e-3
    ppo = LossConfig(name="ppo")
    assert (ppo.clip_low, ppo.clip_high, ppo.effective_aggregation) == (0.2, 0.2, "token_mean")
    # row0: 1 token with ratio 1.001 (outside [1 - 3e-4, 1 + 4e-4]) and A = +1 -> clipped, no gradient;
    # row1: 3 tokens with ratio 1 and A = -1 -> -(-1) = 1 each. Sequence mean: (-(1 + 4e-4) + 1) / 2
    logp = _logp([[L(1.001), 0.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss, m = policy_loss(LossConfig(name="gspo"), logp=logp, mask=mask, adv=ADV, prox_logp=old)
    _close(loss, (-(1 + 4e-4) + 1.0) / 2)
    loss.backward()
    _close(logp.grad[0], [0.0, 0.0, 0.0])
    assert m["ratio/clip_frac"] == pytest.approx(0.25)


def test_k3_kl_stays_finite_for_extreme_log_ratios() -> None:
    # issue 12 #6: k3(-95, -1) = e^94 - 1 - 94 overflowed float32 to inf and skipped the batch
    logp = torch.tensor([-95.0, -1.0, -30.0], requires_grad=True)
    ref = torch.tensor([-1.0, -95.0, -1.0])
    k3 = kl_per_token(logp, ref, "k3")
    assert torch.isfinite(k3).all() and (k3 >= 0).all() and float(k3.detach().max()) <= 10.0
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()
    cfg = LossConfig(name="ppo", kl_coef=0.1, kl_estimator="k3")
    lp = torch.tensor([[-95.0, -2.0]], requires_grad=True)
    loss, _ = policy_loss(cfg, logp=lp, mask=torch.ones(1, 2), adv=torch.tensor([1.0]), prox_logp=lp.detach(),
                          ref_logp=torch.tensor([[-1.0, -2.0]]))
    assert torch.isfinite(loss)


def test_sequence_terms_are_per_trajectory_when_rows_are_its_segments() -> None:
    """Rows 0-2 are the three segments of trajectory A (1, 2 and 1 loss tokens), row 3 is trajectory B (2 loss
    tokens); ``seq_index`` says so. Every sequence-level term is taken over A's 4 tokens, and there are 2 sequences,
    not 4."""
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    seq_index = torch.tensor([0, 0, 0, 1])
    per = torch.tensor([[1.0, 9.0], [2.0, 3.0], [4.0, 9.0], [5.0, 7.0]])  # 9.0: masked out
    # A: sum 1+2+3+4 = 10 over 4 tokens (mean 2.5); B: sum 12 over 2 tokens (mean 6)
    assert float(aggregate(per, mask, "seq_mean_token_mean", seq_index=seq_index)) == pytest.approx((2.5 + 6) / 2)
    assert float(aggregate(per, mask, "seq_mean_token_sum", seq_index=seq_index)) == pytest.approx((10 + 12) / 2)
    # without seq_index each segment is a sequence: (1 + 2.5 + 4 + 6) / 4
    assert float(aggregate(per, mask, "seq_mean_token_mean")) == pytest.approx(13.5 / 4)
    # log-ratios: A's tokens 0.1, 0.2, 0.3, 0.4 (sum 1.0, mean 0.25); B's 0.5, 0.7 (sum 1.2, mean 0.6)
    d = torch.tensor([[0.1, 0.0], [0.2, 0.3], [0.4, 0.0], [0.5, 0.7]], dtype=torch.float64)
    zero = torch.zeros_like(d)
    seq = log_ratio_at_level(d, zero, mask, "sequence", seq_index)
    geo = log_ratio_at_level(d, zero, mask, "geometric", seq_index)
    assert torch.allclose(seq[:, 0], torch.tensor([1.0, 1.0, 1.0, 1.2], dtype=torch.float64))
    assert torch.allclose(geo[:, 0], torch.tensor([0.25, 0.25, 0.25, 0.6], dtype=torch.float64))
    # GSPO at ratio 1 (logp == old): each trajectory contributes -A once, whatever its number of segments
    logp = torch.zeros(4, 2, dtype=torch.float64, requires_grad=True)
    loss, _ = gspo_loss(logp, torch.zeros(4, 2, dtype=torch.float64), torch.tensor([2.0, 2.0, 2.0, -1.0]), mask,
                        seq_index=seq_index)
    assert float(loss) == pytest.approx(-(2.0 - 1.0) / 2)
    loss.backward()
    # d/dlogp_t of -A * exp(mean_t logp) / 2 = -A / (2 * tokens of the trajectory): A: -2/8, B: 1/4
    assert torch.allclose(logp.grad * mask, torch.tensor([[-0.25, 0], [-0.25, -0.25], [-0.25, 0], [0.25, 0.25]],
                                                         dtype=torch.float64))
