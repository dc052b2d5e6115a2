"""The Trainer on a tiny random Qwen2 model (CPU, fp32): learning signal, micro-batching equivalence, metrics,
checkpoints (bit-exact round trip, atomic save under failure and SIGKILL), weights for the engine."""

from __future__ import annotations

import copy
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.trainer.config import LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.trainer import Trainer, find_latest_checkpoint
from agentrl.trajectory import Trajectory

PROMPT = [1, 2, 3, 4]
GOOD = [10, 11, 12, 13, 14]
BAD = [20, 21, 22, 23, 24]


def make_traj(tid: str, group: str, prompt: list[int], completion: list[int], reward: float,
              version: int | list[int] = 0) -> Trajectory:
    versions = version if isinstance(version, list) else [version] * len(completion)
    return Trajectory(
        id=tid, group_id=group, env_id="test", token_ids=prompt + completion,
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        logprobs=[0.0] * len(prompt) + [-1.0] * len(completion),
        versions=[-1] * len(prompt) + versions, prompt_len=len(prompt), reward=reward,
    )


def set_behavior(trainer: Trainer, trajs: list[Trajectory], noise: float = 0.0, seed: int = 0) -> None:
    """Fills each trajectory's behavior log-probs with the trainer's own (plus noise: a stale/mismatched engine)."""
    lp = trainer.compute_logprobs(trajs)
    g = random.Random(seed)
    for i, t in enumerate(trajs):
        t.logprobs = [float(lp[i, j - 1]) + noise * g.gauss(0, 1) if m else 0.0 for j, m in enumerate(t.loss_mask)]


def completion_logp(trainer: Trainer, prompt: list[int], completion: list[int]) -> float:
    lp = trainer.compute_logprobs([prompt + completion])
    return float(lp[0, len(prompt) - 1:].sum())


def cfg(**kw) -> TrainerConfig:
    kw.setdefault("optimizer", OptimizerConfig(lr=1e-3))
    return TrainerConfig(device="cpu", **kw)


def test_train_step_raises_logprob_of_positive_advantage_tokens(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(), tiny_model_dir)
    good0 = completion_logp(tr, PROMPT, GOOD)
    bad0 = completion_logp(tr, PROMPT, BAD)
    for step in range(5):
        trajs = [make_traj(f"g{step}{i}", "grp", PROMPT, GOOD if i % 2 == 0 else BAD, 1.0 if i % 2 == 0 else 0.0,
                           version=tr.version) for i in range(4)]
        set_behavior(tr, trajs)
        m = tr.train_step(trajs)
        assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
    good1 = completion_logp(tr, PROMPT, GOOD)
    bad1 = completion_logp(tr, PROMPT, BAD)
    assert good1 > good0 + 1.0, (good0, good1)
    assert bad1 < bad0 - 1.0, (bad0, bad1)
    assert tr.version == 5 and tr.optimizer_steps == 5


def _capture_grads(tr: Trainer) -> dict[str, torch.Tensor]:
    """Replaces the optimizer step by a gradient snapshot (weights stay put, so calls can be compared)."""
    grads: dict[str, torch.Tensor] = {}

    def fake_step(*a, **k):
        for n, p in tr.model.named_parameters():
            grads[n] = p.grad.detach().clone()

    tr.optimizer.step = fake_step  # type: ignore[method-assign]
    return grads


def _mixed_batch(tr: Trainer) -> list[Trajectory]:
    g = random.Random(5)
    trajs = []
    for i, n in enumerate([3, 9, 5, 7]):  # different lengths so padding differs between micro-batch layouts
        prompt = [g.randrange(1, 64) for _ in range(3 + i)]
        comp = [g.randrange(1, 64) for _ in range(n)]
        trajs.append(make_traj(f"m{i}", "grp" if i < 2 else "grp2", prompt, comp, reward=float(i % 3)))
    set_behavior(tr, trajs, noise=0.2)
    return trajs


