"""Microphone frames are converted off the event loop (issue 32): the loop only queues a decoded
frame (``AvatarSession.add_microphone_frame``), a worker thread converts it, and the driver's tick
takes it; the driving audio, what the model gets and the arrival times are those of the old path
(a ``StreamResampler`` on the loop, frame by frame, then ``add_microphone``)."""

from __future__ import annotations

import threading

import av
import numpy as np
import pytest

from talkloop.agent.clock import ManualClock
from talkloop.agent.session import AvatarSession
from talkloop.pipeline.audio.resample import FrameConverter, StreamResampler

from support import make_reference, run, tone

pytestmark = pytest.mark.unit

RATE = 48000
FRAME = 960  # 20 ms, what aiortc's Opus decoder gives


def decoded_frames() -> list[av.AudioFrame]:
    """What a call's microphone track yields: s16 stereo 48 kHz, then (a renegotiation) float
    mono, so the converter also meets a format change mid-stream."""
    left = tone(FRAME * 12, RATE, 300.0, 0.4)
    right = tone(FRAME * 12, RATE, 520.0, 0.2)
    frames = []
    for k in range(8):
        part = slice(k * FRAME, (k + 1) * FRAME)
        pcm = np.stack([left[part], right[part]], 1).reshape(1, -1) * 32767
        frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16), format="s16", layout="stereo")
        frame.sample_rate = RATE
        frames.append(frame)
    for k in range(8, 12):
        mono = left[k * FRAME : (k + 1) * FRAME][None, :]
        frame = av.AudioFrame.from_ndarray(mono.astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = RATE
        frames.append(frame)
    return frames


@pytest.fixture
def conversions(monkeypatch) -> list[str]:
    """The name of the thread of every ``StreamResampler.push_frame`` call."""
    seen: list[str] = []
    push_frame = StreamResampler.push_frame

    def recorded(self, frame):
        seen.append(threading.current_thread().name)
        return push_frame(self, frame)

    monkeypatch.setattr(StreamResampler, "push_frame", recorded)
    return seen


def test_put_only_queues_and_take_gives_the_stream_resamplers_samples(monkeypatch) -> None:
    gate = threading.Event()
    callers: list[str] = []
    push_frame = StreamResampler.push_frame

    def gated(self, frame):
        callers.append(threading.current_thread().name)
        if threading.current_thread() is not threading.main_thread():
            gate.wait(10)  # the worker is held in its first frame
        return push_frame(self, frame)

    expected = StreamResampler(RATE)
    want = [expected.push_frame(f) for f in decoded_frames()]
    monkeypatch.setattr(StreamResampler, "push_frame", gated)
    converter = FrameConverter(RATE, name="mic-test")
    try:
        for i, frame in enumerate(decoded_frames()):
            converter.put(frame, i)
        assert "MainThread" not in callers  # putting never converted
        gate.set()
        got = converter.take()  # converts inline whatever the worker has not reached
    finally:
        gate.set()
        converter.close()
    assert [tag for _, tag in got] == list(range(len(want)))
    for (samples, _), ref in zip(got, want, strict=True):
        np.testing.assert_array_equal(samples, ref)
    assert converter.take() == []


def test_tick_takes_the_frames_as_the_old_loop_path_gave_them(live_pipeline, conversions) -> None:
    async def body() -> None:
        old = AvatarSession(live_pipeline, make_reference(), clock=ManualClock())
        new = AvatarSession(live_pipeline, make_reference(), clock=ManualClock())
        pushed: dict[str, list[np.ndarray]] = {"old": [], "new": []}
        for key, avatar in (("old", old), ("new", new)):
            avatar.driver.push = pushed[key].append
        try:
            loop_side = StreamResampler(RATE)  # what Call._read_microphone did on the loop
            for i, frame in enumerate(decoded_frames()):
                old.add_microphone(loop_side.push_frame(frame), arrived_at=0.01 * i)
            del conversions[:]
            for i, frame in enumerate(decoded_frames()):
                new.add_microphone_frame(frame, arrived_at=0.01 * i)
            # the loop-side call queued the frames and returned: nothing converted on the loop
            assert "MainThread" not in conversions
            new._take_microphone()  # what each tick does before producing its blocks
            for avatar in (old, new):
                avatar.driver.produce_due(0.0)
                avatar.driver.produce_due(0.2)
            assert old.driver.samples == new.driver.samples > 0
            n = old.driver.playout.end
            np.testing.assert_array_equal(
                new.driver.playout.read(0, n), old.driver.playout.read(0, n)
            )
            assert np.abs(old.driver.playout.read(0, n)).max() > 0.1  # the microphone, not silence
            np.testing.assert_array_equal(
                np.concatenate(pushed["new"]), np.concatenate(pushed["old"])
            )
            for sample in range(0, old.driver.samples, old.block):
                assert new.driver.arrival_of(sample) == old.driver.arrival_of(sample)
        finally:
            await old.close()
            await new.close()

    run(body())


def test_a_closed_converter_drops_what_it_holds() -> None:
    converter = FrameConverter(RATE, max_held=2)
    frames = decoded_frames()[:4]
    for i, frame in enumerate(frames):
        converter.put(frame, i)
    got = converter.take()
    assert [tag for _, tag in got][-2:] == [2, 3] and len(got) <= 4
    converter.close()
    converter.put(frames[0], 9)
    assert converter.take() == []
