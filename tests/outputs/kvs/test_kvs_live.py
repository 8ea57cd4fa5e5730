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
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.outputs.kvs import KvsSink
from talkloop.rtc.app import live_config_dict

from support import advance, make_reference, tiny_config

pytestmark = pytest.mark.e2e


def test_live_session_mirrors_to_kvs(monkeypatch, tmp_path, tiny_modules, speech) -> None:
    clean_aws_env(monkeypatch, tmp_path)
    base = tiny_config().model_dump(mode="json")
    base.pop("schedule")
    pipeline = build_pipeline(build_config(**live_config_dict(base)), tiny_modules)
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
            pipeline, make_reference(), config=AvatarConfig(), clock=clock, mirrors=[sink]
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

    async def drain(avatar) -> None:
        async for _ in avatar:
            pass

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
