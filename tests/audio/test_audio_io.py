"""load_audio, resample and the PCM helpers against files made on the fly with PyAV."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from talkloop.pipeline.audio.io import (
    float_to_pcm16,
    load_audio,
    pcm16_to_float,
    resample,
    write_wav,
)
from talkloop.pipeline.core.errors import InputError

from support import tone

pytestmark = pytest.mark.unit

SR = 16000  # the rate the pipeline asks for


def encode(path: Path, samples: np.ndarray, rate: int, codec: str, fmt: str | None = None) -> Path:
    """Encode ``(n, channels)`` float samples with PyAV (any codec/container it has)."""
    layout = "mono" if samples.shape[1] == 1 else "stereo"
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=rate, layout=layout)
        size = s.codec_context.frame_size or 1024
        fmt_name = s.codec_context.format.name
        for i in range(0, samples.shape[0], size):
            blk = samples[i : i + size]
            arr = np.ascontiguousarray(blk.T if fmt_name.endswith("p") else blk.reshape(1, -1))
            if fmt_name.startswith("s16"):
                arr = (arr * 32767).astype(np.int16)
            elif fmt_name.startswith("s32"):
                arr = (arr * 2147483647).astype(np.int32)
            frame = av.AudioFrame.from_ndarray(arr, format=fmt_name, layout=layout)
            frame.sample_rate = rate
            frame.pts = i
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return path


def best_corr(y: np.ndarray, ref: np.ndarray, max_lag: int) -> tuple[float, int]:
    """Highest normalised correlation of y against ref over lags in [-max_lag, max_lag]."""
    best = (-1.0, 0)
    for lag in range(-max_lag, max_lag + 1, 1):
        a = y[max(0, lag) :]
        b = ref[max(0, -lag) :]
        m = min(a.shape[0], b.shape[0])
        c = float(np.corrcoef(a[:m], b[:m])[0, 1])
        best = max(best, (c, lag))
    return best


@pytest.mark.parametrize("rate", [8000, 16000, 44100, 48000])
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("sample_fmt", ["int16", "float"])
def test_wav_any_rate_channels_and_sample_format(tmp_path, rate, channels, sample_fmt):
    x = tone(rate, rate)  # one second
    stereo = np.stack([x] * channels, axis=1)
    path = tmp_path / "a.wav"
    if sample_fmt == "int16":
        write_wav(path, stereo if channels > 1 else x, rate)
    else:
        encode(path, stereo, rate, "pcm_f32le", "wav")
    y = load_audio(path, SR)
    assert y.dtype == np.float32 and y.ndim == 1
    assert abs(y.shape[0] - SR) <= 2
    # Identical channels average to the same signal: amplitude 0.5, not FFmpeg's +3 dB 0.707.
    assert abs(float(np.abs(y[100:-100]).max()) - 0.5) < 0.01
    ref = tone(y.shape[0], SR)
    corr = np.corrcoef(y[200:-200], ref[200:-200])[0, 1]
    assert corr > 0.999


def test_stereo_downmix_is_the_channel_mean_and_stays_in_range(tmp_path):
    x = tone(SR, SR, amp=0.99)
    write_wav(tmp_path / "same.wav", np.stack([x, x], 1), SR)
    write_wav(tmp_path / "anti.wav", np.stack([x, -x], 1), SR)
    same = load_audio(tmp_path / "same.wav", SR)
    assert float(np.abs(same).max()) == pytest.approx(0.99, abs=1e-3)  # no clipping, no gain
    assert float(np.abs(load_audio(tmp_path / "anti.wav", SR)).max()) < 1e-3


@pytest.mark.parametrize(
    ("name", "codec", "fmt", "rate", "max_lag"),
    [
        ("a.flac", "flac", None, 44100, 0),
        ("a.mp3", "libmp3lame", None, 44100, 1200),
        ("a.ogg", "libopus", "ogg", 48000, 400),
        ("a.m4a", "aac", "mp4", 48000, 400),
        ("a.mkv", "aac", "matroska", 22050, 1200),
    ],
)
def test_compressed_formats(tmp_path, name, codec, fmt, rate, max_lag):
    x = tone(rate, rate, hz=330.0)
    y = load_audio(encode(tmp_path / name, np.stack([x, x], 1), rate, codec, fmt), SR)
    assert y.dtype == np.float32 and float(np.abs(y).max()) <= 1.0
    assert abs(y.shape[0] - SR) < 0.1 * SR  # codecs pad to whole frames
    corr, lag = best_corr(y[:12000], tone(12000, SR, hz=330.0), max_lag)
    assert corr > 0.98, (corr, lag)


def test_audio_track_of_a_video_file(tmp_path):
    path = tmp_path / "clip.mp4"
    rate = 48000
    x = tone(rate, rate)
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=25)
        v.width, v.height, v.pix_fmt = 64, 64, "yuv420p"
        a = c.add_stream("aac", rate=rate, layout="mono")
        for j in range(25):
            f = av.VideoFrame.from_ndarray(np.full((64, 64, 3), j * 8, np.uint8), format="rgb24")
            f.pts = j
            for p in v.encode(f):
                c.mux(p)
        for i in range(0, rate, 1024):
            f = av.AudioFrame.from_ndarray(x[None, i : i + 1024], format="fltp", layout="mono")
            f.sample_rate, f.pts = rate, i
            for p in a.encode(f):
                c.mux(p)
        for s in (v, a):
            for p in s.encode(None):
                c.mux(p)
    y = load_audio(path, SR)
    assert abs(y.shape[0] - SR) < 0.05 * SR
    assert best_corr(y[:12000], tone(12000, SR), 400)[0] > 0.98


# -- bad input -----------------------------------------------------------------------------------


def _bad(tmp_path: Path, case: str) -> Path:
    if case == "missing":
        return tmp_path / "nope.wav"
    if case == "directory":
        (tmp_path / "dir.wav").mkdir()
        return tmp_path / "dir.wav"
    if case == "zero_bytes":
        (tmp_path / "zero.wav").write_bytes(b"")
        return tmp_path / "zero.wav"
    if case == "png":
        Image.new("RGB", (8, 8)).save(tmp_path / "face.png")
        return tmp_path / "face.png"
    if case == "text":
        (tmp_path / "notes.mp3").write_text("this is not audio\n" * 20)
        return tmp_path / "notes.mp3"
    if case == "no_samples":
        write_wav(tmp_path / "silent.wav", np.zeros(0, np.float32), SR)
        return tmp_path / "silent.wav"
    if case == "truncated_header":
        write_wav(tmp_path / "full.wav", tone(SR, SR), SR)
        (tmp_path / "cut.wav").write_bytes((tmp_path / "full.wav").read_bytes()[:30])
        return tmp_path / "cut.wav"
    if case == "corrupt_stream":
        # A valid m4a whose middle third is random bytes: the demuxer opens it, decoding fails.
        src = encode(tmp_path / "ok.m4a", tone(SR * 2, SR)[:, None], SR, "aac", "mp4")
        data = bytearray(src.read_bytes())
        n = len(data)
        data[n // 3 : 2 * n // 3] = np.random.default_rng(0).bytes(2 * n // 3 - n // 3)
        (tmp_path / "bad.m4a").write_bytes(bytes(data))
        return tmp_path / "bad.m4a"
    if case == "garbage_after_header":
        src = encode(tmp_path / "ok.flac", tone(SR, SR)[:, None], SR, "flac")
        data = src.read_bytes()
        noise = np.random.default_rng(1).bytes(len(data) - 200)
        (tmp_path / "bad.flac").write_bytes(data[:200] + noise)
        return tmp_path / "bad.flac"
    raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("missing", "not found"),
        ("directory", "is a directory"),
        ("zero_bytes", "empty"),
        ("png", "no audio stream"),
        ("text", "not a readable audio"),
        ("no_samples", "zero samples"),
        ("truncated_header", "not a readable audio"),
        ("corrupt_stream", "corrupt audio data"),
        ("garbage_after_header", "zero samples"),
    ],
)
def test_bad_input_names_problem_and_file(tmp_path, case, problem):
    path = _bad(tmp_path, case)
    with pytest.raises(InputError) as info:
        load_audio(path, SR)
    msg = str(info.value)
    assert problem in msg
    assert path.name in msg
    assert "\n" not in msg


# -- helpers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), [(48000, 16000), (16000, 48000), (44100, 16000)])
def test_resample_keeps_length_and_signal(src, dst):
    y = resample(tone(src, src), src, dst)
    assert y.dtype == np.float32
    assert abs(y.shape[0] - dst) <= 1
    ref = tone(y.shape[0], dst)
    assert np.corrcoef(y[100:-100], ref[100:-100])[0, 1] > 0.999


def test_resample_same_rate_is_a_copy():
    x = tone(100, SR)
    y = resample(x, SR, SR)
    np.testing.assert_array_equal(x, y)
    assert y is not x


def test_pcm16_round_trip_and_wav(tmp_path):
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0], np.float32)
    pcm = float_to_pcm16(x)
    assert pcm.tolist() == [0, 16384, -16384, 32767, -32767, 32767]  # clipped, rounded
    back = pcm16_to_float(pcm.tobytes())
    np.testing.assert_allclose(back, np.clip(x, -1, 1), atol=1 / 32768)
    write_wav(tmp_path / "x.wav", tone(SR, SR), SR)
    np.testing.assert_allclose(load_audio(tmp_path / "x.wav", SR), tone(SR, SR), atol=1e-4)
