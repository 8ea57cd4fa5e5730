"""The shipped default model: `talkloop render` with no model flags draws a talking face.

The mouth is read from the decoded mp4 by the readout network that ships with the weights
(trained on studio frames), at the default avatar's mouth: it must open while the speech plays
and close in the pauses around it.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import load_audio, write_wav
from talkloop.pipeline.cli import main
from talkloop.pipeline.models.studio.family import DEFAULT_REFERENCE_SEED, installed_weights

pytestmark = pytest.mark.e2e  # ~20 s on an idle 2-core machine

PAUSE_S, SPEECH_S, FPS = 1.5, 3.0, 25


def test_default_render_opens_the_mouth_for_speech_and_closes_it_in_pauses(
    tmp_path: Path,
) -> None:
    from talkloop.pipeline.models.portrait.params import FrameParams
    from talkloop.pipeline.models.studio.data import mouth_crop_box
    from talkloop.pipeline.models.studio.readout import load_readout, read_frames
    from talkloop.pipeline.synth.character import sample_character
    from talkloop.pipeline.synth.renderer import Renderer

    weights = installed_weights()
    assert weights is not None, "the trained default weights must ship with the package"
    pause = np.zeros(int(PAUSE_S * 16000), np.float32)
    speech = load_audio(HELLO_WAV, 16000)[: int(SPEECH_S * 16000)]
    wav, out = tmp_path / "speech.wav", tmp_path / "out.mp4"
    write_wav(wav, np.concatenate([pause, speech, pause]), 16000)

    assert (
        main(["render", "--family", "studio", "--audio", str(wav), "--out", str(out), "--quiet"])
        == 0
    )

    with av.open(str(out)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    face, mouth, _ = Renderer(sample_character(DEFAULT_REFERENCE_SEED), 256).boxes(
        FrameParams.neutral(1)
    )
    readout, trained = load_readout(weights)
    assert trained
    opening = read_frames(readout, frames, mouth_crop_box(face[0], mouth[0]))[:, 0]

    def mean(a: float, b: float) -> float:
        return float(opening[int(a * FPS) : int(b * FPS)].mean())

    talking = mean(PAUSE_S + 0.2, PAUSE_S + len(speech) / 16000 - 0.2)
    before, after = mean(0.2, PAUSE_S - 0.2), mean(PAUSE_S + SPEECH_S + 0.4, 2 * PAUSE_S + SPEECH_S)
    assert talking > before + 0.1 and talking > after + 0.1, (before, talking, after)
    # Speech opens and closes the mouth: it varies while talking, not only on average.
    assert opening[int((PAUSE_S + 0.2) * FPS) : int((PAUSE_S + SPEECH_S - 0.2) * FPS)].std() > 0.05
