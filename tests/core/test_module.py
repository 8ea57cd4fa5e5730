"""Module checkpoints: safetensors + JSON config, round trip, and mismatches named precisely."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from talkloop.pipeline.core.errors import CheckpointError, ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.registry import build_pipeline, load_modules
from talkloop.pipeline.models.shared.a2v import A2VDiT
from talkloop.pipeline.models.studio.family import StudioConfig

from support import CollectSink, make_reference, tiny_config

pytestmark = pytest.mark.unit


def a2v_module(**changes) -> Module:
    cfg = StudioConfig.tiny().a2v.model_copy(update=changes)
    torch.manual_seed(0)
    return Module("a2v", cfg, A2VDiT(cfg))


def test_round_trip_through_a_folder_gives_identical_frames(
    tmp_path: Path, tiny_modules, speech
) -> None:
    for module in tiny_modules.values():
        module.save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"a2v.safetensors", "a2v.json", "vae.json"}
    config = tiny_config(model={"untrained": False, "weights": str(tmp_path)})
    loaded = load_modules(config)
    frames = []
    for modules in (tiny_modules, loaded):
        sink = CollectSink()
        build_pipeline(config, modules).open_session(make_reference(), sinks=[sink]).render(
            [speech[:16000]]
        )
        frames.append(sink.all_frames())
    assert np.array_equal(frames[0], frames[1])


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path: Path) -> None:
    a2v_module().save(tmp_path)
    wider = a2v_module(dim=48)
    with pytest.raises(CheckpointError) as err:
        wider.load(tmp_path)
    msg = str(err.value)
    assert "a2v.safetensors" in msg
    assert "has shape (" in msg and "in the checkpoint but (" in msg and "in the model" in msg
    # the named tensor really is the first one whose shape differs
    name = msg.split("tensor '")[1].split("'")[0]
    assert wider.net.state_dict()[name].shape != a2v_module().net.state_dict()[name].shape


def test_config_mismatch_without_shape_change_names_the_field(tmp_path: Path) -> None:
    a2v_module().save(tmp_path)
    with pytest.raises(CheckpointError, match=r"audio_radius is 2.0 in the checkpoint but 3.0"):
        a2v_module(audio_radius=3).load(tmp_path)


def test_missing_extra_and_corrupt_checkpoints(tmp_path: Path) -> None:
    m = a2v_module()
    with pytest.raises(CheckpointError, match="not found"):
        m.load(tmp_path)
    m.save(tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "a2v.safetensors"))
    first = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != first}, str(tmp_path / "a2v.safetensors"))
    with pytest.raises(CheckpointError, match=f"tensor '{first}' is missing"):
        m.load(tmp_path)
    save_file({**tensors, "extra.weight": torch.zeros(1)}, str(tmp_path / "a2v.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected tensor 'extra.weight'"):
        m.load(tmp_path)
    (tmp_path / "a2v.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read"):
        m.load(tmp_path)


def test_weights_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_modules(tiny_config(model={"untrained": False, "weights": str(tmp_path / "nope")}))
    with pytest.raises(CheckpointError, match="has no vae.json"):
        load_modules(tiny_config(model={"untrained": False, "weights": str(tmp_path)}))
    with pytest.raises(ConfigError, match="not both"):
        tiny_config(model={"untrained": True, "weights": str(tmp_path)})
