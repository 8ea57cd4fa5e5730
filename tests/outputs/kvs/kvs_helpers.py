"""Shared helpers for the KVS mirror tests: a clean AWS environment and decoding what arrived."""

from __future__ import annotations

import io
import threading

import av
import numpy as np

ACCESS_KEY = "AKIDTALKLOOPTEST"
SECRET_KEY = "talkloop/secret/for/tests/only"
REGION = "us-east-1"
STREAM = "talkloop-test"


def clean_aws_env(monkeypatch, tmp_path, with_credentials: bool = True) -> None:
    """No config files, no instance metadata, only the credentials the test chooses."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask 169.254.169.254
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    if with_credentials:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)


def decode_mkv(body: bytes) -> tuple[dict[int, np.ndarray], np.ndarray, int | None, int]:
    """Decode a received Matroska body with PyAV.

    Returns (video frames by pts in ms, audio samples (float32 mono), pts in samples of the
    first audio sample, sample rate).
    """
    frames: dict[int, np.ndarray] = {}
    with av.open(io.BytesIO(body)) as c:
        for frame in c.decode(video=0):
            frames[int(frame.pts)] = frame.to_ndarray(format="rgb24")
    audio: list[np.ndarray] = []
    first: int | None = None
    rate = 0
    with av.open(io.BytesIO(body)) as c:
        for frame in c.decode(audio=0):
            rate = frame.sample_rate
            if first is None:
                first = round(float(frame.pts * frame.time_base) * rate)
            audio.append(frame.to_ndarray().reshape(-1))
    samples = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    return frames, samples, first, rate


def kvs_threads() -> list[threading.Thread]:
    """Mirror threads still alive (a test must leave none)."""
    return [t for t in threading.enumerate() if t.name.startswith("kvs-")]
