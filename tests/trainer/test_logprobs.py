"""Chunked log-probs against the full-logits reference: values, gradients (log-prob and entropy terms), temperature,
chunk boundaries, bf16 compute, Liger's kernel (under Triton's CPU interpreter), and the trainer's layouts (padded,
packed, micro-batch splits) giving the same log-probs and gradients."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from agentrl.trainer import logprobs as LP
from agentrl.trainer.config import LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.trainer import Trainer
from agentrl.trajectory import Trajectory


def _reference(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    logsm = torch.log_softmax((h @ w.t()) / temp, dim=-1)
    return logsm.gather(-1, t[:, None]).squeeze(-1), -(logsm.exp() * logsm).sum(-1)


@pytest.mark.parametrize("temp", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_chunked_logprobs_and_gradients_equal_the_full_computation(temp: float, chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    N, H, V = 11, 8, 13
    h0 = torch.randn(N, H, generator=g, dtype=torch.float64)
    w0 = torch.randn(V, H, generator=g, dtype=torch.float64)
    t = torch.randint(0, V, (N,), generator=g)
    g_lp = torch.randn(N, generator=g, dtype=torch.float64)
    g_ent = torch.randn(N, generator=g, dtype=torch.float64)

    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    lp1, ent1 = _reference(h1, w1, t, temp)
    ((lp1 * g_lp).sum() + (ent1 * g_ent).sum()).backward()

    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    lp2, ent2 = LP.torch_logprobs(h2, w2, t, temperature=temp, want_entropy=True, entropy_grad=True, chunk=chunk,
                                  compute_dtype=torch.float64)
    # the function always returns float32 values; its gradients keep the inputs' dtype
    assert lp2.dtype == torch.float32 and ent2.dtype == torch.float32
    ((lp2.double() * g_lp).sum() + (ent2.double() * g_ent).sum()).backward()
    assert torch.allclose(lp2.double(), lp1.detach(), atol=1e-6)
    assert torch.allclose(ent2.double(), ent1.detach(), atol=1e-6)
    assert torch.allclose(h2.grad, h1.grad, atol=1e-6)
    assert torch.allclose(w2.grad, w1.grad, atol=1e-6)


def test_entropy_without_gradient_and_log_prob_only_backward() -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 4, generator=g, requires_grad=True)
    w = torch.randn(9, 4, generator=g, requires_grad=True)
    t = torch.randint(0, 9, (6,), generator=g)
    lp, ent = LP.torch_logprobs(h, w, t, want_entropy=True, entropy_grad=False, chunk=4)
    assert not ent.requires_grad
    lp.sum().backward()
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref, ref_ent = _reference(h2, w2, t, 1.0)
    ref.sum().backward()
    assert torch.allclose(ent, ref_ent.detach(), atol=1e-5)
    assert torch.allclose(h.grad, h2.grad, atol=1e-5) and torch.allclose(w.grad, w2.grad, atol=1e-5)
    assert torch.allclose(LP.chunked_entropy(h.detach(), w.detach(), chunk=2), ref_ent.detach(), atol=1e-5)
    hot = _reference(h.detach(), w.detach(), t, 0.5)[1]
    assert torch.allclose(LP.chunked_entropy(h.detach(), w.detach(), temperature=0.5, chunk=4), hot, atol=1e-5)


def test_bf16_compute_matches_autocast_projection() -> None:
    g = torch.Generator().manual_seed(2)
    h = torch.randn(20, 16, generator=g)
    w = torch.randn(50, 16, generator=g) * 0.3
    t = torch.randint(0, 50, (20,), generator=g)
    lp, _ = LP.torch_logprobs(h, w, t, compute_dtype=torch.bfloat16, chunk=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = h @ w.t()  # what the model's lm_head gives under autocast
    ref = torch.log_softmax(logits.float(), -1).gather(-1, t[:, None]).squeeze(-1)
    assert torch.allclose(lp, ref, atol=1e-5)


_LIGER = textwrap.dedent("""
    import torch
    from agentrl.trainer import logprobs as LP
    assert LP.liger_runnable(torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    h0 = torch.randn(10, 16, generator=g); w0 = torch.randn(40, 16, generator=g); t = torch.randint(0, 40, (10,), generator=g)
    up = torch.randn(10, generator=g)
    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    lp = LP.liger_logprobs(h1, w1, t, temperature=0.7)
    (lp * up).sum().backward()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = torch.log_softmax(h2 @ w2.t() / 0.7, -1).gather(-1, t[:, None]).squeeze(-1)
    (ref * up).sum().backward()
    print("DIFF", float((lp - ref).abs().max()), float((h1.grad - h2.grad).abs().max()),
          float((w1.grad - w2.grad).abs().max()))
""")


# Skipped only off CI: the cpu extra installs liger-kernel, so there a missing one fails the test.
@pytest.mark.skipif(not LP.liger_available() and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
                    reason="liger-kernel is not installed (pip install '.[cpu]')")
def test_liger_path_matches_reference_under_triton_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _LIGER], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    diffs = [float(x) for x in out.stdout.split("DIFF")[1].split()]
    assert max(diffs) < 1e-5, diffs


# --------------------------------------------------------------------------------------- through the trainer
def _trajs(n_list: list[int], seed: int = 0) -> list[Trajectory]:
    g = random.Random(seed)
    out = []
    for i, n in enumerate(n_list):
        p = 3 + i % 3
        ids = [g.randrange(1, 64) for _ in range(p + n)]
        out.append(Trajectory(
            id=f"t{i}", group_id=f"g{i // 2}", env_id="test", token_ids=ids, loss_mask=[0] * p + [1] * n,
            logprobs=[0.0] * p + [-4.0 + g.gauss(0, 0.3) for _ in range(n)], versions=[-1] * p + [0] * n,
            prompt_len=p, reward=float(i % 2),
        ))
    return out


def _grads_after_step(tr: Trainer, trajs: list[Trajectory], adv: list[float]) -> dict[str, torch.Tensor]:
    grads: dict[str, torch.Tensor] = {}

    def fake_step(*a, **k):
        for n, p in tr.model.named_parameters():
            grads[n] = p.grad.detach().clone()

    tr.optimizer.step = fake_step  # type: ignore[method-assign]
    tr.train_step(trajs, adv)
    return grads


_LAYOUT_TRAJS = dict(n_list=[4, 11, 7, 2, 9])
_LAYOUT_ADV = [0.5, -1.0, 1.5, -0.2, 0.8]
_LAYOUT_BASE = dict(device="cpu", max_grad_norm=None, temperature=0.8, micro_batch_size=8,
                    loss=LossConfig(name="ppo", ratio_base="behavior", entropy_coef=0.01))


@pytest.fixture(scope="module")
def full_reference(tiny_model_dir: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs and the gradient of one step through the full-logits path, padded, one micro-batch."""
    trajs = _trajs(**_LAYOUT_TRAJS)
    tr = Trainer(TrainerConfig(**{**_LAYOUT_BASE, "logprob_impl": "full"}), tiny_model_dir)
    return tr.compute_logprobs(trajs), _grads_after_step(tr, trajs, _LAYOUT_ADV)


@pytest.mark.parametrize("variant", [
    dict(logprob_impl="torch"),
    dict(logprob_impl="torch", packing=True, micro_batch_tokens=40),
    dict(logprob_impl="full", packing=True, micro_batch_size=2),
    dict(logprob_impl="torch", micro_batch_size=3, micro_batch_tokens=30),
])
def test_layouts_and_paths_give_the_same_logprobs_and_gradients(tiny_model_dir: Path, variant: dict, full_reference,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LP, "CHUNK_ELEMENTS", 64 * 5)  # 5 positions per chunk: many chunk boundaries
    ref_lp, ref_g = full_reference
    trajs = _trajs(**_LAYOUT_TRAJS)
    tr = Trainer(TrainerConfig(**{**_LAYOUT_BASE, **variant}), tiny_model_dir)
    assert tr.logprob_impl == variant["logprob_impl"]
    assert torch.allclose(tr.compute_logprobs(trajs), ref_lp, atol=1e-5)
    g = _grads_after_step(tr, trajs, _LAYOUT_ADV)
    assert sum(float(v.norm()) for v in ref_g.values()) > 0
    for k in ref_g:
        assert torch.allclose(g[k], ref_g[k], atol=1e-5, rtol=1e-4), k


def test_compute_logprobs_equals_the_models_own_logits_at_temperature(tiny_model_dir: Path) -> None:
    seqs = [[1, 5, 9, 2, 40], [3, 4, 5, 6, 7, 8, 9, 10]]
    for impl in ("torch", "full"):
        tr = Trainer(TrainerConfig(device="cpu", logprob_impl=impl, temperature=0.6), tiny_model_dir)
        lp = tr.compute_logprobs(seqs)
        for i, s in enumerate(seqs):
            with torch.no_grad():
                logits = tr.model(input_ids=torch.tensor([s])).logits[0, :-1] / 0.6
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s[1:])[:, None]).squeeze(-1)
            assert torch.allclose(lp[i, : len(s) - 1], ref, atol=1e-5), impl


