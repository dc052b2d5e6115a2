"""The GPU/model presets reproduce the published vLLM figures they were derived from, and lay a cluster out."""

from __future__ import annotations

import pytest

from agentrl.simulate.presets import Hardware, engine_model, trainer_fields
from agentrl.simulate.run import SimulationConfig, cost_models


def test_presets_reproduce_the_cited_vllm_figures():
    h100 = engine_model(Hardware(gpu="H100", model="Llama-3.1-8B", gpus=1))
    assert h100.decode_step_s == pytest.approx(6.48e-3, rel=0.03)  # TPOT at concurrency 1, vLLM 0.21
    a100 = engine_model(Hardware(gpu="A100-40GB", model="Llama-3.1-8B", gpus=1))
    assert 1 / a100.decode_step_s == pytest.approx(75, rel=0.05)  # ~75 tokens/s at concurrency 1, vLLM 0.23
    step = h100.decode_step_s + 256 * h100.decode_step_s_per_seq + h100.decode_step_s_per_ktoken * 256 * 500 / 1000
    assert 256 / step == pytest.approx(12_500, rel=0.05)  # peak output tokens/s at 256 sequences


def test_a_per_layer_decode_cost_adds_layers_times_it_to_every_step_and_nothing_else():
    base = engine_model(Hardware(gpu="H200", model="Llama-3.1-8B", gpus=1))
    floor = engine_model(Hardware(gpu="H200", model="Llama-3.1-8B", gpus=1, layer_s=6e-5))
    assert floor.decode_step_s - base.decode_step_s == pytest.approx(32 * 6e-5)
    assert (floor.decode_step_s_per_seq, floor.decode_step_s_per_ktoken, floor.prefill_s_per_token) == (
        base.decode_step_s_per_seq, base.decode_step_s_per_ktoken, base.prefill_s_per_token)


def test_hardware_lays_out_replicas_and_trainer_ranks():
    hw = Hardware(gpu="H800", model="Qwen2.5-7B", gpus=32, trainer_gpus=8, tp=2)
    assert engine_model(hw).replicas == 12 and trainer_fields(hw)["gpus"] == 8
    assert not trainer_fields(hw)["exclusive"]
    colo = Hardware(gpu="H800", model="Qwen2.5-7B", gpus=32)
    assert engine_model(colo).replicas == 32 and trainer_fields(colo) == {
        "flops_per_token": 8 * 7.62e9, "peak_flops": 989e12, "mfu": 0.3, "gpus": 32, "exclusive": True}
    # an explicit engine or trainer field wins over the preset
    from agentrl.simulate.models import EngineModel, TrainerModel

    eng, tr = cost_models(SimulationConfig(hardware=colo, engine=EngineModel(sync_s=9.0), trainer=TrainerModel(mfu=0.5)))
    assert eng.sync_s == 9.0 and eng.replicas == 32 and tr.mfu == 0.5 and tr.gpus == 32


@pytest.mark.parametrize("bad, match", [
    ({"gpu": "V100"}, "hardware.gpu"), ({"model": "gpt-5"}, "hardware.model"),
    ({"gpus": 8, "trainer_gpus": 8}, "trainer_gpus < gpus"), ({"layer_s": -1e-5}, "hardware.layer_s"), ({"gpus": 8, "trainer_gpus": 1, "tp": 2}, "multiple of"),
])
def test_bad_hardware_is_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        Hardware(**bad).validate()
