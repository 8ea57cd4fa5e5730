"""`serve --kvs-stream`: a live avatar session mirrors its stream to KVS beside the call."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fake_kvs import FakeKvs
from kvs_helpers import ACCESS_KEY, SECRET_KEY, STREAM, clean_aws_env, decode_mkv, kvs_threads

from talkloop.agent.clock import ManualClock
from talkloop.agent.frames import AudioFrame
from talkloop.agent.session import AvatarConfig, AvatarSession
from talkloop.pipeline.outputs.kvs import KvsSink

from support import advance, drain, make_reference

pytestmark = pytest.mark.e2e


def test_live_session_mirrors_to_kvs(monkeypatch, tmp_path, live_pipeline, speech) -> None:
    clean_aws_env(monkeypatch, tmp_path)
    audio = np.rint(speech[:32000] * 32767).astype("<i2").tobytes()

    async def body(url: str):
        sink = KvsSink(
            STREAM,
            "us-east-1",
            endpoint_url=url,
            fragment_seconds=0.4,
            backoff_s=(0.05, 0.2),
            timeout_s=2.0,
            max_queue_frames=500,
        )
        clock = ManualClock()
        avatar = AvatarSession(
            live_pipeline, make_reference(), config=AvatarConfig(), clock=clock, mirrors=[sink]
        )
        avatar.start()
        consumer = asyncio.create_task(drain(avatar))
        avatar.push_audio(AudioFrame(audio, 16000, 1))
        avatar.end_of_segment()
        await advance(avatar, clock, 3.0)
        stats = avatar.stats()
        consumer.cancel()
        await avatar.close()
        return sink, stats

    with FakeKvs(ACCESS_KEY, SECRET_KEY) as kvs:
        sink, stats = asyncio.run(asyncio.wait_for(body(kvs.url), 120))
    assert not kvs_threads()
    conn = kvs.connections[0]
    assert conn.signature_ok and len(conn.clusters) >= 3
    frames, samples, _, _ = decode_mkv(conn.body)
    assert len(frames) >= 60  # ~3 s of video at 25 fps reached the mirror
    assert np.sqrt(np.mean(samples**2)) > 0.01  # with the session's speech
    assert stats["mirrors"] and stats["mirrors"][0].startswith(f"kvs mirror '{STREAM}'")
    assert sink.status.fragments_dropped == 0
