"""The KVS mirror's parts: fragment buffer, ACK stream parser, SigV4, fragments, control plane."""

from __future__ import annotations

import json
import time

import boto3
import numpy as np
import pytest
from botocore.credentials import Credentials
from fake_kvs import EMPTY_SHA256, FakeKvs, sigv4_signature
from kvs_helpers import ACCESS_KEY, REGION, SECRET_KEY, STREAM, clean_aws_env, decode_mkv
from moto import mock_aws

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.records import StreamInfo
from talkloop.pipeline.outputs.kvs import KvsSink
from talkloop.pipeline.outputs.kvs.buffer import FragmentBuffer
from talkloop.pipeline.outputs.kvs.ebml import split_live_mkv
from talkloop.pipeline.outputs.kvs.mkv import Fragment, FragmentWriter
from talkloop.pipeline.outputs.kvs.putmedia import KvsError, ResponseReader, resolve_data_endpoint
from talkloop.pipeline.outputs.kvs.sigv4 import sign_request_headers
from talkloop.pipeline.outputs.queue import LiveFrame

pytestmark = pytest.mark.unit


def fragment(tc: int) -> Fragment:
    return Fragment(tc, b"x" * 10, tc, 10, time.monotonic())


# -- fragment buffer -------------------------------------------------------------------------------


def test_buffer_drops_oldest_unsent_and_counts() -> None:
    buf = FragmentBuffer(max_fragments=2)
    for tc in range(5):
        buf.put(fragment(tc))
    assert buf.dropped == 3 and buf.produced == 5
    assert [buf.take(0).timecode_ms, buf.take(0).timecode_ms] == [3, 4]
    assert buf.take(0) is None
    assert buf.produced == buf.sent + buf.dropped + buf.unsent


def test_buffer_resends_unacked_after_rewind() -> None:
    buf = FragmentBuffer(max_fragments=10)
    for tc in (0, 400, 800):
        buf.put(fragment(tc))
    for _ in range(3):
        buf.take(0)
    assert [f.timecode_ms for f in buf.acknowledge(400)] == [0, 400]
    assert buf.rewind() == 1  # 800 was sent but never acknowledged
    again = buf.take(0)
    assert again.timecode_ms == 800 and buf.resent == 1 and buf.sent == 3
    buf.finish()
    assert not buf.drained()
    buf.acknowledge(800)
    assert buf.drained() and buf.wait_drained(0)


# -- the ACK stream ----------------------------------------------------------------------------------


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in parts)


def test_ack_stream_parsed_across_arbitrary_splits() -> None:
    acks = [
        {"EventType": "BUFFERING", "FragmentTimecode": 1000},
        {"EventType": "RECEIVED", "FragmentTimecode": 1000, "FragmentNumber": "913"},
        {"EventType": "ERROR", "FragmentTimecode": 1400, "ErrorId": 4004},
    ]
    body = chunked(*(json.dumps(a).encode() + b"\n" for a in acks))
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    for step in (1, 7, 64, len(wire)):
        reader = ResponseReader()
        events = []
        for i in range(0, len(wire), step):
            events += reader.feed(wire[i : i + step])
        assert [(e.kind, e.timecode_ms, e.error_code) for e in events] == [
            ("BUFFERING", 1000, None),
            ("RECEIVED", 1000, None),
            ("ERROR", 1400, 4004),
        ]


@pytest.mark.parametrize(("status", "retryable"), [(403, False), (404, False), (500, True)])
def test_http_error_status_says_whether_to_retry(status: int, retryable: bool) -> None:
    body = b'{"message": "nope"}'
    wire = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    with pytest.raises(KvsError, match=f"HTTP {status}.*nope") as err:
        ResponseReader().feed(wire)
    assert err.value.retryable is retryable


# -- SigV4 ---------------------------------------------------------------------------------------------


