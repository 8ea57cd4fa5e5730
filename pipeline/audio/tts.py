"""Built-in text to speech with espeak-ng (the Debian package), resampled to the pipeline rate."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np

from pipeline.audio.io import pcm16_to_float, resample
from pipeline.core.errors import InputError, TalkloopError

MAX_TEXT_CHARS = 2000


def synthesize(text: str, sample_rate: int, voice: str = "en", rate_wpm: int = 160) -> np.ndarray:
    """Speak ``text``; returns float32 mono at ``sample_rate``.

    Raises:
        InputError: empty or over-long text.
        TalkloopError: espeak-ng is not installed or failed.
    """
    text = text.strip()
    if not text:
        raise InputError("nothing to say: the text is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"text too long to say ({len(text)} characters; at most {MAX_TEXT_CHARS})")
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise TalkloopError("espeak-ng is not installed (apt-get install espeak-ng)")
    # "--" ends options, so text starting with "-" is spoken, not parsed as a flag.
    proc = subprocess.run(
        [exe, "-v", voice, "-s", str(rate_wpm), "--stdout", "--", text],
        capture_output=True,
        timeout=60,
    )
    if proc.returncode != 0 or not proc.stdout:
        raise TalkloopError(f"espeak-ng failed: {proc.stderr.decode(errors='replace').strip()}")
    with wave.open(io.BytesIO(proc.stdout)) as w:
        rate = w.getframerate()
        samples = pcm16_to_float(w.readframes(w.getnframes()))
    return resample(samples, rate, sample_rate)
