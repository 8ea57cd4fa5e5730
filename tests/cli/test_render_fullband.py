"""`talkloop render` writes the audio file's full band into the mp4 (48 kHz), while the model
reads it at 16 kHz; the file is decoded for the mp4 as the render goes (AudioReader)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from talkloop.pipeline.audio.io import write_wav
from talkloop.pipeline.audio.reader import AudioReader
from talkloop.pipeline.cli import main

from support import band_share, tiny_args, tone

OUT = 48000
TINY = [*tiny_args(), "--steps", "2"]


@pytest.mark.unit
def test_the_reader_serves_consecutive_ranges_of_the_whole_file(tmp_path: Path) -> None:
    x = tone(24000, 24000, hz=440, amp=0.3)
    wav = tmp_path / "t.wav"
    write_wav(wav, x, 24000)
    reader = AudioReader(wav, OUT)
    parts = [reader.read(s, n) for s, n in ((0, 1000), (1000, 30000), (31000, 20000))]
    reader.close()
    got = np.concatenate(parts)
    assert got.shape[0] == 51000  # past the file's 48000 samples: zeros
    assert np.abs(got[48100:]).max() == 0
    ideal = tone(48000, OUT, hz=440, amp=0.3)
    assert np.abs(got[100:47900] - ideal[100:47900]).max() < 2e-3  # PCM16 and the filter
    again = AudioReader(wav, OUT)
    again.read(10, 5)
    with pytest.raises(ValueError, match="in order"):
        again.read(0, 5)  # what was read is gone
    again.close()


@pytest.mark.e2e
def test_render_keeps_a_10khz_tone(tmp_path: Path, capsys) -> None:
    wav = tmp_path / "tone.wav"
    write_wav(wav, tone(2 * OUT, OUT, hz=10000, amp=0.3), OUT)
    out = tmp_path / "out.mp4"
    assert main(["render", "--audio", str(wav), "--out", str(out), *TINY, "--quiet"]) == 0
    with av.open(str(out)) as c:
        rate = c.streams.audio[0].codec_context.sample_rate
        frames = sum(1 for _ in c.decode(video=0))
    with av.open(str(out)) as c:
        audio = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])
    assert rate == OUT
    assert frames == 50  # 2 s at 25 fps, and the audio as long (AAC priming aside): one clock
    assert abs(audio.shape[0] / OUT - 2.0) <= 1024 / OUT + 1 / 25
    middle = audio[OUT // 2 : OUT // 2 + OUT]
    assert np.sqrt(np.mean(middle**2)) > 0.15  # the tone is there (0.21 rms) ...
    assert band_share(middle, OUT, 9900, 10100) > 0.9  # ... at 10 kHz
