"""``trainer.lora``: only adapters train (base frozen) in every loss, the weights for the engine are the adapter alone,
adapter-only checkpoints resume exactly and refuse a full-model run (and the reverse), the merged export scores like
the trainer, two replicated ranks equal one trainer, and the combinations that cannot be exact are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import torch

from agentrl.config import ConfigError, from_dict
from agentrl.trainer.config import AdvantageConfig, LoraConfig, LossConfig, OptimizerConfig, TrainerConfig
from agentrl.trainer.trainer import Trainer
from agentrl.trajectory import Group, Trajectory

LOSSES = ["decoupled_ppo", "ppo", "tis", "cispo", "topr", "gspo"]


def _cfg(**kw) -> TrainerConfig:
    base = dict(device="cpu", micro_batch_size=2, optimizer=OptimizerConfig(lr=1e-2, eps=1e-6),
                advantage=AdvantageConfig(estimator="grpo"), lora=LoraConfig(rank=4, alpha=8.0))
    base.update(kw)
    return TrainerConfig(**base)


def _groups(seed: int = 0) -> list[Group]:
    import random

    g = random.Random(seed)
    groups = []
    for gi in range(2):
        prompt = [g.randrange(1, 64) for _ in range(4)]
        trajs = []
        for j in range(3):
            n = 3 + j * 2
            trajs.append(Trajectory(
                id=f"t{gi}-{j}", group_id=f"g{gi}", env_id="test",
                token_ids=prompt + [g.randrange(1, 64) for _ in range(n)], loss_mask=[0] * len(prompt) + [1] * n,
                logprobs=[0.0] * len(prompt) + [-4.1 + g.gauss(0, 0.3) for _ in range(n)],
                versions=[-1] * len(prompt) + [0] * n, prompt_len=len(prompt), reward=float(j - 1)))
        groups.append(Group(id=f"g{gi}", trajectories=trajs))
    return groups


def _base_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("loss", LOSSES)
def test_only_the_adapter_trains_in_every_loss(tiny_model_dir: Path, loss: str) -> None:
    trainer = Trainer(_cfg(loss=LossConfig(name=loss, kl_coef=0.05 if loss == "ppo" else 0.0)), tiny_model_dir)
    base0 = _base_weights(trainer)
    adapter0 = trainer.state_dict_for_inference()
    assert adapter0 and all(".lora_A." in n or ".lora_B." in n for n in adapter0)
    assert all(p.requires_grad == ("lora_" in n) for n, p in trainer.model.named_parameters())
    trainer.train_step(_groups())
    trainer.train_step(_groups(1))  # B starts at 0: a second step moves A as well
    assert _max_diff(_base_weights(trainer), base0) == 0.0
    adapter1 = trainer.state_dict_for_inference()
    assert set(adapter1) == set(adapter0)
    assert all(float((adapter1[n] - adapter0[n]).abs().max()) > 0 for n in adapter0), "an adapter did not move"


def test_adapter_checkpoint_resumes_exactly_and_refuses_full_runs(tiny_model_dir: Path, tmp_path: Path) -> None:
    a = Trainer(_cfg(), tiny_model_dir)
    a.train_step(_groups())
    ck = a.save_checkpoint(tmp_path / "ck")
    files = {f.name for f in (ck / "model").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json"} <= files
    assert not any(f.startswith("model") and f.endswith(".safetensors") for f in files)  # adapter only
    assert json.loads((ck / "model/adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model_dir)
    a.train_step(_groups(1))

    b = Trainer(_cfg(), tiny_model_dir)
    assert b.load_checkpoint(ck)["lora"] is True and b.version == 1
    b.train_step(_groups(1))  # the optimizer state came back: the same second step
    assert _max_diff(b.state_dict_for_inference(), a.state_dict_for_inference()) <= 1e-6

    with pytest.raises(ValueError, match="LoRA adapter checkpoint cannot resume a run with trainer.lora unset"):
        Trainer(_cfg(lora=None), tiny_model_dir).load_checkpoint(ck)
    full = Trainer(_cfg(lora=None), tiny_model_dir).save_checkpoint(tmp_path / "full")
    with pytest.raises(ValueError, match="full model checkpoint cannot resume a run with trainer.lora set"):
        Trainer(_cfg(), tiny_model_dir).load_checkpoint(full)
    with pytest.raises(ValueError, match="does not fit trainer.lora"):
        Trainer(_cfg(lora=LoraConfig(rank=8)), tiny_model_dir).load_checkpoint(ck)


def test_merged_export_scores_like_the_trainer(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.lora import merge

    trainer = Trainer(_cfg(), tiny_model_dir)
    trainer.train_step(_groups())
    trainer.train_step(_groups(1))
    ck = trainer.save_checkpoint(tmp_path / "ck")
    out = merge(ck / "model", tmp_path / "merged")
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    trajs = [t for g in _groups() for t in g.trajectories]
    with torch.no_grad():
        for i, t in enumerate(trajs):
            lp = torch.log_softmax(merged(torch.tensor([t.token_ids])).logits[0].float(), -1)
            mine = [float(lp[p, t.token_ids[p + 1]]) for p in range(len(t.token_ids) - 1)]
            ref = trainer.compute_logprobs([t])[0, : len(mine)].tolist()
            assert max(abs(x - y) for x, y in zip(mine, ref)) < 1e-5
    base = Trainer(_cfg(lora=None), tiny_model_dir)
    assert float((base.compute_logprobs(trajs) - trainer.compute_logprobs(trajs)).abs().max()) > 1e-3  # not vacuous


def test_refusals_name_the_keys() -> None:
    with pytest.raises(ConfigError, match=r"lora.rank must be >= 1"):
        from_dict(TrainerConfig, {"lora": {"rank": 0}})
    with pytest.raises(ConfigError, match=r"lora.target_modules: \['lm_head'\]"):
        from_dict(TrainerConfig, {"lora": {"target_modules": ["q_proj", "lm_head"]}})
    with pytest.raises(ConfigError, match=r"trainer.lora with trainer.sharding: fsdp"):
        from_dict(TrainerConfig, {"lora": {"rank": 8}, "sharding": "fsdp"})
    with pytest.raises(ConfigError, match=r"lora.dropout"):
        from_dict(TrainerConfig, {"lora": {"dropout": 1.0}})
    assert from_dict(TrainerConfig, {}).lora is None  # off by default


def test_unknown_target_modules_are_refused_by_name(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"trainer.lora.target_modules \['qq_proj'\]"):
        Trainer(_cfg(lora=LoraConfig(target_modules=["qq_proj"])), tiny_model_dir)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_two_replicated_ranks_equal_one_lora_trainer(ray_local, tiny_model_dir: Path, tmp_path: Path) -> None:
    from agentrl.trainer.dp_group import create_trainer, stop_trainer

    single = Trainer(_cfg(), tiny_model_dir)
    single.train_step(_groups())
    group = create_trainer(_cfg(world_size=2, sharding="replicate"), tiny_model_dir)
    try:
        group.train_step.remote(_groups()).result()
        for rank in (0, 1):
            got = ray.get(group.actors[rank].state_dict_for_inference.remote())
            assert _max_diff(got, single.state_dict_for_inference()) <= 1e-5, rank
        ck = group.save_checkpoint.remote(str(tmp_path / "dp")).result()
        assert (Path(ck) / "model/adapter_model.safetensors").is_file()
        assert group.load_checkpoint.remote(ck).result()["lora"] is True
    finally:
        stop_trainer(group)


def test_an_adapter_directory_is_a_policy_and_merges_from_the_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``agentrl eval`` / the gateway build their engine from ``EngineConfig(model=DIR)``: an adapter directory
    there means its base model with the adapter served as version 0."""
    from agentrl.cli import main
    from agentrl.inference.config import EngineConfig

    trainer = Trainer(_cfg(), tiny_model_dir)
    trainer.train_step(_groups())
    ck = trainer.save_checkpoint(tmp_path / "ck")
    ecfg = EngineConfig(model=str(ck / "model"))
    assert ecfg.resolved_model() == str(tiny_model_dir) and ecfg.adapter_path() == str(ck / "model")
    assert ecfg.resolved_lora()["r"] == 4 and ecfg.resolved_lora()["lora_alpha"] == 8.0
    assert main(["models", "merge-lora", str(ck / "model"), str(tmp_path / "merged")]) == 0
    assert (tmp_path / "merged" / "config.json").is_file()
    assert main(["models", "merge-lora", str(tmp_path), str(tmp_path / "x")]) == 2  # not an adapter: a clear error


