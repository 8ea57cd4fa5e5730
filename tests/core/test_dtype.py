"""The compute dtype: ``auto`` is measured per family (cached), explicit choices are kept, and
built in code a pipeline computes in float32 whatever the CPU has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from talkloop.pipeline.backends import select
from talkloop.pipeline.core import config as config_mod
from talkloop.pipeline.core.config import ModelConfig
from talkloop.pipeline.core.errors import PipelineError
from talkloop.pipeline.models.registry import build_pipeline, load_modules
from talkloop.pipeline.models.studio.recipe import TrainConfig
from talkloop.pipeline.models.studio.train import Trainer

from support import tiny_config

pytestmark = pytest.mark.unit


@pytest.fixture
def cpu_flags(monkeypatch: pytest.MonkeyPatch):
    def set_flags(*flags: str) -> None:
        monkeypatch.setattr(config_mod, "_cpu_flags", lambda: frozenset(flags))

    return set_flags


@pytest.fixture
def probe_seconds(monkeypatch: pytest.MonkeyPatch):
    """Probes are timed by what they return, not by a clock: ``time_probes`` reads the values."""
    calls: list[str] = []

    def fake_time_probes(probes, runs: int = 5) -> dict[str, float]:
        seconds = {}
        for key, probe in probes.items():
            name, seconds[key] = probe()
            calls.append(name)
        return seconds

    monkeypatch.setattr(select, "time_probes", fake_time_probes)
    return calls


def test_code_default_is_float32_on_every_cpu(cpu_flags) -> None:
    cpu_flags("avx512f", "avx512_bf16")
    assert ModelConfig().dtype == "float32"
    cpu_flags("avx2")
    assert ModelConfig().dtype == "float32"


@pytest.mark.parametrize(
    "flags",
    [("avx2", "avx512f"), (), ("fma",)],  # AVX-512 without its bf16 extension: emulated
    ids=["avx512-no-bf16", "no-flags", "avx2-only"],
)
def test_auto_without_native_bf16_is_float32_without_timing(
    cpu_flags, backend_cache, flags
) -> None:
    cpu_flags(*flags)

    def make_probes(candidates):
        raise AssertionError(f"timed {candidates} where bf16 is emulated")

    assert select.resolve_dtype("auto", "cpu", "fam:w", make_probes) == "float32"


@pytest.mark.parametrize("winner", ["float32", "bfloat16"])
def test_auto_with_native_bf16_takes_the_faster_probe_and_caches_it(
    cpu_flags, backend_cache, probe_seconds, winner
) -> None:
    cpu_flags("avx512f", "avx512_bf16")
    seconds = {"float32": 2.0, "bfloat16": 3.0} if winner == "float32" else {"float32": 3.0}
    seconds.setdefault("bfloat16", 1.0)
    made: list[tuple[str, ...]] = []

    def make_probes(candidates):
        made.append(candidates)
        return {c: (lambda c=c: (c, seconds[c])) for c in candidates}

    assert select.resolve_dtype("auto", "cpu", "fam:w", make_probes) == winner
    assert select.resolve_dtype("auto", "cpu", "fam:w", make_probes) == winner
    assert made == [("float32", "bfloat16")]  # the second call read the cache
    (saved,) = backend_cache.glob("dtype-*.json")
    assert json.loads(saved.read_text()) == {"dtype": winner, "probe_s": seconds}
    select.resolve_dtype("auto", "cpu", "fam:other-weights", make_probes)
    assert len(made) == 2  # another identity is timed again


def test_explicit_dtypes_are_kept_and_cuda_auto_is_bf16(cpu_flags, backend_cache) -> None:
    def make_probes(candidates):
        raise AssertionError("an explicit dtype is never timed")

    cpu_flags("avx512_bf16")
    assert select.resolve_dtype("float32", "cpu", "x", make_probes) == "float32"
    cpu_flags()
    assert select.resolve_dtype("bfloat16", "cpu", "x", make_probes) == "bfloat16"
    assert select.resolve_dtype("auto", "cuda", "x", make_probes) == "bfloat16"


@pytest.mark.parametrize("family", ["studio", "portrait"])
def test_auto_probes_the_family_session_in_both_dtypes(
    cpu_flags, backend_cache, monkeypatch, family
) -> None:
    """The probe renders a real session of the family in float32 and on a bf16 copy; the
    modules then load in the winner and the pipeline computes in it."""
    cpu_flags("avx512_bf16")
    rendered: list[str] = []

    def timed(probes, runs: int = 5) -> dict[str, float]:
        seconds = {}
        for name, probe in probes.items():
            probe()  # a real session: it must run in the candidate's dtype
            dtype = probe.pipeline.compute_dtype
            rendered.append(dtype)
            seconds[name] = {"float32": 2.0, "bfloat16": 1.0}[dtype]
        return seconds

    monkeypatch.setattr(select, "time_probes", timed)
    size = 64 if family == "studio" else 128  # the portrait family's smallest frame
    config = tiny_config(
        video={"width": size, "height": size}, model={"family": family, "dtype": "auto"}
    )
    modules = load_modules(config)
    assert sorted(rendered) == ["bfloat16", "float32"]
    assert {m.compute_dtype for m in modules.values()} == {"bfloat16"}
    a2v_weight = next(p for p in modules["a2v"].net.parameters() if p.dim() == 2)
    assert a2v_weight.dtype == torch.bfloat16
    pipeline = build_pipeline(config, modules)
    assert pipeline.compute_dtype == "bfloat16"
    with pipeline.autocast():
        assert torch.is_autocast_enabled("cpu")
    (saved,) = backend_cache.glob("dtype-*.json")
    assert json.loads(saved.read_text())["dtype"] == "bfloat16"
    rendered.clear()
    load_modules(config)  # a second load reads the cached choice
    assert rendered == []


def test_exported_backend_auto_is_float32_without_timing(cpu_flags, backend_cache) -> None:
    from talkloop.pipeline.models.registry import choose_dtype

    cpu_flags("avx512_bf16")
    config = tiny_config(model={"dtype": "auto", "backend": "onnxruntime"})
    assert choose_dtype({}, config) == "float32"


def test_pipeline_with_auto_needs_modules_that_resolved_it(tiny_modules) -> None:
    fresh = {n: m for n, m in tiny_modules.items()}
    saved = {n: m.compute_dtype for n, m in fresh.items()}
    try:
        for m in fresh.values():
            m.compute_dtype = None
        with pytest.raises(PipelineError, match="dtype is auto"):
            build_pipeline(tiny_config(model={"dtype": "auto"}), fresh)
    finally:
        for n, m in fresh.items():
            m.compute_dtype = saved[n]


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


def test_training_autocast_follows_the_hardware(cpu_flags, tmp_path) -> None:
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
