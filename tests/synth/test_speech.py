"""espeak-ng phoneme events, visemes and motion."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.audio.espeak import ESPEAK_RATE, speak
from talkloop.pipeline.core.clock import frames_for_samples
from talkloop.pipeline.synth.visemes import is_pause, mouth_tracks

pytestmark = pytest.mark.unit


def test_phoneme_events_are_monotonic_and_span_the_audio() -> None:
    sp = speak("Hello there, I am your avatar.", "en-us+f3", rate=170)
    assert sp.sample_rate == ESPEAK_RATE
    assert len(sp.phonemes) >= 15 and len(sp.phonemes) == len(sp.starts)
    assert np.all(np.diff(sp.starts) >= 0)
    n = len(sp.audio)
    assert 1.0 < n / ESPEAK_RATE < 3.5
    assert sp.starts[0] < 0.1 * n and sp.starts[-1] > 0.8 * n  # the events cover the utterance
    assert {"h", "l"} <= set(sp.phonemes)


def test_rate_changes_duration() -> None:
    slow = speak("The quick brown fox jumps over the lazy dog.", "en", rate=120)
    fast = speak("The quick brown fox jumps over the lazy dog.", "en", rate=260)
    assert len(slow.audio) > 1.6 * len(fast.audio)


def test_silence_closes_mouth_and_speech_opens_it() -> None:
    sr, fps = 16000, 25
    # 1 s silence, 1 s of "a", 1 s silence.
    tracks = mouth_tracks(["_", "a", "_"], np.array([0, sr, 2 * sr]), 3 * sr, sr, fps)
    assert len(tracks.mouth_open) == frames_for_samples(3 * sr, fps, sr)
    assert tracks.mouth_open[:20].max() < 0.02
    assert tracks.mouth_open[-20:].max() < 0.02
    assert tracks.mouth_open[30:45].min() > 0.6
    assert tracks.speaking[30:45].all() and not tracks.speaking[:20].any()


def test_bilabials_close_the_mouth_between_vowels() -> None:
    sr, fps = 16000, 25
    ph = ["a", "m", "a"]
    starts = np.array([0, int(0.3 * sr), int(0.42 * sr)])
    tracks = mouth_tracks(ph, starts, int(0.8 * sr), sr, fps)
    m_frame = int(0.36 * fps - 0.03 * fps)  # the mouth leads the audio a little
    assert tracks.mouth_open[m_frame] < 0.35 * tracks.mouth_open[3]


def test_pause_mnemonics() -> None:
    assert is_pause("_") and is_pause("_:") and is_pause("||")
    assert not is_pause("a") and not is_pause("m")