def test_liger_is_refused_where_it_cannot_run(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="logprob_impl: liger"):
        Trainer(TrainerConfig(device="cpu", logprob_impl="liger"), tiny_model_dir)
    assert Trainer(TrainerConfig(device="cpu"), tiny_model_dir).logprob_impl == "torch"  # auto on CPU


def test_a_head_that_is_not_a_plain_linear_map_falls_back_to_full_logits(tmp_path: Path) -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    # Gemma 2 softcaps its logits (30 * tanh(z / 30)): hidden @ W.T is not the logits
    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, final_logit_softcapping=2.0)
    torch.manual_seed(0)
    Gemma2ForCausalLM(cfg).save_pretrained(str(tmp_path))
    tr = Trainer(TrainerConfig(device="cpu", logprob_impl="auto", temperature=0.9), tmp_path)
    assert tr.logprob_impl == "full"
    seq = [1, 7, 3, 60, 2]
    with torch.no_grad():
        logits = tr.model(input_ids=torch.tensor([seq])).logits[0, :-1] / 0.9
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:])[:, None]).squeeze(-1)
    assert torch.allclose(tr.compute_logprobs([seq])[0], ref, atol=1e-5)
    with pytest.raises(ValueError, match="plain linear"):
        Trainer(TrainerConfig(device="cpu", logprob_impl="torch"), tmp_path)


