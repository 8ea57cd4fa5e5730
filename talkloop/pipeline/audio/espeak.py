"""espeak-ng through its C library (ctypes): speech audio plus phoneme timings.

The library is initialised once per process in synchronous mode with phoneme events: the synthesis
callback receives the audio and events of type 7 whose ``sample`` field is the exact sample index
(at 22050 Hz) where a phoneme starts and whose ``id.string`` is its mnemonic (``h``, ``@``, ``oU``,
pauses ``_`` / ``_:``). espeak keeps global state, so calls are serialised with a lock.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from talkloop.pipeline.audio.pcm import pcm16_to_float
from talkloop.pipeline.core.errors import ConfigError

ESPEAK_RATE = 22050

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INIT_PHONEME_EVENTS = 0x0001
_INIT_DONT_EXIT = 0x8000
_EVENT_LIST_TERMINATED = 0
_EVENT_PHONEME = 7
_PARAM_RATE, _PARAM_VOLUME, _PARAM_PITCH, _PARAM_RANGE = 1, 2, 3, 4
_POS_CHARACTER = 1
_CHARS_UTF8 = 1


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


_Callback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


@dataclass
class Speech:
    """One synthesised utterance at espeak's native rate.

    ``phonemes[i]`` starts at sample ``starts[i]`` and ends where the next one starts (the last
    one ends at ``len(audio)``, which is where espeak's closing pause begins).
    """

    audio: np.ndarray  # (n,) float32 at ESPEAK_RATE
    phonemes: list[str]
    starts: np.ndarray  # (P,) int64 sample indices, non-decreasing
    sample_rate: int = ESPEAK_RATE


class _Engine:
    """The process-wide espeak-ng instance."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as err:
            raise ConfigError(
                f"espeak-ng library not found ({err}); install it with `apt-get install espeak-ng`"
            ) from None
        self.libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib = self.lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, None, _INIT_PHONEME_EVENTS | _INIT_DONT_EXIT
        )
        if rate != ESPEAK_RATE:
            raise ConfigError(f"espeak-ng initialised at {rate} Hz, expected {ESPEAK_RATE}")
        self._chunks: list[np.ndarray] = []
        self._events: list[tuple[int, str]] = []
        # While set, audio goes to this function as it is synthesised (``stream``); it returns
        # True to abort the synthesis.
        self._sink: Callable[[np.ndarray], bool] | None = None
        self._callback = _Callback(self._on_synth)  # keep a reference: C holds the pointer
        lib.espeak_SetSynthCallback(self._callback)
        self.lock = threading.Lock()

    def _on_synth(self, wav: ctypes.Array, n: int, events: ctypes.Array) -> int:
        if self._sink is not None:
            if n > 0 and wav:
                return 1 if self._sink(np.ctypeslib.as_array(wav, (n,)).copy()) else 0
            return 0
        if n > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, (n,)).copy())
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            e = events[i]
            if e.type == _EVENT_PHONEME:
                self._events.append((int(e.sample), e.id.string.decode("ascii", "replace")))
            i += 1
        return 0

    def _configure(self, voice: str, rate: int, pitch: int, pitch_range: int) -> None:
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ConfigError(f"espeak-ng has no voice {voice!r} (see `espeak-ng --voices`)")
        self.lib.espeak_SetParameter(_PARAM_RATE, int(rate), 0)
        self.lib.espeak_SetParameter(_PARAM_PITCH, int(pitch), 0)
        self.lib.espeak_SetParameter(_PARAM_RANGE, int(pitch_range), 0)
        self.lib.espeak_SetParameter(_PARAM_VOLUME, 100, 0)

    def stream(
        self,
        text: str,
        voice: str,
        rate: int,
        pitch: int,
        pitch_range: int,
        on_audio: Callable[[np.ndarray], bool],
    ) -> None:
        """Synthesise ``text``, handing each int16 chunk (about 50 ms) to ``on_audio`` as it is
        made. ``on_audio`` returns True to stop the synthesis there."""
        with self.lock:
            self._configure(voice, rate, pitch, pitch_range)
            self._sink = on_audio
            try:
                data = text.encode("utf-8")
                rc = self.lib.espeak_Synth(
                    data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
                )
            finally:
                self._sink = None
        if rc not in (0, 1):  # 1: EE_BUFFER_FULL, which an aborting callback may lead to
            raise ConfigError(f"espeak-ng failed to synthesise {text[:40]!r} (error {rc})")

    def speak(self, text: str, voice: str, rate: int, pitch: int, pitch_range: int) -> Speech:
        with self.lock:
            self._configure(voice, rate, pitch, pitch_range)
            self._chunks, self._events = [], []
            # espeak draws noise (klatt voices, flutter) from libc rand(): reseed for
            # bit-identical audio from identical arguments.
            self.libc.srand(0)
            data = text.encode("utf-8")
            rc = self.lib.espeak_Synth(
                data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
            if rc != 0:
                raise ConfigError(f"espeak-ng failed to synthesise {text!r} (error {rc})")
            chunks, events = self._chunks, self._events
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        starts = np.array([s for s, _ in events], np.int64)
        starts = np.maximum.accumulate(starts) if len(starts) else starts
        # The number of trailing samples after the final pause event varies from call to call;
        # cut (or zero-pad) the audio there so identical arguments give identical audio.
        end = int(starts[-1]) if len(starts) else len(pcm)
        audio = np.zeros(end, np.float32)
        m = min(end, len(pcm))
        audio[:m] = pcm16_to_float(pcm[:m])
        phonemes = [p for _, p in events]
        if phonemes and not phonemes[-1].startswith("_"):
            phonemes.append("_")
            starts = np.append(starts, end)
        return Speech(audio, phonemes[:-1], starts[:-1])


_ENGINE: _Engine | None = None
_ENGINE_LOCK = threading.Lock()


def engine() -> _Engine:
    """The process-wide engine (created on first use)."""
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            _ENGINE = _Engine()
    return _ENGINE


def speak(
    text: str, voice: str = "en-us", rate: int = 175, pitch: int = 50, range_: int = 50
) -> Speech:
    """Synthesise ``text`` with espeak-ng.

    Args:
        text: what to say (UTF-8).
        voice: espeak voice name with optional variant, e.g. ``"en-gb+f3"``.
        rate: words per minute (80..450).
        pitch: base pitch 0..100.
        range_: pitch range 0..100 (0 is monotone).

    Returns:
        The audio at 22050 Hz and the phoneme start samples.
    """
    return engine().speak(text, voice, rate, pitch, range_)
