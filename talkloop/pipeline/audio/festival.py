"""Festival (Debian's ``festival``) as a second synthesiser: speech made of a real voice's
recorded diphones, with its phone times, for training data beyond espeak.

espeak-ng's formant synthesis sounds like no person; a diphone voice concatenates pieces of one
speaker's recordings, so its acoustics (glottal pulses, formant transitions, breath) are a
person's while its phone times are exact. :func:`festival_say` runs ``festival --pipe`` once per
utterance and saves the wave and the segment times (``utt.save.segs``: each phone's end time in
seconds); :func:`festival_speak` returns them as an
:class:`~talkloop.pipeline.audio.espeak.Speech` whose phones are espeak-ng's mnemonics
(:data:`ARPABET_TO_ESPEAK`), so everything that reads espeak's phones (visemes, stress) reads
these unchanged. Festival's diphone voices are deterministic: the same arguments give the same
samples.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

from talkloop.pipeline.audio.espeak import Speech
from talkloop.pipeline.audio.pcm import pcm16_to_float
from talkloop.pipeline.core.errors import ConfigError

# Festival's US English phone set (``radio``, ARPAbet in lower case) -> espeak-ng mnemonics,
# the names talkloop/pipeline/synth/visemes.py knows.
ARPABET_TO_ESPEAK = {
    "aa": "A:", "ae": "a", "ah": "V", "ao": "O:", "aw": "aU", "ax": "@", "axr": "3",
    "ay": "aI", "eh": "E", "er": "3:", "ey": "eI", "ih": "I", "iy": "i:", "ow": "oU",
    "oy": "OI", "uh": "U", "uw": "u:",
    "b": "b", "ch": "tS", "d": "d", "dh": "D", "dx": "t", "el": "l", "em": "m", "en": "n",
    "f": "f", "g": "g", "hh": "h", "jh": "dZ", "k": "k", "l": "l", "m": "m", "n": "n",
    "ng": "N", "nx": "n", "p": "p", "r": "r", "s": "s", "sh": "S", "t": "t", "th": "T",
    "v": "v", "w": "w", "y": "j", "z": "z", "zh": "Z",
    "pau": "_", "h#": "_", "#": "_",
}  # fmt: skip
# US English diphone voices of Debian's main archive, by the package that ships them.
VOICE_PACKAGES = {"ked_diphone": "festvox-kdlpc16k", "kal_diphone": "festvox-kallpc16k"}


def festival_say(text: str, voice: str, wav: Path, settings: str = "") -> list[tuple[float, str]]:
    """Have Festival say ``text`` into ``wav`` (RIFF, the voice's own rate).

    Args:
        text: what to say (English; quotes and backslashes are dropped).
        voice: a Festival voice name (``VOICE_PACKAGES`` lists the ones talkloop knows).
        wav: the file to write; the segment times go next to it (``.segs``).
        settings: Scheme lines run after the voice is chosen (prosody).

    Returns:
        Each segment's end time in seconds and its label as the voice names it (ARPAbet, pauses
        included), in order.

    Raises:
        ConfigError: festival or the voice is not installed (the message names the packages),
            the voice's name is not one, the text is empty, or festival failed. Festival itself
            reports a missing voice and goes on with its default one: that is caught here, not
            written as the voice's.
    """
    # The name goes into Festival's Scheme as a symbol: letters, digits and underscores only.
    if not re.fullmatch(r"[A-Za-z0-9_]+", voice):
        raise ConfigError(f"{voice!r} is not a Festival voice name (letters, digits, underscores)")
    package = VOICE_PACKAGES.get(voice, f"the package of the voice {voice}")
    if shutil.which("festival") is None:
        raise ConfigError(
            f"festival is not installed: speech from Festival voices needs "
            f"`apt-get install festival {package}`"
        )
    clean = " ".join(text.replace('"', " ").replace("\\", " ").split())
    if not clean:
        raise ConfigError("festival has nothing to say: the text is empty")
    segs = wav.with_suffix(".segs")
    script = (
        f"(voice_{voice})\n{settings}"
        f'(set! u (utt.synth (Utterance Text "{clean}")))\n'
        f'(utt.save.wave u "{wav}" \'riff)\n'
        f'(utt.save.segs u "{segs}")\n'
    )
    try:
        done = subprocess.run(
            ["festival", "--pipe"], input=script, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"festival took over 120 s to say {clean[:40]!r}") from None
    # Festival reports an error and goes on with the next line (a missing voice: its default).
    if "SIOD ERROR" in done.stderr + done.stdout or not wav.is_file() or not segs.is_file():
        said = (done.stderr + done.stdout).strip()[-300:]
        raise ConfigError(
            f"festival could not say {clean[:40]!r} with voice {voice!r} ({said or 'no output'});"
            f" is the voice installed? `apt-get install {package}`"
        )
    rows = [line.split() for line in segs.read_text().splitlines()]
    return [(float(r[0]), r[2]) for r in rows if len(r) == 3 and r[0] != "#"]


def festival_speak(
    text: str, voice: str = "ked_diphone", stretch: float = 1.0, f0_mean: float = 105.0,
    f0_std: float = 15.0,
) -> Speech:  # fmt: skip
    """Say ``text`` with a Festival voice (:func:`festival_say`), as espeak's ``Speech``.

    Args:
        text: what to say (English; quotes and backslashes are dropped).
        voice: a Festival voice name (``VOICE_PACKAGES`` lists the ones talkloop knows).
        stretch: duration factor (above 1: slower speech).
        f0_mean: the intonation's mean pitch, Hz.
        f0_std: its spread, Hz.

    Returns:
        The audio at the voice's own rate, phones as espeak-ng mnemonics and their start
        samples; like espeak's, the audio ends where the closing pause begins.

    Raises:
        ConfigError: as :func:`festival_say`.
    """
    settings = (
        f"(Parameter.set 'Duration_Stretch {stretch:.4f})\n"
        f"(set! int_lr_params '((target_f0_mean {f0_mean:.2f}) (target_f0_std {f0_std:.2f})"
        f" (model_f0_mean 170) (model_f0_std 34)))\n"
    )
    with tempfile.TemporaryDirectory(prefix="talkloop-festival-") as tmp:
        wav = Path(tmp) / "say.wav"
        segments = festival_say(text, voice, wav, settings)
        with wave.open(str(wav)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    ends = [end for end, _ in segments]
    names = [name for _, name in segments]
    unknown = sorted({n for n in names if n not in ARPABET_TO_ESPEAK})
    if unknown:
        raise ConfigError(f"festival voice {voice!r} uses phones talkloop does not map: {unknown}")
    # Each phone starts where the one before it ended.
    starts = np.round(np.array([0.0, *ends])[: len(names)] * rate).astype(np.int64)
    phones = [ARPABET_TO_ESPEAK[n] for n in names]
    # The audio ends where the closing pause begins, as espeak's Speech does.
    end = int(starts[-1]) if phones and phones[-1] == "_" else len(pcm)
    if phones and phones[-1] == "_":
        phones, starts = phones[:-1], starts[:-1]
    audio = np.zeros(end, np.float32)
    m = min(end, len(pcm))
    audio[:m] = pcm16_to_float(pcm[:m])
    return Speech(audio, phones, np.minimum(np.maximum.accumulate(starts), end), rate)
