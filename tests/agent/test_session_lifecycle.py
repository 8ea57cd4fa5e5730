"""AvatarSession lifecycle for in-process users (LiveKit/Pipecat adapters): close releases the
pipeline session and its mirrors even if the session never started; one say at a time;
a generation failure reaches the failure listeners once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from talkloop.agent.session import MAX_QUEUED_SAYS, AvatarConfig, AvatarSession
from talkloop.pipeline.core.errors import BusyError

from support import RecordingMirror, make_reference, run

pytestmark = pytest.mark.unit


def test_closing_a_session_that_never_started_closes_its_mirrors(live_pipeline) -> None:
    mirror = RecordingMirror()

    async def body():
        avatar = AvatarSession(live_pipeline, make_reference(), mirrors=[mirror])
        await avatar.close()
        await avatar.close()  # idempotent

    run(body(), 120)
    assert mirror.events == ["open", "close"]


class SlowTTS:
    """Stands in for EspeakTTS: records when each text starts and ends being synthesised."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def stream(self, text: str):
        self.log.append(f"start {text}")
        await asyncio.sleep(0.2)
        self.log.append(f"end {text}")
        return
        yield  # an async generator without frames


def test_says_run_one_at_a_time_and_a_full_queue_is_busy(live_pipeline) -> None:
    log: list[str] = []

    async def body():
        avatar = AvatarSession(live_pipeline, make_reference(), config=AvatarConfig())
        tts = SlowTTS(log)
        tasks = [avatar.say(str(i), tts=tts) for i in range(MAX_QUEUED_SAYS + 1)]
        with pytest.raises(BusyError, match="already speaking"):
            avatar.say("one too many", tts=tts)
        await asyncio.gather(*tasks)
        await avatar.close()

    run(body(), 120)
    n = MAX_QUEUED_SAYS + 1
    assert log == [x for i in range(n) for x in (f"start {i}", f"end {i}")]


def test_a_generation_failure_reaches_the_listeners_once(live_pipeline) -> None:
    seen: list[BaseException] = []

    async def body():
        avatar = AvatarSession(live_pipeline, make_reference())
        avatar.failure_listeners.append(seen.append)

        def broken(*a, **k):
            raise RuntimeError("boom")

        avatar.frames.write = broken  # the session's frame output fails at its first chunk
        avatar.start()
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        await avatar.close()
        return avatar

    avatar = run(body(), 120)
    assert [str(e) for e in seen] == ["boom"] and avatar.error is seen[0]


def test_a_close_that_interrupts_a_step_is_not_a_failure(live_pipeline, caplog) -> None:
    """Closing aborts the frame queue under a running step, which then raises: that is the
    close, not a generation failure (no traceback, no failure listeners)."""
    import logging

    from talkloop.pipeline.core.errors import SessionClosedError

    seen: list[BaseException] = []

    async def body():
        avatar = AvatarSession(live_pipeline, make_reference())
        avatar.failure_listeners.append(seen.append)
        in_step = threading.Event()

        def write_until_closed(*a, **k):
            in_step.set()
            while not avatar.closed:
                time.sleep(0.005)
            raise SessionClosedError("FrameQueueSink is closed; no more frames accepted")

        avatar.frames.write = write_until_closed  # the first chunk's publish waits for the close
        avatar.start()
        await asyncio.to_thread(in_step.wait, 30)
        await avatar.close()
        await asyncio.sleep(0.1)
        return avatar

    with caplog.at_level(logging.DEBUG, logger="talkloop.agent"):
        avatar = run(body(), 120)
    assert seen == [] and avatar.error is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
