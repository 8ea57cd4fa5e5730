"""The portrait motion net on an exported backend (``--backend``): the shipped weights as graphs
make the frames torch makes, on the live schedule, and ``auto`` measures once and remembers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from talkloop.pipeline.backends import available_backends
from talkloop.pipeline.backends.report import describe
from talkloop.pipeline.models.registry import build_pipeline, load_reference
from talkloop.pipeline.models.shared.a2v_graph import A2VGraph

from support import CollectSink, live_config, psnr, tiny_config

pytestmark = pytest.mark.e2e

EXPORTED = [b for b in ("onnxruntime", "openvino") if b in available_backends()]
SIZE = 192
SECONDS = 1.6


def _config(backend: str, **model):
    base = tiny_config(
        video={"width": SIZE, "height": SIZE},
        sampler={"steps": 3, "audio_guidance": 2.0},
        model={
            "family": "portrait",
            "preset": "default",
            "untrained": False,
            "backend": backend,
            **model,
        },
    )
    return live_config(base)


def _frames(config, speech) -> tuple[np.ndarray, dict]:
    pipeline = build_pipeline(config)
    sink = CollectSink()
    session = pipeline.open_session(load_reference(config, None), "", [sink], seed=3)
    session.push_audio(speech[: int(SECONDS * config.audio.sample_rate)])
    session.end_audio()
    while session.step():
        pass
    session.close()
    return sink.all_frames(), describe(pipeline.modules, "float32")


@pytest.fixture(scope="module")
def torch_frames(speech) -> np.ndarray:
    return _frames(_config("torch"), speech)[0]


@pytest.mark.parametrize("backend", EXPORTED)
def test_the_motion_graph_makes_the_frames_torch_makes(
    backend, speech, torch_frames, backend_cache
) -> None:
    frames, runtime = _frames(_config(backend), speech)
    assert runtime["backend"] == backend
    assert frames.shape == torch_frames.shape and frames.shape[0] >= 35
    assert np.abs(np.diff(frames.astype(np.int16), axis=0)).mean() > 0.1  # the face moves
    # The same motion to ~1e-5: the frames differ in a few pixels by a level at most.
    assert psnr(frames, torch_frames) > 50


def test_auto_times_the_backends_once_and_keeps_its_choice(speech, backend_cache) -> None:
    if len(EXPORTED) == 0:
        pytest.skip("no graph runtime installed")
    config = _config("auto", dtype="float32")
    pipeline = build_pipeline(config)
    chosen = describe(pipeline.modules, "float32")["backend"]
    files = list(backend_cache.glob("auto-*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["backend"] == chosen
    assert set(record["probe_s"]) == {"torch", *EXPORTED}
    assert chosen == min(record["probe_s"], key=record["probe_s"].__getitem__)
    net = pipeline.modules["a2v"].net
    assert isinstance(net.__dict__.get("forward"), A2VGraph) == (chosen != "torch")
    again = build_pipeline(config)  # the second load reads the choice: nothing is timed again
    assert describe(again.modules, "float32")["backend"] == chosen
    assert list(backend_cache.glob("auto-*.json")) == files
    assert json.loads(files[0].read_text()) == record


@pytest.mark.parametrize("backend", EXPORTED)
def test_the_graph_runs_beside_torch_modules_that_auto_put_in_bf16(
    backend, speech, monkeypatch, backend_cache
) -> None:
    """Where ``--dtype auto`` picks bf16 (a CPU that computes it), the audio and text encoders
    compute in bf16 and the motion graph in float32: one pipeline, whose dtype is torch's."""
    import talkloop.pipeline.models.registry as registry

    # what auto would pick on such a CPU; the backend probe still runs its bf16 sessions (a graph
    # first exported inside one must still be float32)
    monkeypatch.setattr(registry, "resolve_dtype", lambda *a, **k: "bfloat16")
    frames, _ = _frames(_config("auto", dtype="auto"), speech)
    pipeline = build_pipeline(_config("auto", dtype="auto"))
    assert pipeline.compute_dtype == "bfloat16"
    assert describe(pipeline.modules, pipeline.compute_dtype)["backend"] in {"torch", *EXPORTED}
    assert frames.shape[0] >= 35 and np.abs(np.diff(frames.astype(np.int16), axis=0)).mean() > 0.1
