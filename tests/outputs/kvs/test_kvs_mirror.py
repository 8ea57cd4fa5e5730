"""The KVS mirror end to end: tiny pipeline -> KvsSink -> local PutMedia server -> decoded media.

Each test runs a real session (tiny random modules) with the mirror beside a primary sink and
checks the bytes the server received: decoded frames and audio against what the pipeline
produced, one keyframe-led fragment per cluster, resumption after a dropped connection, and
that a stuck or absent network never touches the primary output.
"""

from __future__ import annotations

import logging
import socket
import threading

import av
import numpy as np
import pytest
from fake_kvs import FakeKvs
from kvs_helpers import ACCESS_KEY, SECRET_KEY, STREAM, clean_aws_env, decode_mkv, kvs_threads

from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.outputs.kvs import KvsSink
from talkloop.pipeline.outputs.mp4 import Mp4Sink

from support import CollectSink, make_reference, tiny_args

pytestmark = pytest.mark.e2e

FRAGMENT_S = 0.4  # 10 frames at 25 fps: several fragments from a few seconds of speech
SECONDS = 2.0


@pytest.fixture
def aws(monkeypatch, tmp_path) -> None:
    clean_aws_env(monkeypatch, tmp_path)


def mirror(url: str, **kw) -> KvsSink:
    # A deep frame queue: on a busy test machine the encoder may lag, and these tests check
    # content, not frame dropping (the network-down test checks dropping).
    options = dict(
        fragment_seconds=FRAGMENT_S,
        crf=12,
        backoff_s=(0.05, 0.2),
        timeout_s=2.0,
        max_queue_frames=500,
    )
    options.update(kw)
    return KvsSink(STREAM, "us-east-1", endpoint_url=url, **options)


def yuv420_roundtrip(rgb: np.ndarray) -> np.ndarray:
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
    return frame.to_ndarray(format="rgb24").astype(np.float32)


def run(pipeline: Pipeline, audio: np.ndarray, sinks: list) -> None:
    session = pipeline.open_session(make_reference(), sinks=sinks)
    session.render([audio])


