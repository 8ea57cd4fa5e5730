"""The shipped studio weights on each exported backend against float32 torch: the frames of a
held-out clip (default schedule and steps) within 35 dB PSNR overall and 32 dB in the mouth box
(measured: ~43 dB both on onnxruntime and openvino, the int8 decoder being most of the error)."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.backends import available_backends
from talkloop.pipeline.models.registry import build_pipeline

from support import psnr

pytestmark = pytest.mark.e2e

EXPORTED = [b for b in ("onnxruntime", "openvino") if b in available_backends()]
SECONDS = 2.0


class _Frames:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def open(self, info) -> None: ...
    def write(self, video, audio) -> None:
        self.frames.append(video.frames.copy())

    def close(self) -> None: ...
    def abort(self) -> None: ...


@pytest.fixture(scope="module")
def clip():
    from talkloop.pipeline.models.studio.family import installed_weights
    from talkloop.pipeline.synth.dataset import make_clip
    from talkloop.pipeline.synth.renderer import Renderer

    if installed_weights() is None:
        pytest.skip("needs the trained studio weights")
    c = make_clip("test", 0, render=False, augment=False)
    return c, Renderer(c.character, 256).render_neutral()


def _render(backend: str, clip) -> tuple[np.ndarray, dict]:
    from talkloop.pipeline.backends.report import describe
    from talkloop.pipeline.core.config import build_config
    from talkloop.pipeline.render import audio_blocks

    c, reference = clip
    config = build_config(model={"family": "studio", "backend": backend, "dtype": "float32"})
    pipeline = build_pipeline(config)
    sink = _Frames()
    session = pipeline.open_session(reference, c.prompt, [sink], seed=0)
    session.render(audio_blocks(c.audio[: int(SECONDS * 16000)], 16000))
    return np.concatenate(sink.frames), describe(pipeline.modules, "float32")


@pytest.fixture(scope="module")
def torch_frames(clip) -> np.ndarray:
    frames, runtime = _render("torch", clip)
    assert runtime == {"backend": "torch", "dtype": "float32", "int8": []}
    return frames


@pytest.mark.parametrize("backend", EXPORTED)
def test_backend_frames_match_float32_torch(backend, clip, torch_frames) -> None:
    frames, runtime = _render(backend, clip)
    assert runtime == {"backend": backend, "dtype": "float32", "int8": ["vae.decoder"]}
    assert frames.shape == torch_frames.shape and frames.shape[0] == int(SECONDS * 25)
    assert psnr(frames, torch_frames) >= 35.0
    boxes = clip[0].mouth_box[: len(frames)].astype(int)
    mouth = [
        psnr(frames[i, y0:y1, x0:x1], torch_frames[i, y0:y1, x0:x1])
        for i, (x0, y0, x1, y1) in enumerate(boxes)
    ]
    assert float(np.mean(mouth)) >= 32.0 and min(mouth) >= 30.0
    assert not np.array_equal(frames, torch_frames)  # the backend really computed them


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend", EXPORTED)
def test_int8_decoder_matches_float32_on_studio_latents(backend, dtype) -> None:
    """The decoder alone: int8 graph vs torch float32 on the calibration clips' own inputs, with
    the torch side (the encoder that makes the calibration latents) in either dtype: in bf16 it
    computes under autocast (calibration fed it float32 images into bf16 weights before)."""
    import torch

    from talkloop.pipeline.core.config import build_config
    from talkloop.pipeline.models.registry import load_modules
    from talkloop.pipeline.models.studio.backend import calibration_inputs
    from talkloop.pipeline.models.studio.vae import Decoder

    config = build_config(model={"family": "studio", "backend": backend, "dtype": dtype})
    modules = load_modules(config)
    vae = modules["vae"].net
    assert modules["vae"].compute_dtype == dtype
    batches = calibration_inputs(vae, (3, 24, 32, 32))
    worst = np.inf
    with torch.inference_mode():
        for x in batches[::4]:
            x = torch.from_numpy(x)
            want = Decoder.forward(vae.decoder, x.contiguous(memory_format=torch.channels_last))
            got = vae.decoder(x)
            # images in [-1, 1]: peak-to-peak 2
            worst = min(worst, psnr(got.float().numpy(), want.float().numpy(), peak=2.0))
    assert worst >= 35.0
