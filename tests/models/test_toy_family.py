"""A family is a folder: a third family, written here into a temporary package and registered by
this test, renders an mp4 through the CLI and runs a live avatar session, with no other file of
the project knowing it. Its frames are the photo, brighter while the audio is loud."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import av
import numpy as np
import pytest

from talkloop.agent.clock import ManualClock
from talkloop.agent.frames import AudioFrame, VideoFrame
from talkloop.agent.session import AvatarConfig, AvatarSession
from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.cli import main
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models import spec as spec_mod
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.rtc.app import live_config_dict

from support import advance, drain, make_reference, tone

pytestmark = pytest.mark.unit

INIT = """
    from pathlib import Path

    from talkloop.pipeline.models.spec import FamilySpec, SizeRule, StateField

    SPEC = FamilySpec(
        name="toy",
        package=__name__,
        summary="a test's toy: the photo, brighter while the audio is loud",
        size_rule=SizeRule(16, 32, 256),
        native_sizes=((64, 48),),
        state_fields=(StateField("photo", "(H, W, 3) the reference image, as a tensor"),),
        live_schedule={"first_len": 1, "n_len": 2, "i_len": 0, "ctx_len": 1},
    )
"""

FAMILY = """
    import numpy as np
    import torch
    from pydantic import BaseModel

    from talkloop.pipeline.core.graph import Phase
    from talkloop.pipeline.core.module import Module
    from talkloop.pipeline.core.stage import Stage
    from talkloop.pipeline.models.registry import finish_modules
    from talkloop.pipeline.reference import fit_array


    class WindowConfig(BaseModel):
        sample_rate: int = 16000
        window_samples: int = 640  # 40 ms of audio per frame
        lookahead_samples: int = 0


    class Reference(Stage):
        name = "toy_reference"
        reads = ("reference_image",)
        writes = ("photo",)

        def run(self, ctx):
            ctx.write("photo", torch.from_numpy(ctx.read("reference_image").copy()))


    class Loudness(Stage):
        name = "toy_loudness"
        reads = ("audio_windows",)
        writes = ("latents", "chunk_audio")
        needs = ("audio_encoder",)

        def run(self, ctx):
            rms = np.sqrt(np.mean(ctx.read("audio_windows") ** 2, axis=1, keepdims=True))
            loud = ctx.module("audio_encoder").net(torch.from_numpy(rms.astype(np.float32)))
            ctx.write("latents", loud)
            ctx.write("chunk_audio", loud)


    class Anchor(Stage):  # I chunks: the N chunk's own frames
        name = "toy_anchor"
        reads = ("next_latents", "job")
        writes = ("latents",)

        def run(self, ctx):
            ctx.write("latents", ctx.read("next_latents")[: ctx.read("job").length])


    class Paint(Stage):
        name = "toy_paint"
        reads = ("segment_latents", "photo")
        writes = ("frames",)

        def run(self, ctx):
            gain = 1.0 + ctx.read("segment_latents").float().clamp(0, 1).numpy()[:, :, None, None]
            image = ctx.read("photo").numpy().astype(np.float32)[None]
            ctx.write("frames", np.clip(image * gain, 0, 255).astype(np.uint8))


    def load_modules(config):
        gain = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            gain.weight.fill_(4.0)
        return finish_modules({"audio_encoder": Module("audio_encoder", WindowConfig(), gain)}, config)


    def phases(config):
        return {
            "init": Phase("init", frozenset({"reference_image", "prompt"}), [Reference()]),
            "prompt": Phase("prompt", frozenset({"prompt"}), []),
            "n_chunk": Phase("n_chunk", frozenset({"job", "seed", "audio_windows"}), [Loudness()]),
            "i_chunk": Phase(
                "i_chunk", frozenset({"job", "seed", "next_latents", "next_audio"}), [Anchor()]
            ),
            "publish": Phase(
                "publish",
                frozenset({"segment_latents", "segment_audio", "segment_start", "seed"}),
                [Paint()],
            ),
        }


    def load_reference(source, width, height):
        if source is None:
            y, x = np.mgrid[0:height, 0:width]
            source = np.stack([x * 2, y * 2, np.full_like(x, 60)], -1).astype(np.uint8)
        if not isinstance(source, np.ndarray):
            from talkloop.pipeline.reference import load_reference as load_fitted

            return load_fitted(source, width, height)
        return fit_array(source, width, height)


    def installed_weights():
        return None
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The toy family: a package in a temporary folder, on the path, registered."""
    package = tmp_path / "toy_family_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(INIT))
    (package / "family.py").write_text(textwrap.dedent(FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    spec = importlib.import_module("toy_family_pkg").SPEC
    spec_mod.register(spec)
    yield spec
    spec_mod.unregister("toy")


def test_the_toy_family_is_known_everywhere_a_family_is_named(toy) -> None:
    assert "toy" in spec_mod.family_names()
    config = build_config(model={"family": "toy"})
    assert (config.video.width, config.video.height) == (64, 48)  # its own default size
    with pytest.raises(Exception, match="unsupported width 40 for the toy family"):
        build_config(model={"family": "toy"}, video={"width": 40, "height": 48})
    live = build_config(**live_config_dict({"model": {"family": "toy"}}))
    assert (live.schedule.n_len, live.schedule.i_len) == (2, 0)


def test_the_toy_family_renders_an_mp4(toy, tmp_path: Path) -> None:
    out = tmp_path / "toy.mp4"
    assert main(["render", "--family", "toy", "--audio", str(HELLO_WAV), "--out", str(out)]) == 0
    with av.open(str(out)) as f:
        video = f.streams.video[0]
        assert (video.codec_context.width, video.codec_context.height) == (64, 48)
        assert f.streams.audio
        frames = [fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)]
    brightness = np.array([fr.mean() for fr in frames])
    assert len(frames) > 100  # the whole clip (8.8 s at 25 fps)
    # the photo brightens while the speech is loud: the frames are not all alike
    assert brightness.max() > brightness.min() + 20


def test_the_toy_family_runs_a_live_session(toy) -> None:
    config = build_config(**live_config_dict({"model": {"family": "toy"}}))
    pipeline = build_pipeline(config)
    rate = 16000
    speech = tone(rate, rate, hz=220, amp=0.5) * (np.arange(rate) > rate // 2)  # quiet, loud
    clock = ManualClock()

    async def body() -> list:
        avatar = AvatarSession(
            pipeline, make_reference(64, 48), config=AvatarConfig(playout_delay_ms=200), clock=clock
        )
        avatar.start()
        out: list = []
        consumer = asyncio.create_task(drain(avatar, out))
        data = np.rint(speech * 32767).astype("<i2")
        for i in range(0, data.shape[0], rate // 50):
            avatar.push_audio(AudioFrame(data[i : i + rate // 50].tobytes(), rate, 1))
        avatar.end_of_segment()
        await advance(avatar, clock, 1.6)
        consumer.cancel()
        await avatar.close()
        return out

    out = asyncio.run(body())
    video = [f for f in out if isinstance(f, VideoFrame)]
    assert len(video) >= 30 and {f.rgb.shape for f in video} == {(48, 64, 3)}
    assert [f.index for f in video] == list(range(len(video)))
    assert any(isinstance(f, AudioFrame) for f in out)
    means = np.array([f.rgb.mean() for f in video])
    assert means.max() > means.min() + 20  # the loud half brightened the photo