def test_mirror_matches_primary_output(aws, tiny_pipeline, speech) -> None:
    audio = speech[: int(16000 * SECONDS)]
    primary = CollectSink()
    with FakeKvs(ACCESS_KEY, SECRET_KEY) as kvs:
        sink = mirror(kvs.url)
        run(tiny_pipeline, audio, [primary, sink])
    status = sink.status
    assert not kvs_threads()
    assert len(kvs.connections) == 1 and kvs.connections[0].signature_ok
    conn = kvs.connections[0]
    assert conn.completed, "the upload ends with the last chunk"
    assert conn.headers["x-amzn-fragment-timecode-type"] == "ABSOLUTE"
    assert conn.headers["x-amzn-stream-name"] == STREAM
    start_ms = float(conn.headers["x-amzn-producer-start-timestamp"]) * 1000

    # One cluster per fragment, each led by a video keyframe, 400 ms apart, absolute times.
    clusters = conn.clusters
    src = primary.all_frames()
    assert len(clusters) == status.fragments_produced == -(-len(src) // 10)
    assert all(c.first_video_keyframe and c.audio_blocks > 0 for c in clusters)
    assert all(c.first_block_track == 1 for c in clusters[1:])  # the keyframe comes first
    steps = np.diff([c.timecode_ms for c in clusters[1:]])
    assert np.all(np.abs(steps - 1000 * FRAGMENT_S) <= 1), steps
    assert abs(clusters[1].timecode_ms - start_ms - 1000 * FRAGMENT_S) <= 1

    # Status: everything sent, received and persisted; nothing dropped.
    assert status.state == "closed" and status.last_error is None
    assert status.fragments_sent == len(clusters) and status.fragments_dropped == 0
    assert (
        status.fragments_acked["RECEIVED"] == status.fragments_acked["PERSISTED"] == len(clusters)
    )

    # Decoded video: every frame, in place, close to what the pipeline produced.
    frames, samples, audio_start, rate = decode_mkv(bytes(conn.body))
    assert len(frames) == len(src)
    pts = sorted(frames)
    index = [round((p - start_ms) * 25 / 1000) for p in pts]
    assert index == list(range(len(src)))
    decoded = np.stack([frames[p] for p in pts]).astype(np.float32)
    mad = np.abs(decoded - src).mean()
    # What yuv420p alone costs these (noisy, untrained) frames: the floor for any H.264 copy.
    floor = np.abs(np.stack([yuv420_roundtrip(f) for f in src]) - src).mean()
    assert mad < floor + 2, (mad, floor)
    # Each decoded frame matches the source frame of its own index at least as well as any
    # other (untrained output repeats itself, so near-ties with other frames are allowed).
    dist = np.abs(decoded[:, None] - src[None].astype(np.float32)).mean(axis=(2, 3, 4))
    own = np.diagonal(dist)
    assert np.all(own <= dist.min(axis=1) + 0.5), own - dist.min(axis=1)

    # Decoded audio: the driving audio, at its place on the same clock.
    assert rate == 16000
    # Within one AAC frame of the producer start (a decoder that keeps the encoder's priming
    # frame starts one frame early; this one drops it).
    expected = round(start_ms * 16) - audio_start  # where sample 0 of the driving audio lies
    assert -16 <= expected <= 1024 + 16, expected
    # Both clocks are whole milliseconds, so sample 0 lies within 16 samples of there.
    corr = {lag: aligned_corr(samples, audio, expected + lag) for lag in range(-16, 17)}
    lag = max(corr, key=corr.get)
    assert corr[lag] > 0.9, (lag, corr[lag])


def aligned_corr(samples: np.ndarray, audio: np.ndarray, offset: int) -> float:
    """Correlation of ``audio`` with ``samples`` when sample 0 of it lies at ``offset`` there."""
    got, want = (samples[offset:], audio) if offset >= 0 else (samples, audio[-offset:])
    n = min(len(got), len(want))
    assert n >= len(audio) - 1024, (offset, len(samples))  # nearly all of it was received
    return float(np.corrcoef(got[:n], want[:n])[0, 1])


def test_dropped_connection_resumes_on_a_keyframe(aws, tiny_pipeline, speech) -> None:
    audio = speech[: int(16000 * SECONDS)]
    with FakeKvs(ACCESS_KEY, SECRET_KEY, drop_after=2) as kvs:
        sink = mirror(kvs.url)
        run(tiny_pipeline, audio, [CollectSink(), sink])
    status = sink.status
    assert not kvs_threads()
    assert len(kvs.connections) >= 2 and kvs.connections[0].dropped
    assert status.reconnects >= 1 and status.state == "closed"
    second = kvs.connections[1]
    assert second.signature_ok and second.clusters
    # The new connection is a complete Matroska stream that starts on a keyframe ...
    assert bytes(second.body[:4]) == b"\x1a\x45\xdf\xa3"
    assert second.clusters[0].first_video_keyframe and second.clusters[0].first_block_track == 1
    frames, _, _, _ = decode_mkv(bytes(second.body))
    assert len(frames) == sum(c.video_blocks for c in second.clusters)
    # ... and the server sees every fragment, timecodes continuing without a gap.
    timecodes = sorted({c.timecode_ms for c in kvs.clusters()})
    assert len(timecodes) == status.fragments_produced
    steps = np.diff(timecodes[1:])
    assert np.all(np.abs(steps - 1000 * FRAGMENT_S) <= 1), steps
    assert status.fragments_acked["RECEIVED"] >= status.fragments_produced


class Recorder:
    """Wraps a sink; after each of its calls returns, notes a snapshot of the mirror: whether its
    encoder has encoded any frame, how many fragments the server has acknowledged."""

    def __init__(self, inner, name: str, mirror: KvsSink, log: list) -> None:
        self.inner, self.name, self.mirror, self.log = inner, name, mirror, log

    def _note(self, call: str) -> None:
        status = self.mirror.status
        encoded = status.encode_ms_per_frame is not None  # None until a first frame is encoded
        self.log.append((self.name, call, encoded, status.fragments_acked["RECEIVED"]))

    def open(self, info) -> None:
        self.inner.open(info)
        self._note("open")

    def write(self, video, audio) -> None:
        self.inner.write(video, audio)
        self._note("write")

    def close(self) -> None:
        self.inner.close()
        self._note("close")

    def abort(self) -> None:
        self.inner.abort()
        self._note("abort")


@pytest.mark.parametrize("stall", ["network", "encoder"])
def test_stalled_mirror_neither_slows_nor_harms_the_primary(
    aws, tiny_pipeline, speech, tmp_path, monkeypatch, stall
) -> None:
    """The primary never waits on a stalled mirror, shown by the order of events, not by timing.

    The mirror is held on an Event that the test releases only after the session has finished:
    "network", the server accepts the upload and then reads nothing (the mirror's encoder runs
    on, nothing is acknowledged); "encoder", the mirror's encoder thread waits before its first
    frame (the mirror makes no progress at all). Had any primary write or close, or the
    session's end, waited for the mirror to progress, the session could not finish before the
    release. It finishes, each primary call returned while the mirror was still held, and the
    primary's output is the one the same session makes without a mirror.
    """
    audio = speech[: int(16000 * SECONDS)]
    alone = CollectSink()
    run(tiny_pipeline, audio, [alone])

    release, gave_up = threading.Event(), threading.Event()
    if stall == "encoder":
        from talkloop.pipeline.outputs.kvs.mkv import FragmentWriter

        real_write = FragmentWriter.write

        def held_write(self, frame):
            if not release.wait(120):  # a hang bound: the test releases it long before
                gave_up.set()
            return real_write(self, frame)

        monkeypatch.setattr(FragmentWriter, "write", held_write)
    log: list = []
    out = tmp_path / "primary.mp4"
    primary = CollectSink()
    with FakeKvs(ACCESS_KEY, SECRET_KEY) as kvs:
        if stall == "network":
            kvs.stall.set()  # accepts the connection, then reads nothing until cleared
        sink = mirror(kvs.url, timeout_s=0.3, drain_timeout_s=0.2)
        # The mirror comes first: a write that waited on it would hold up the primary's write.
        sinks = [
            Recorder(sink, "mirror", sink, log),
            Recorder(Mp4Sink(out), "primary", sink, log),
            Recorder(primary, "primary", sink, log),
        ]
        session = threading.Thread(target=run, args=(tiny_pipeline, audio, sinks))
        session.start()
        session.join(120)  # a hang bound only: a session that waited on the mirror never ends
        finished_before_release = not session.is_alive()
        status = sink.status  # still held: the mirror's view at the end of the session
        release.set()
        kvs.stall.clear()
        session.join()
        for thread in kvs_threads():  # once released, the mirror's threads end
            thread.join(30)
    assert finished_before_release and not gave_up.is_set()
    assert not kvs_threads()
    calls = [(name, call) for name, call, _, _ in log]
    assert calls.count(("primary", "write")) == 2 * len(alone.frames)
    assert calls[-3:] == [("mirror", "close"), ("primary", "close"), ("primary", "close")]
    # Every primary call, the close included, returned while the mirror was held.
    primary_calls = [entry for entry in log if entry[0] == "primary"]
    assert all(acked == 0 for _, _, _, acked in primary_calls), log
    if stall == "encoder":
        assert not any(encoded for _, _, encoded, _ in primary_calls), log
    assert status.fragments_acked["RECEIVED"] == 0 and status.state == "closed"
    # The primary's output: every frame and sample, exactly as without a mirror.
    assert primary.closed and not primary.aborted
    assert np.array_equal(primary.all_frames(), alone.all_frames())
    assert np.array_equal(primary.all_audio(), alone.all_audio())
    assert primary.first_indices == alone.first_indices
    with av.open(str(out)) as c:
        assert sum(1 for _ in c.decode(video=0)) == round(SECONDS * 25)


def test_network_down_drops_oldest_fragments_counted(aws, tiny_pipeline, speech, tmp_path) -> None:
    audio = speech[: int(16000 * SECONDS)]
    closed = socket.create_server(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there: every connection is refused
    primary = CollectSink()
    with FakeKvs(ACCESS_KEY, SECRET_KEY) as kvs:
        sink = mirror(kvs.url, data_endpoint_url=dead_url, max_fragments=2, drain_timeout_s=0.2)
        run(tiny_pipeline, audio, [primary, sink])
    status = sink.status
    assert not kvs_threads()
    assert len(primary.all_frames()) == round(SECONDS * 25)
    assert status.fragments_sent == 0 and status.reconnects >= 1
    assert status.fragments_produced >= 4
    # Only the newest two fragments were still held; all older ones were dropped and counted.
    assert status.fragments_dropped == status.fragments_produced - 2
    assert "Connection refused" in (status.last_error or "") or "Errno" in (status.last_error or "")


def test_missing_credentials_one_clear_error(monkeypatch, tmp_path, tiny_pipeline, speech, caplog):
    clean_aws_env(monkeypatch, tmp_path, with_credentials=False)
    audio = speech[: int(16000 * SECONDS)]
    primary = CollectSink()
    with FakeKvs(ACCESS_KEY, SECRET_KEY) as kvs, caplog.at_level(logging.INFO, "talkloop.kvs"):
        sink = mirror(kvs.url)
        run(tiny_pipeline, audio, [primary, sink])
    assert not kvs.connections
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "no AWS credentials" in errors[0].getMessage()
    assert sink.status.state == "failed" and "no AWS credentials" in sink.status.last_error
    assert primary.closed and len(primary.all_frames()) == round(SECONDS * 25)
    assert not kvs_threads()


def test_error_acks_are_counted_and_streaming_continues(aws, tiny_pipeline, speech) -> None:
    audio = speech[: int(16000 * SECONDS)]
    with FakeKvs(ACCESS_KEY, SECRET_KEY, error_on=frozenset({1})) as kvs:
        sink = mirror(kvs.url)
        run(tiny_pipeline, audio, [CollectSink(), sink])
    status = sink.status
    assert status.fragments_acked["ERROR"] == 1
    assert "4006" in (status.last_error or "")
    assert status.fragments_acked["RECEIVED"] == status.fragments_produced - 1
    assert len(kvs.connections) == 1 and status.state == "closed"


def test_bad_signature_is_one_clear_error(monkeypatch, tmp_path, tiny_pipeline, speech, caplog):
    clean_aws_env(monkeypatch, tmp_path)
    primary = CollectSink()
    with FakeKvs(ACCESS_KEY, "another-secret") as kvs, caplog.at_level(logging.INFO):
        sink = mirror(kvs.url)
        run(tiny_pipeline, speech[: int(16000 * SECONDS)], [primary, sink])
    assert kvs.signature_failures >= 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "403" in errors[0].getMessage()
    assert sink.status.state == "failed" and len(primary.all_frames()) == round(SECONDS * 25)


def test_render_cli_mirrors_and_prints_the_status(aws, speech, tmp_path, capsys) -> None:
    from talkloop.pipeline.audio.io import write_wav
    from talkloop.pipeline.cli import main

    wav = tmp_path / "speech.wav"
    write_wav(wav, speech[: int(16000 * SECONDS)], 16000)
    out = tmp_path / "out.mp4"
    tiny = [*tiny_args(), "--steps", "2", "--quiet"]
    with FakeKvs(ACCESS_KEY, SECRET_KEY) as kvs:
        code = main(
            ["render", "--audio", str(wav), "--out", str(out), *tiny]
            + ["--kvs-stream", STREAM, "--kvs-region", "us-east-1", "--kvs-endpoint", kvs.url]
        )
    printed = capsys.readouterr().out
    assert code == 0 and out.exists()
    n = len(kvs.connections[0].clusters)
    assert n >= 1 and f"fragments {n} sent ({n} received, {n} persisted, 0 error)" in printed
    assert "0 dropped, 0 reconnects" in printed
    assert not kvs_threads()


def test_render_cli_bad_stream_name_fails_before_rendering(tmp_path, capsys) -> None:
    from talkloop.pipeline.cli import main

    code = main(
        ["render", "--audio", "x.wav", "--out", str(tmp_path / "o.mp4"), "--kvs-stream", "a b"]
    )
    assert code == 2 and "KVS stream name" in capsys.readouterr().err
