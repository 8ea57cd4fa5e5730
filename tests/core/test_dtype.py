"""The compute dtype: ``auto`` picks bf16 only where the hardware computes it natively."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from talkloop.pipeline.core import config as config_mod
from talkloop.pipeline.core.config import ModelConfig
from talkloop.pipeline.train.config import TrainConfig
from talkloop.pipeline.train.trainer import Trainer

pytestmark = pytest.mark.unit


@pytest.fixture
def cpu_flags(monkeypatch: pytest.MonkeyPatch):
    def set_flags(*flags: str) -> None:
        monkeypatch.setattr(config_mod, "_cpu_flags", lambda: frozenset(flags))

    return set_flags


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("avx2", "avx512f"), "float32"),  # AVX-512 without its bf16 extension: emulated
        (("avx512f", "avx512_bf16"), "bfloat16"),
        (("amx_tile", "amx_bf16"), "bfloat16"),
        ((), "float32"),  # no /proc/cpuinfo (macOS) or no flags line
    ],
)
def test_auto_dtype_follows_the_cpu(cpu_flags, flags, expected) -> None:
    cpu_flags(*flags)
    assert ModelConfig(family="studio").compute_dtype == expected


def test_auto_dtype_on_cuda_and_explicit_choices_are_kept(cpu_flags) -> None:
    cpu_flags()
    assert config_mod.native_bf16("cuda")  # (a cuda ModelConfig needs a GPU to validate)
    assert ModelConfig(dtype="bfloat16").compute_dtype == "bfloat16"
    cpu_flags("avx512_bf16")
    assert ModelConfig(dtype="float32").compute_dtype == "float32"


def test_cpu_flags_are_read_from_proc_cpuinfo() -> None:
    flags = config_mod._cpu_flags()
    assert isinstance(flags, frozenset)
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo on this system")
    if any(line.startswith("flags") for line in text.splitlines()):  # x86 (arm: "Features")
        assert "fpu" in flags  # every x86 CPU lists it
    first = text.split("\n\n")[0]
    model = next((ln for ln in first.splitlines() if ln.startswith("model name")), None)
    if model is not None:  # the bench quotes the model of the first processor
        assert config_mod.cpu_info()["model name"] == model.partition(":")[2].strip()


def test_training_autocast_follows_the_same_rule(cpu_flags, tmp_path) -> None:
    cpu_flags()
    trainer = Trainer(TrainConfig.recipe("tiny"), tmp_path / "a", progress=False)
    with trainer._autocast():
        assert not torch.is_autocast_enabled("cpu")
    cpu_flags("avx512_bf16")
    trainer = Trainer(TrainConfig.recipe("tiny"), tmp_path / "b", progress=False)
    with trainer._autocast():
        assert torch.is_autocast_enabled("cpu")
    forced = Trainer(TrainConfig.recipe("tiny", dtype="float32"), tmp_path / "c", progress=False)
    with forced._autocast():
        assert not torch.is_autocast_enabled("cpu")