def test_train_config_refuses_lora_only_where_it_cannot_be_exact() -> None:
    """The broadcast path carries adapters too (``engine.weight_sync: gloo|nccl`` with LoRA is no longer refused);
    what is still refused names its field."""
    from agentrl.controller.config import load_config
    from agentrl.inference.config import EngineConfig

    root = Path(__file__).resolve().parents[2]
    for sync in ("gloo", "nccl"):
        cfg = load_config(root / "configs/quickstart.yaml",
                          ["trainer.lora.rank=16", f"engine.weight_sync={sync}", "engine.replicas=2"])
        assert cfg.trainer.lora.rank == 16 and cfg.engine.resolved_weight_sync() == sync
        assert from_dict(EngineConfig, {"weight_sync": sync, "lora": {"r": 8}}).resolved_lora() == {"r": 8}
    with pytest.raises(ConfigError, match=r"trainer.lora needs engine.backend: vllm \(got remote\)"):
        load_config(root / "configs/quickstart.yaml",
                    ["trainer.lora.rank=16", "engine.backend=remote", "engine.urls=[http://127.0.0.1:8000]"])
    with pytest.raises(ConfigError, match=r"lora: the remote backend cannot serve versioned adapters exactly"):
        from_dict(EngineConfig, {"backend": "remote", "urls": ["http://127.0.0.1:8000"], "lora": {"r": 8}})
    cfg = load_config(root / "configs/tooluse.yaml", ["trainer.lora.rank=16"])
    assert cfg.trainer.lora.rank == 16 and cfg.trainer.lora.target_modules[0] == "q_proj"