def test_checkpointing_every_second_layer_keeps_the_gradient(tiny_model_dir: Path) -> None:
    trajs = _trajs([6, 9, 4])
    adv = [1.0, -0.5, 0.3]
    g0 = _grads_after_step(Trainer(TrainerConfig(device="cpu", max_grad_norm=None), tiny_model_dir), trajs, adv)
    tr = Trainer(TrainerConfig(device="cpu", max_grad_norm=None, gradient_checkpointing=True, checkpoint_every=2),
                 tiny_model_dir)
    assert [layer.gradient_checkpointing for layer in tr.model.model.layers] == [True, False]
    g1 = _grads_after_step(tr, trajs, adv)
    for k in g0:
        assert torch.allclose(g1[k], g0[k], atol=1e-6), k


def test_fp32_master_weights_move_under_bf16_compute_at_a_small_lr(tiny_model_dir: Path) -> None:
    # issue 12 #2: bf16 parameters under AdamW at lr 1e-6 keep most weights unchanged (bf16 spacing near 0.02 is
    # ~1e-4, so a 1e-6 update rounds away); float32 master weights move them all.
    tr = Trainer(TrainerConfig(device="cpu", dtype="bfloat16", optimizer=OptimizerConfig(lr=1e-6)), tiny_model_dir)
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    trajs = _trajs([6, 9, 4, 7])
    tr.train_step(trajs, [1.0, -1.0, 0.5, -0.5])
    changed = total = 0
    for k, v in tr.model.named_parameters():
        assert v.dtype == torch.float32
        changed += int((v.detach() != before[k]).sum())
        total += v.numel()
    assert changed / total > 0.9, changed / total
    # what the engine gets is the compute precision
    assert tr.state_dict_for_inference()["model.norm.weight"].dtype == torch.bfloat16


def test_compiled_layers_with_checkpointing_give_the_same_logprobs_and_gradients(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Dynamo traces each decoder layer; the "eager" backend skips Inductor's code generation, which is slow on a
    # CPU and not what this checks (the wiring: per-layer compile under HF's checkpointing wrapper).
    orig = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: orig(self, *a, **{**k, "backend": "eager"}))
    trajs = _trajs([6, 9, 4])
    adv = [1.0, -0.5, 0.3]
    plain = Trainer(TrainerConfig(device="cpu", max_grad_norm=None), tiny_model_dir)
    lp0, g0 = plain.compute_logprobs(trajs), _grads_after_step(plain, trajs, adv)
    tr = Trainer(TrainerConfig(device="cpu", max_grad_norm=None, compile_layers=True, gradient_checkpointing=True),
                 tiny_model_dir)
    assert all(layer._compiled_call_impl is not None for layer in tr.model.model.layers)
    assert torch.allclose(tr.compute_logprobs(trajs), lp0, atol=1e-6)
    g1 = _grads_after_step(tr, trajs, adv)
    for k in g0:
        assert torch.allclose(g1[k], g0[k], atol=1e-6), k
