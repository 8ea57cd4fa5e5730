"""Festival's diphone voices as training speech: phones in espeak's names, exact times."""

from __future__ import annotations

import wave

import numpy as np
import pytest

from talkloop.pipeline.audio.festival import ARPABET_TO_ESPEAK, festival_say, festival_speak
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.synth.dataset import make_clip
from talkloop.pipeline.synth.visemes import _CONSONANT, is_pause, is_vowel, viseme_targets

pytestmark = pytest.mark.unit

TEXT = "My mom picked plums by the bay."


def _pitch(audio: np.ndarray, sample_rate: int) -> float:
    """Median autocorrelation pitch of the voiced 50 ms windows, Hz."""
    found, win = [], sample_rate // 20
    for i in range(0, len(audio) - win, win // 2):
        w = audio[i : i + win]
        if np.sqrt(np.mean(w**2)) < 0.02:
            continue
        ac = np.correlate(w, w, "full")[win - 1 :]
        lo, hi = sample_rate // 300, sample_rate // 60
        found.append(sample_rate / (lo + int(np.argmax(ac[lo:hi]))))
    return float(np.median(found))


def test_phones_are_espeak_mnemonics_with_times_inside_the_audio() -> None:
    sp = festival_speak(TEXT)
    assert sp.sample_rate == 16000 and 1.0 < len(sp.audio) / sp.sample_rate < 3.0
    assert len(sp.phonemes) == len(sp.starts) and np.all(np.diff(sp.starts) >= 0)
    assert sp.starts[-1] < len(sp.audio) and not is_pause(sp.phonemes[-1])
    assert set(sp.phonemes) <= set(ARPABET_TO_ESPEAK.values())
    # "My mom picked plums by the bay": eight lip closures, as espeak's p, b and m.
    assert sum(p in ("p", "b", "m") for p in sp.phonemes) == 8
    # Each phone's audio is where its time says: the closures are quieter than the vowels.
    ends = np.append(sp.starts[1:], len(sp.audio))
    rms = [np.sqrt(np.mean(sp.audio[a:b] ** 2)) for a, b in zip(sp.starts, ends, strict=True)]
    vowels = [r for p, r in zip(sp.phonemes, rms, strict=True) if is_vowel(p)]
    closures = [r for p, r in zip(sp.phonemes, rms, strict=True) if p in ("p", "b")]
    assert np.median(closures) < 0.5 * np.median(vowels)


def test_every_mapped_phone_has_its_own_viseme() -> None:
    for arpabet, mnemonic in ARPABET_TO_ESPEAK.items():
        if not is_pause(mnemonic):
            assert _CONSONANT not in viseme_targets(mnemonic), arpabet


def test_same_arguments_same_samples_and_the_rate_and_pitch_are_honoured() -> None:
    a, b = festival_speak(TEXT, f0_mean=90.0), festival_speak(TEXT, f0_mean=90.0)
    assert np.array_equal(a.audio, b.audio) and a.phonemes == b.phonemes
    slow = festival_speak(TEXT, stretch=1.4, f0_mean=90.0)
    assert 1.3 < len(slow.audio) / len(a.audio) < 1.5
    high = festival_speak(TEXT, f0_mean=150.0)
    assert _pitch(high.audio, high.sample_rate) > 1.4 * _pitch(a.audio, a.sample_rate)


def test_empty_text_is_refused_as_empty_not_as_a_missing_voice() -> None:
    with pytest.raises(ConfigError, match="text is empty"):
        festival_speak(' " ')


def test_an_unknown_voice_names_the_package_to_install() -> None:
    with pytest.raises(ConfigError, match="apt-get install"):
        festival_speak(TEXT, voice="no_such_voice")
    # a name that is not a Scheme symbol never reaches festival's script
    with pytest.raises(ConfigError, match="not a Festival voice name"):
        festival_speak(TEXT, voice="ked_diphone)(exit")


def test_festival_say_writes_the_wave_and_the_voices_own_phones(tmp_path) -> None:
    """The lower step the test voices are made with: ARPAbet as the voice names it, pauses
    included, end times rising to the wave's end; a voice festival lacks is refused, not said
    with its default voice."""
    wav = tmp_path / "say.wav"
    segments = festival_say(TEXT, "ked_diphone", wav)
    ends = [end for end, _ in segments]
    names = [name for _, name in segments]
    assert names[0] == names[-1] == "pau" and names.count("m") == 4 and names.count("b") == 2
    assert all(b > a for a, b in zip(ends, ends[1:], strict=False))
    with wave.open(str(wav)) as w:
        assert 0.0 <= w.getnframes() / w.getframerate() - ends[-1] < 0.1  # the wave's end
    with pytest.raises(ConfigError, match="apt-get install"):
        festival_say(TEXT, "no_such_voice", tmp_path / "other.wav")


def test_training_clips_mix_festival_and_espeak_only_when_asked() -> None:
    clips = [make_clip("train", i, seed=2, render=False, festival_share=0.5) for i in range(8)]
    said = [c.voice.startswith("festival:") for c in clips]
    assert 0 < sum(said) < 8
    for clip in clips:
        assert len(clip.phonemes) == len(clip.phoneme_starts)
        assert clip.params["mouth_open"].max() > 0.4
    # The same clip without the option is an espeak clip, as before it existed.
    plain = make_clip("train", said.index(True), seed=2, render=False)
    assert not plain.voice.startswith("festival:")
    # Held-out splits keep their espeak voices.
    assert not make_clip("test", 0, seed=2, render=False, festival_share=1.0).voice.startswith(
        "festival"
    )
