"""Built-in text to speech: espeak-ng through its library, streamed as it is synthesised.

Synthesis runs on a worker thread (espeak is synchronous and process-global, see
``talkloop/pipeline/audio/espeak.py``); each chunk of about 50 ms reaches the event loop as soon as espeak
makes it, so the avatar starts speaking after the first chunk, not after the whole text.
Cancelling the consumer stops the synthesis at the next chunk. Synthesis never waits for the
consumer: espeak is process-global and serialised by a lock, so pausing one utterance would hold
every other session's speech behind it. What waits for the consumer is therefore at most one
utterance (``talkloop.agent.text.MAX_TEXT_CHARS`` of text, a few MB of audio); an AvatarSession
synthesises one line at a time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Executor

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from talkloop.agent.frames import AudioFrame
from talkloop.agent.text import check_text
from talkloop.pipeline.audio.espeak import ESPEAK_RATE, engine
from talkloop.pipeline.audio.resample import resample


class TTSOptions(BaseModel):
    """Voice settings of the built-in TTS."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    voice: str = Field(
        "en-us", min_length=1, max_length=40, description="espeak-ng voice[+variant]"
    )
    rate_wpm: int = Field(175, ge=80, le=450, description="words per minute")
    pitch: int = Field(50, ge=0, le=100)


class EspeakTTS:
    """Streaming espeak-ng. Frames are PCM16 mono at ``sample_rate`` (22050 Hz).

    Args:
        options: voice, rate and pitch; defaults when omitted.
        executor: where synthesis runs; None: the event loop's default executor.
    """

    sample_rate = ESPEAK_RATE

    def __init__(
        self,
        options: TTSOptions | None = None,
        executor: Executor | None = None,
        **overrides: object,
    ) -> None:
        self.options = options or TTSOptions(**overrides)  # type: ignore[arg-type]
        self.executor = executor

    async def stream(self, text: str) -> AsyncIterator[AudioFrame]:
        """Yield the speech of ``text`` chunk by chunk, as espeak produces it.

        Raises:
            TextError: empty or over-long text (``talkloop/agent/text.py``).
            ConfigError: espeak-ng is missing or has no such voice.
        """
        text = check_text(text).strip()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[np.ndarray | BaseException | None] = asyncio.Queue()
        stop = threading.Event()
        o = self.options

        def on_audio(chunk: np.ndarray) -> bool:
            loop.call_soon_threadsafe(queue.put_nowait, chunk)
            return stop.is_set()

        def run() -> None:
            try:
                engine().stream(text, o.voice, o.rate_wpm, o.pitch, 50, on_audio)
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except BaseException as err:  # handed to the consumer, raised there
                loop.call_soon_threadsafe(queue.put_nowait, err)

        worker = loop.run_in_executor(self.executor, run)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield AudioFrame(item.astype("<i2").tobytes(), self.sample_rate, 1)
        finally:
            stop.set()  # the callback aborts espeak at its next chunk
            await asyncio.shield(worker)

    async def synthesize(self, text: str, sample_rate: int | None = None) -> np.ndarray:
        """The whole utterance as float32 mono (at ``sample_rate``, default espeak's)."""

        parts = [f.to_mono_float() async for f in self.stream(text)]
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return resample(audio, self.sample_rate, sample_rate or self.sample_rate)
