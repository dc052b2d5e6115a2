from dataclasses import dataclass, field
from typing import Literal

import pytest

from agentrl.config import ConfigError, apply_overrides, from_dict, load


@dataclass
class Optim:
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])


@dataclass
class Cfg:
    name: str
    steps: int = 10
    mode: Literal["sync", "async"] = "sync"
    optim: Optim = field(default_factory=Optim)
    tags: dict[str, str] = field(default_factory=dict)
    seed: int | None = None

    def validate(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_loads_nested_and_defaults(tmp_path):
    c = load(Cfg, write(tmp_path, "name: x\noptim:\n  lr: 1\n"))
    assert c.name == "x" and c.optim.lr == 1.0 and isinstance(c.optim.lr, float) and c.optim.betas == [0.9, 0.99]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("name: x\nstepz: 3\n", "stepz: unknown key (did you mean 'steps'?)"),
        ("name: x\nsteps: three\n", "steps: expected int, got str 'three'"),
        ("steps: 3\n", "name: required field is missing"),
        ("name: x\nmode: fast\n", "mode: expected one of 'sync', 'async'"),
        ("name: x\noptim:\n  lr: fast\n", "optim.lr: expected float"),
        ("name: x\noptim:\n  betas: [0.9, x]\n", "optim.betas[1]: expected float"),
        ("name: x\nsteps: true\n", "steps: expected int, got bool"),
        ("name: x\nsteps: 0\n", "<root>: steps must be >= 1"),
        ("- a\n- b\n", "expected a mapping"),
        ("name: [unclosed\n", "invalid YAML"),
        # NaN passes every "x < 0" bound (each comparison is False) and then poisons what reads it: never a value
        ("name: x\noptim:\n  lr: .nan\n", "optim.lr: NaN is not a value"),
        ("name: x\noptim:\n  betas: [0.9, .NaN]\n", "optim.betas[1]: NaN is not a value"),
        # PyYAML keeps the last of a key given twice, silently: the config trained with a value nobody noticed
        ("name: x\nsteps: 1\nsteps: 2\n", "found the key 'steps' twice (first on line 2)"),
        ("name: x\noptim:\n  lr: 0.1\n  betas: [0.9, 0.99]\n  lr: 0.2\n", "found the key 'lr' twice (first on line 3)"),
    ],
)
def test_errors_name_file_and_key(tmp_path, text, needle):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load(Cfg, p)
    assert str(p) in str(e.value)
    assert needle in str(e.value)


def test_a_key_merged_in_may_be_overridden(tmp_path):
    p = write(tmp_path, "name: x\noptim:\n  <<: {lr: 0.1, betas: [0.9, 0.99]}\n  lr: 0.2\n")
    assert load(Cfg, p).optim.lr == 0.2


def test_overrides(tmp_path):
    c = load(Cfg, write(tmp_path, "name: x\n"), ["steps=5", "optim.lr=0.5", "seed=null", "tags.a=b", "mode=async"])
    assert (c.steps, c.optim.lr, c.seed, c.tags, c.mode) == (5, 0.5, None, {"a": "b"}, "async")
    with pytest.raises(ConfigError, match="steps: expected int"):
        load(Cfg, write(tmp_path, "name: x\n"), ["steps=abc"])
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_overrides({}, ["steps"])
    with pytest.raises(ConfigError, match="optim.lr: NaN"):
        load(Cfg, write(tmp_path, "name: x\n"), ["optim.lr=.nan"])
    assert load(Cfg, write(tmp_path, "name: x\n"), ["optim.lr=.inf"]).optim.lr == float("inf")  # a bound's job


def test_float_in_exponent_form(tmp_path):
    # YAML 1.1 reads 1e-3 as a string; a float field takes it, and still rejects words.
    c = load(Cfg, write(tmp_path, "name: x\noptim:\n  lr: 1e-3\n"), ["optim.lr=2e-4"])
    assert c.optim.lr == 2e-4
    with pytest.raises(ConfigError, match="optim.lr: expected float, got str 'e5'"):
        load(Cfg, write(tmp_path, "name: x\n"), ["optim.lr=e5"])


def test_a_config_that_is_not_utf8_text_is_a_config_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"name: x\x00\xff\xfe\n")
    with pytest.raises(ConfigError, match=f"{p}: not UTF-8 text"):
        load(Cfg, p)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load(Cfg, tmp_path / "nope.yaml")


def test_from_dict_optional():
    assert from_dict(Cfg, {"name": "a", "seed": 3}).seed == 3