def test_sigv4_matches_an_independent_implementation() -> None:
    creds = Credentials(ACCESS_KEY, SECRET_KEY)
    url = "http://127.0.0.1:8443/putMedia"
    headers = sign_request_headers(
        "POST",
        url,
        {"x-amzn-stream-name": STREAM, "x-amzn-fragment-timecode-type": "ABSOLUTE"},
        creds,
        REGION,
    )
    lower = {k.lower(): v for k, v in headers.items()}
    assert lower["host"] == "127.0.0.1:8443"
    assert "/us-east-1/kinesisvideo/aws4_request" in lower["authorization"]
    expected, key = sigv4_signature("POST", "/putMedia", lower, SECRET_KEY, EMPTY_SHA256)
    assert key == ACCESS_KEY and lower["authorization"].endswith(f"Signature={expected}")
    tampered = dict(lower, **{"x-amzn-stream-name": "someone-else"})
    assert sigv4_signature("POST", "/putMedia", tampered, SECRET_KEY, EMPTY_SHA256)[0] != expected


# -- fragments -------------------------------------------------------------------------------------------


def test_every_fragment_is_one_keyframe_led_cluster_of_its_length() -> None:
    info = StreamInfo(64, 48, 25, 16000)
    origin = 1_700_000_000.0
    writer = FragmentWriter(info, origin_s=origin, fragment_seconds=0.4)
    fragments = []
    rng = np.random.default_rng(0)
    for j in range(60):
        a0, a1 = info.frame_pts(j), info.frame_pts(j + 1)
        rgb = np.full((48, 64, 3), (j * 4) % 256, np.uint8)  # flat frames: tiny GOPs
        audio = rng.standard_normal(a1 - a0).astype(np.float32) * 0.1
        fragments += writer.write(LiveFrame(j, a0, rgb, audio, a0))
    fragments += writer.flush()
    assert [f.first_frame for f in fragments] == list(range(0, 60, 10))
    assert [f.frames for f in fragments] == [10] * 6
    assert [f.timecode_ms - fragments[0].timecode_ms for f in fragments] == list(
        range(0, 2400, 400)
    )
    assert fragments[0].timecode_ms == 1_700_000_000_000
    body = writer.header + b"".join(f.data for f in fragments)
    header, clusters = split_live_mkv(body)
    assert header == writer.header and clusters == [f.data for f in fragments]
    frames, samples, _, rate = decode_mkv(body)
    assert len(frames) == 60 and rate == 16000 and samples.size >= 60 * 640


# -- construction and the control plane (moto) -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stream_name": "bad name!"}, "stream name"),
        ({"stream_name": "ok", "region": "mars"}, "region"),
        ({"stream_name": "ok", "fragment_seconds": 30}, "fragment_seconds"),
        ({"stream_name": "ok", "preset": "warp"}, "preset"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        KvsSink(**kwargs)


def test_get_data_endpoint_via_moto(monkeypatch, tmp_path) -> None:
    clean_aws_env(monkeypatch, tmp_path)
    with mock_aws():
        boto3.client("kinesisvideo", region_name=REGION).create_stream(
            StreamName=STREAM, DataRetentionInHours=24
        )
        url, region, creds = resolve_data_endpoint(STREAM, None)
        assert url.startswith("https://s-") and region == REGION
        assert creds.get_frozen_credentials().access_key
        with pytest.raises(KvsError, match="'no-such-stream' not found in us-east-1") as err:
            resolve_data_endpoint("no-such-stream", REGION)
        assert not err.value.retryable


def test_moto_control_plane_with_local_putmedia(monkeypatch, tmp_path) -> None:
    """GetDataEndpoint from moto, PutMedia to the local server: the sink streams."""
    clean_aws_env(monkeypatch, tmp_path)
    with mock_aws():
        boto3.client("kinesisvideo", region_name=REGION).create_stream(StreamName=STREAM)
        import os

        # moto installs its own fake credentials; the local server must check those.
        key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
        info = StreamInfo(64, 48, 25, 16000)
        with FakeKvs(key, secret) as kvs:
            sink = KvsSink(STREAM, REGION, data_endpoint_url=kvs.url, fragment_seconds=0.4)
            sink.open(info)
            from talkloop.pipeline.core.records import AudioChunk, VideoChunk

            frames = np.zeros((25, 48, 64, 3), np.uint8)
            sink.write(VideoChunk(frames, 0), AudioChunk(np.zeros(16000, np.float32), 0))
            sink.close()
        assert kvs.connections and kvs.connections[0].signature_ok
        assert sink.status.fragments_acked["RECEIVED"] == 3