@pytest.mark.parametrize("loss", [
    LossConfig(name="decoupled_ppo", aggregation="token_mean"),
    LossConfig(name="gspo", aggregation="seq_mean_token_mean", ratio_base="behavior", clip_eps=0.5),
    LossConfig(name="cispo", aggregation="seq_mean_token_sum"),
])
def test_micro_batching_gives_the_same_gradient(tiny_model_dir: Path, loss: LossConfig) -> None:
    tr = Trainer(cfg(loss=loss, micro_batch_size=4, max_grad_norm=None), tiny_model_dir)
    grads = _capture_grads(tr)
    trajs = _mixed_batch(tr)
    adv = [0.7, -1.3, 0.4, 2.0]
    m4 = tr.train_step(trajs, adv)
    g4 = dict(grads)
    tr.config.micro_batch_size = 1
    m1 = tr.train_step(trajs, adv)
    g1 = dict(grads)
    tr.config.micro_batch_size, tr.config.micro_batch_tokens = 4, 20  # token budget: 2-3 micro-batches
    tr.train_step(trajs, adv)
    gt = dict(grads)
    assert m4["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-6)
    total = sum(float(v.norm()) for v in g4.values())
    assert total > 0
    for name in g4:
        assert torch.allclose(g1[name], g4[name], rtol=1e-4, atol=1e-6), name
        assert torch.allclose(gt[name], g4[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("name", ["ppo", "decoupled_ppo", "tis", "cispo", "topr", "gspo"])
def test_every_loss_trains_through_the_trainer(tiny_model_dir: Path, name: str) -> None:
    tr = Trainer(cfg(loss=LossConfig(name=name, ratio_base="behavior" if name == "gspo" else "proximal")),
                 tiny_model_dir)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    trajs = _mixed_batch(tr)
    for t, r in zip(trajs, [1.0, -1.0, 0.5, -0.5]):
        t.reward = r
    m = tr.train_step(trajs)
    assert all(math.isfinite(v) for v in m.values()), m
    assert m["train/skipped_steps"] == 0
    changed = any(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    assert changed


def test_metrics_staleness_advantages_and_mismatch(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(loss=LossConfig(name="decoupled_ppo", is_cap=2.0), num_mini_batches=2), tiny_model_dir)
    warm = [make_traj("w", "w", PROMPT, GOOD, 0.0)]
    tr.sft_step(warm)
    tr.sft_step(warm)
    assert tr.version == 2
    # 3 generated tokens each: versions 0, 1, 2 -> staleness 2, 1, 0 at trainer version 2
    trajs = [make_traj(f"s{i}", "g", PROMPT, GOOD[:3], reward=float(i), version=[0, 1, 2]) for i in range(4)]
    set_behavior(tr, trajs, noise=0.5)
    m = tr.train_step(trajs)
    for k in (0, 1, 2):
        assert m[f"staleness/hist/{k}"] == pytest.approx(1 / 3)
    assert m["staleness/max"] == 2 and m["staleness/mean"] == pytest.approx(1.0)
    assert m["reward/mean"] == pytest.approx(1.5)
    assert m["adv/mean"] == pytest.approx(0.0, abs=1e-6) and m["adv/max"] > 0
    assert m["batch/loss_tokens"] == 12 and m["batch/num_seqs"] == 4
    assert m["mismatch/kl_k3"] > 0.01  # noise 0.5 on the behavior log-probs
    assert 0 < m["is/truncated_frac"] < 1 and m["is/weight_max"] > 2.0
    assert m["perf/tokens_per_s"] > 0 and m["entropy"] > 0
    assert m["version"] == 3 and tr.version == 3
    assert m["optimizer_steps"] == 4  # 2 SFT + 2 mini-batches


def test_compute_logprobs_matches_unpadded_forward_and_temperature(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(), tiny_model_dir)
    seqs = [[1, 5, 9, 2], [3, 4, 5, 6, 7, 8, 9]]
    lp = tr.compute_logprobs(seqs)
    assert lp.shape == (2, 6)
    for i, s in enumerate(seqs):
        with torch.no_grad():
            logits = tr.model(input_ids=torch.tensor([s])).logits[0, :-1]
        ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(s[1:]).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(lp[i, : len(s) - 1], ref, atol=1e-5)
        assert torch.all(lp[i, len(s) - 1:] == 0)
    tr.config.temperature = 2.0
    hot = tr.compute_logprobs(seqs[:1])
    with torch.no_grad():
        logits = tr.model(input_ids=torch.tensor([seqs[0]])).logits[0, :-1] / 2.0
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(seqs[0][1:]).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(hot[0], ref, atol=1e-5)


def test_sft_step_lowers_nll(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(optimizer=OptimizerConfig(lr=3e-3)), tiny_model_dir)
    demos = [make_traj("d1", "d", PROMPT, GOOD, 0.0), make_traj("d2", "d", [7, 8], BAD, 0.0)]
    first = tr.sft_step(demos)["sft/nll"]
    for _ in range(10):
        last = tr.sft_step(demos)["sft/nll"]
    assert last < first - 1.0
    assert tr.version == 11


def test_kl_to_reference_model(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(loss=LossConfig(name="ppo", kl_coef=0.1, kl_estimator="k3")), tiny_model_dir)
    assert tr.ref_model is not None
    trajs = _mixed_batch(tr)
    m0 = tr.train_step(trajs, [1.0, -1.0, 1.0, -1.0])
    assert m0["kl/ref"] == pytest.approx(0.0, abs=1e-6)  # identical weights before the first update
    m1 = tr.train_step(trajs, [1.0, -1.0, 1.0, -1.0])
    assert m1["kl/ref"] > 1e-6
    assert all(not p.requires_grad for p in tr.ref_model.parameters())


def test_invalid_trajectories_are_dropped_and_counted(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(), tiny_model_dir)
    good = [make_traj("a", "g", PROMPT, GOOD, 1.0), make_traj("b", "g", PROMPT, BAD, 0.0)]
    set_behavior(tr, good)
    broken = make_traj("c", "g", PROMPT, GOOD, 0.5)
    broken.loss_mask = broken.loss_mask[:-1]  # misaligned
    oov = make_traj("d", "g", PROMPT, [999], 0.5)  # token outside the vocabulary
    m = tr.train_step(good + [broken, oov])
    assert m["batch/dropped_invalid"] == 2 and m["batch/num_seqs"] == 2
    with pytest.raises(ValueError, match="no trainable trajectory"):
        tr.train_step([broken])
    with pytest.raises(ValueError, match="advantages"):
        tr.train_step(good, [1.0])


def test_no_loss_tokens_skips_the_optimizer_step(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(), tiny_model_dir)
    t = make_traj("p", "g", PROMPT, [], 1.0)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    m = tr.train_step([t])
    assert m["train/skipped_steps"] == 1 and tr.optimizer_steps == 0 and tr.version == 1
    assert all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())


def test_max_seq_len_truncates(tiny_model_dir: Path) -> None:
    tr = Trainer(cfg(max_seq_len=6), tiny_model_dir)
    trajs = [make_traj("a", "g", PROMPT, GOOD, 1.0), make_traj("b", "g", PROMPT, BAD, 0.0)]
    m = tr.train_step(trajs)
    assert m["batch/truncated_seqs"] == 2 and m["batch/loss_tokens"] == 4  # tokens 5 and 6 of each


def test_data_parallel_needs_a_process_group(tiny_model_dir: Path) -> None:
    # ranks are built by agentrl.trainer.dp_group (tests/trainer/test_data_parallel.py); alone, a Trainer refuses
    tr = Trainer(cfg(world_size=2), tiny_model_dir)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        tr.enable_data_parallel()
    assert tr.sharding == "none" and tr.rank == 0


def test_state_dict_for_inference_has_hf_names_and_is_a_copy(tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    tr = Trainer(cfg(), tiny_model_dir)
    sd = tr.state_dict_for_inference()
    on_disk = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(on_disk) <= set(sd)
    for k, v in on_disk.items():
        assert torch.equal(sd[k], v), k
    sd["model.embed_tokens.weight"].zero_()
    assert tr.model.model.embed_tokens.weight.abs().sum() > 0
    assert tr.state_dict_for_inference(torch.bfloat16)["model.norm.weight"].dtype == torch.bfloat16


def _opt_state_equal(a: dict, b: dict) -> bool:
    if a["param_groups"] != b["param_groups"] or a["state"].keys() != b["state"].keys():
        return False
    for k in a["state"]:
        for name, v in a["state"][k].items():
            w = b["state"][k][name]
            if not (torch.equal(v, w) if torch.is_tensor(v) else v == w):
                return False
    return True


def test_checkpoint_round_trip_is_bit_exact(tiny_model_dir: Path, tmp_path: Path) -> None:
    tr = Trainer(cfg(), tiny_model_dir)
    trajs = _mixed_batch(tr)
    tr.train_step(trajs)
    tr.train_step(trajs)
    ck = tr.save_checkpoint(tmp_path / "ckpt" / "step_2")
    params = {k: v.clone() for k, v in tr.model.state_dict().items()}
    opt_state = copy.deepcopy(tr.optimizer.state_dict())
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    m_next = tr.train_step(trajs)
    after_next = {k: v.clone() for k, v in tr.model.state_dict().items()}

    assert (ck / "model" / "tokenizer_config.json").exists()  # the source dir's tokenizer files travel along
    assert (ck / "model" / "config.json").exists()

    # A fresh trainer (new process in real life) restores everything.
    tr2 = Trainer(cfg(seed=99), tiny_model_dir)
    state = tr2.load_checkpoint(ck)
    assert state["version"] == 2 and tr2.version == 2 and tr2.optimizer_steps == 2
    assert state["config"]["optimizer"]["lr"] == 1e-3
    for k, v in params.items():
        assert torch.equal(tr2.model.state_dict()[k], v), k
    assert _opt_state_equal(tr2.optimizer.state_dict(), opt_state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws
    # and continues exactly as the original did
    m2 = tr2.train_step(trajs)
    assert m2["loss"] == m_next["loss"]
    for k, v in after_next.items():
        assert torch.equal(tr2.model.state_dict()[k], v), k
    # the checkpoint's model/ is a loadable HF model directory (what an engine would load)
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(ck / "model"), dtype=torch.float32)
    assert torch.equal(hf.state_dict()["model.norm.weight"], params["model.norm.weight"])


def test_save_failure_leaves_previous_checkpoint_intact(tiny_model_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    tr = Trainer(cfg(), tiny_model_dir)
    target = tmp_path / "ck"
    tr.save_checkpoint(target)
    tr.train_step(_mixed_batch(tr))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        tr.save_checkpoint(target)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temp dir left behind
    st = json.loads((target / "trainer_state.json").read_text())
    assert st["version"] == 0  # still the first save
    tr.save_checkpoint(target)  # replacing an existing checkpoint works
    assert json.loads((target / "trainer_state.json").read_text())["version"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


_SAVER = textwrap.dedent("""
    import sys, time
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer import trainer as T
    from agentrl.trainer import checkpoint as C

    model, root = sys.argv[1], sys.argv[2]
    tr = T.Trainer(TrainerConfig(device="cpu"), model)
    tr.save_checkpoint(root + "/step_0")
    slow = C._fsync_tree
    def slow_fsync(p):
        print("SAVING", flush=True)
        time.sleep(30)  # SIGKILL lands here: everything written, nothing renamed yet
        slow(p)
    C._fsync_tree = slow_fsync
    tr._version = 1
    tr._optimizer_steps = 1
    tr.save_checkpoint(root + "/step_1")
""")


def test_sigkill_mid_save_never_leaves_a_half_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    root.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(tiny_model_dir), str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + 120
        line = ""
        while time.time() < deadline:
            line = proc.stdout.readline()
            if "SAVING" in line or not line:
                break
        assert "SAVING" in line, "saver did not reach the save"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    names = sorted(p.name for p in root.iterdir())
    assert "step_1" not in names and any(n.startswith(".step_1.tmp-") for n in names)
    latest = find_latest_checkpoint(root)
    assert latest == root / "step_0"
    tr = Trainer(cfg(), tiny_model_dir)
    assert tr.load_checkpoint(latest)["version"] == 0
    with pytest.raises(FileNotFoundError):
        tr.load_checkpoint(root / "step_1")
    tr.save_checkpoint(root / "step_1")  # the next save to that path clears the killed save's temp dir
    assert sorted(p.name for p in root.iterdir()) == ["step_0", "step_1"]


def test_crash_between_renames_of_a_replacing_save_is_recovered(tiny_model_dir: Path, tmp_path: Path) -> None:
    tr = Trainer(cfg(), tiny_model_dir)
    tr.save_checkpoint(tmp_path / "latest")
    # What a SIGKILL right after "move the old copy aside" and before "rename the new one in" leaves behind:
    os.rename(tmp_path / "latest", tmp_path / ".latest.old-deadbeef")
    assert find_latest_checkpoint(tmp_path) == tmp_path / ".latest.old-deadbeef"
    assert Trainer(cfg(), tiny_model_dir).load_checkpoint(tmp_path / "latest")["version"] == 0


@pytest.mark.parametrize("dtype,mixed", [("bfloat16", "none"), ("float32", "bf16")])
def test_bf16_options_train_on_cpu(tiny_model_dir: Path, tmp_path: Path, dtype: str, mixed: str) -> None:
    tr = Trainer(cfg(dtype=dtype, mixed_precision=mixed, optimizer=OptimizerConfig(lr=1e-2)), tiny_model_dir)
    # issue 12 #2: bf16 compute keeps float32 master weights (this asserted bf16 parameters before the fix)
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    trajs = _mixed_batch(tr)
    m = tr.train_step(trajs, [1.0, -1.0, 0.5, -0.5])
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0 and m["train/skipped_steps"] == 0
    assert tr.compute_logprobs(trajs).dtype == torch.float32  # log-softmax always in float32
    ck = tr.save_checkpoint(tmp_path / "ck")
    tr2 = Trainer(cfg(dtype=dtype, mixed_precision=mixed), tiny_model_dir)
    tr2.load_checkpoint(ck)
    for k, v in tr.model.state_dict().items():
        assert torch.equal(tr2.model.state_dict()[k], v), k


def test_topr_is_metrics_do_not_depend_on_micro_batching(tiny_model_dir: Path) -> None:
    # issue 12 #6: is/* of TOPR are means over negative-reward tokens; a micro-batch with none of them diluted the
    # mean (1.649 was reported as 0.824)
    out = {}
    for micro in (8, 1):
        tr = Trainer(cfg(loss=LossConfig(name="topr"), micro_batch_size=micro), tiny_model_dir)
        trajs = _mixed_batch(tr)
        for t, r in zip(trajs, [1.0, -1.0, 0.5, -2.0]):
            t.reward = r
        out[micro] = tr.train_step(trajs)
    for key in ("is/weight_mean", "is/truncated_frac", "topr/neg_frac", "loss"):
        assert out[1][key] == pytest.approx(out[8][key], rel=1e-5), key
    assert out[1]["is/weight_mean"] > 0


def test_lr_metric_is_the_lr_the_step_used(tiny_model_dir: Path) -> None:
    # issue 12 #6: during warm-up the metric reported the next step's lr
    tr = Trainer(cfg(optimizer=OptimizerConfig(lr=1e-3, warmup_steps=4)), tiny_model_dir)
    trajs = _mixed_batch(tr)
    seen = []
    orig = tr.optimizer.step

    def spy(*a, **k):
        seen.append(tr.optimizer.param_groups[0]["lr"])
        return orig(*a, **k)

    tr.optimizer.step = spy  # type: ignore[method-assign]
    lrs = [tr.train_step(trajs)["lr"] for _ in range(3)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4]) and lrs == pytest.approx(seen)
    assert tr.sft_step(trajs)["lr"] == pytest.approx(1e-3)


def test_gpu_config_trains_with_fp32_master_weights_and_a_token_budget() -> None:
    import yaml

    from agentrl.config import from_dict

    raw = yaml.safe_load((Path(__file__).parents[2] / "configs" / "gpu_qwen2.5_tooluse.yaml").read_text())
    tc = from_dict(TrainerConfig, raw["trainer"], "gpu_qwen2.5_tooluse.yaml")
    tc.validate()
    assert tc.compute_dtype == "bfloat16"  # bf16 compute; the Trainer keeps float32 parameters whatever dtype says
    assert tc.micro_batch_tokens is not None and tc.gradient_checkpointing
    assert tc.logprob_impl in ("auto", "liger", "torch")  # never the full [tokens, vocabulary] logits


def test_segmented_trajectory_trains_as_its_segments(tiny_model_dir: Path) -> None:
    """A trajectory split into segments (template mode "split") is trained as one sequence per segment, each in its
    own context, with the trajectory's advantage: the same update as the segments given as separate trajectories,
    and not the update of the concatenation."""
    s1 = make_traj("a.0", "g", PROMPT, GOOD, 1.0)
    s2 = make_traj("a.1", "g", PROMPT + [5, 6], BAD[:3], 1.0)
    seg = Trajectory(id="a", group_id="g", env_id="test", token_ids=s1.token_ids + s2.token_ids,
                     loss_mask=s1.loss_mask + s2.loss_mask, logprobs=s1.logprobs + s2.logprobs,
                     versions=s1.versions + s2.versions, prompt_len=len(PROMPT), reward=1.0,
                     segments=[len(s1.token_ids), len(s2.token_ids)])
    seg.validate()
    flat = copy.deepcopy(seg)
    flat.segments = []
    with pytest.raises(ValueError, match="segments"):
        Trajectory(**{**seg.__dict__, "segments": [3, 3]}).validate()

    ref = Trainer(cfg(), tiny_model_dir)
    lp = ref.compute_logprobs([seg])
    parts = ref.compute_logprobs([s1, s2])
    n1 = len(s1.token_ids)
    assert torch.allclose(lp[0, : n1 - 1], parts[0, : n1 - 1], atol=1e-6)
    assert torch.allclose(lp[0, n1: len(seg.token_ids) - 1], parts[1, : len(s2.token_ids) - 1], atol=1e-6)
    assert lp[0, n1 - 1] == 0.0  # the first token of segment 2 has no context in its own segment

    results = []
    for batch in ([seg], [s1, s2], [flat]):
        tr = Trainer(cfg(), tiny_model_dir)
        m = tr.train_step(batch, advantages=[1.0] * len(batch))
        results.append((m["batch/num_seqs"], torch.cat([p.detach().flatten() for p in tr.model.parameters()])))
    assert results[0][0] == results[1][0] == 2.0 and results[2][0] == 1.0
    assert torch.allclose(results[0][1], results[1][1], atol=1e-6)
    assert not torch.allclose(results[0][1], results[2][1], atol=1e-6)


def _three_segments_and_one() -> list[Trajectory]:
    """A group of two: trajectory ``a`` recorded as 3 segments (2, 5 and 3 generated tokens: 10) and ``b`` as one
    (4 generated tokens)."""
    parts = [make_traj(f"a.{i}", "g", PROMPT + [5] * i, comp, 1.0) for i, comp in enumerate([GOOD[:2], BAD, GOOD[:3]])]
    a = Trajectory(id="a", group_id="g", env_id="test", token_ids=sum((p.token_ids for p in parts), []),
                   loss_mask=sum((p.loss_mask for p in parts), []), logprobs=sum((p.logprobs for p in parts), []),
                   versions=sum((p.versions for p in parts), []), prompt_len=len(PROMPT), reward=1.0,
                   segments=[len(p.token_ids) for p in parts])
    return [a, make_traj("b", "g", [7, 8, 9], [30, 31, 32, 33], 0.0)]


def test_sequence_level_loss_weighs_a_segmented_trajectory_once(tiny_model_dir: Path) -> None:
    """GSPO's default ``seq_mean_token_mean`` at step start (every sequence ratio 1): each trajectory's term is
    ``-A_i`` times the mean over its 10 or 4 loss tokens of ``grad log pi``, and the batch has 2 sequences, not 4.
    So the loss is ``-(2 + (-1)) / 2`` and the gradient equals that of a token mean (PPO, ratio 1) whose
    advantages are rescaled to ``A_i * N / (2 * L_i)`` with N = 14 loss tokens."""
    def grads_of(loss: LossConfig, adv: list[float]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        tr = Trainer(cfg(loss=loss, max_grad_norm=None, micro_batch_size=2), tiny_model_dir)
        grads = _capture_grads(tr)
        return tr.train_step(_three_segments_and_one(), adv), dict(grads)

    m, g = grads_of(LossConfig(name="gspo"), [2.0, -1.0])
    assert m["loss"] == pytest.approx(-0.5, abs=1e-6)  # per segment it would be (-2 * 3 + 1) / 4 = -1.25
    _, g_ref = grads_of(LossConfig(name="ppo", aggregation="token_mean"), [2.0 * 14 / 20, -1.0 * 14 / 8])
    assert sum(float(v.norm()) for v in g.values()) > 0
    for name in g:
        assert torch.allclose(g[name], g_ref[name], rtol=1e-4, atol=1e-7), name


def test_sequence_level_is_weight_spans_all_segments(tiny_model_dir: Path) -> None:
    """``is_level: sequence``: every loss token of a trajectory gets ``exp(sum over all its segments' tokens of
    log(pi_prox / mu))``. With ``mu = pi_prox * exp(-0.05)`` on every generated token that is ``exp(0.05 * 10)`` on
    the 10 tokens of ``a`` and ``exp(0.05 * 4)`` on the 4 of ``b``."""
    tr = Trainer(cfg(loss=LossConfig(name="decoupled_ppo", is_level="sequence", is_cap=100.0)), tiny_model_dir)
    trajs = _three_segments_and_one()
    lp = tr.compute_logprobs(trajs)
    for i, t in enumerate(trajs):
        t.logprobs = [float(lp[i, j - 1]) - 0.05 if m else 0.0 for j, m in enumerate(t.loss_mask)]
    m = tr.train_step(trajs, [1.0, -1.0])
    expected = (10 * math.exp(0.5) + 4 * math.exp(0.2)) / 14
    assert m["is/weight_mean"] == pytest.approx(expected, rel=1e-4)
    assert m["is/weight_max"] == pytest.approx(math.exp(0.5), rel=1e-4)
