"""StreamResampler: one streaming resampler for every audio path (agent speech, microphone,
file decoding), and the text check shared by both protocols and the TTS."""

from __future__ import annotations

import av
import numpy as np
import pytest

from talkloop.agent.text import MAX_TEXT_CHARS, TextError, check_text
from talkloop.pipeline.audio.resample import StreamResampler, resample

from support import tone

pytestmark = pytest.mark.unit


def test_a_stream_cut_into_packets_resamples_like_the_whole_buffer() -> None:
    x = tone(48000, 48000)
    res = StreamResampler(16000)
    parts = [res.push(x[i : i + 960], 48000) for i in range(0, x.shape[0], 960)]
    streamed = np.concatenate([*parts, res.flush()])
    whole = resample(x, 48000, 16000)
    assert streamed.shape == whole.shape
    np.testing.assert_allclose(streamed, whole, atol=1e-6)


def test_a_rate_change_flushes_the_old_filter_first() -> None:
    res = StreamResampler(16000)
    a = res.push(tone(2400, 24000), 24000)
    b = res.push(tone(4800, 48000), 48000)  # the 24 kHz filter's tail comes out first
    c = res.flush()
    total = a.size + b.size + c.size
    assert res.from_rate is None
    assert abs(total - (1600 + 1600)) <= 2  # 100 ms of each, nothing lost at the switch


def test_the_output_rate_passes_through_unchanged() -> None:
    x = tone(320, 16000)
    res = StreamResampler(16000)
    np.testing.assert_array_equal(res.push(x, 16000), x)
    assert res.flush().size == 0


def test_decoded_frames_are_averaged_to_mono_without_clipping() -> None:
    stereo = np.stack([np.full(960, 0.9, np.float32), np.full(960, 0.9, np.float32)])
    frame = av.AudioFrame.from_ndarray(stereo, format="fltp", layout="stereo")
    frame.sample_rate = 48000
    res = StreamResampler(48000)
    out = np.concatenate([res.push_frame(frame), res.flush()])
    assert out.shape[0] == 960
    np.testing.assert_allclose(out[100:-100], 0.9, atol=1e-3)  # the mean, not +3 dB


def test_text_check_names_the_problem() -> None:
    assert check_text("hello") == "hello"
    assert check_text("", allow_empty=True) == ""
    with pytest.raises(TextError, match="must be a string") as err:
        check_text(5, "say: field 'text'")
    assert err.value.code == "bad_message"
    with pytest.raises(TextError, match="empty"):
        check_text("   ")
    with pytest.raises(TextError, match=f"at most {MAX_TEXT_CHARS}") as err:
        check_text("a" * (MAX_TEXT_CHARS + 1), "say: field 'text'")
    assert err.value.code == "too_long" and "say: field 'text' is 2001 characters" in str(err.value)
