"""Mp4Sink: streams, exact durations, start at 0, audio fidelity, atomic finish, bad setups."""

from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np
import pytest

from talkloop.pipeline.core.errors import ConfigError, InputError
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.mp4 import Mp4Sink
from talkloop.pipeline.outputs.sink import Sink

from mp4_probe import make_audio, make_frame, probe, render

pytestmark = pytest.mark.unit

AAC_PRIMING = 1024  # samples FFmpeg's AAC encoder emits before sample 0


@pytest.mark.parametrize(
    ("fps", "num_frames", "extra_audio"),
    [
        (25, 1, 0),  # a single frame: 640 samples, less than one AAC frame
        (25, 64, 0),  # 40960 samples = 40 AAC frames exactly
        (30, 47, 0),  # 25066 samples: not a multiple of 1024, nor is 16000 / 30
        (24, 73, 0),  # 16000 / 24 is not an integer: frame durations of 666 and 667
        (24, 10, 123),  # audio running on past the start of the last frame
    ],
)
def test_streams_durations_and_start(tmp_path, fps, num_frames, extra_audio):
    info = StreamInfo(width=64, height=48, fps=fps, sample_rate=16000)
    num_samples = info.frame_pts(num_frames) + extra_audio
    audio = make_audio(num_samples, info.sample_rate)
    sink = Mp4Sink(tmp_path / "out.mp4")
    assert isinstance(sink, Sink)
    render(sink, info, num_frames, audio)
    sink.close()

    p = probe(tmp_path / "out.mp4")
    assert p.codecs == {"video": "h264", "audio": "aac"}
    assert p.time_bases == {"video": Fraction(1, 16000), "audio": Fraction(1, 16000)}
    assert p.start_times == {"video": 0, "audio": 0}
    assert p.first_pts["video"] == 0
    # The priming packet sits before 0 and the edit list hides it: decoding starts at sample 0.
    assert p.first_pts["audio"] == -AAC_PRIMING
    assert p.audio_first_frame_pts == 0
    # Video ends exactly at the clock's position of frame N (N / fps to within one sample)...
    assert p.end_pts["video"] == info.frame_pts(num_frames)
    assert abs(p.end_pts["video"] - num_frames * 16000 / fps) < 1
    # ...and audio at the last sample written.
    assert p.end_pts["audio"] == num_samples
    assert p.video_frames == num_frames
    assert sink.frames_written == num_frames and sink.samples_written == num_samples


def test_decoded_audio_matches_input_without_offset(tmp_path):
    info = StreamInfo(width=64, height=64, fps=25, sample_rate=16000)
    audio = make_audio(info.frame_pts(75) + 333, info.sample_rate)
    sink = Mp4Sink(tmp_path / "out.mp4")
    render(sink, info, 75, audio)
    sink.close()
    decoded = probe(tmp_path / "out.mp4").audio
    assert decoded.shape[0] >= audio.shape[0]  # the decoder emits the last frame whole
    decoded = decoded[: audio.shape[0]]
    lags = range(-AAC_PRIMING - 8, AAC_PRIMING + 9)
    scores = [
        float(np.dot(decoded[max(0, k) :], audio[: audio.shape[0] - max(0, k)]))
        if k >= 0
        else float(np.dot(decoded[:k], audio[-k:]))
        for k in lags
    ]
    assert lags[int(np.argmax(scores))] == 0  # in sync with the video clock: no priming delay
    assert np.corrcoef(decoded, audio)[0, 1] > 0.98


def test_video_frames_decode_close_to_input(tmp_path):
    info = StreamInfo(width=64, height=64, fps=25, sample_rate=16000)
    sink = Mp4Sink(tmp_path / "out.mp4", crf=18)
    render(sink, info, 20, make_audio(info.frame_pts(20), 16000))
    sink.close()

    with av.open(str(tmp_path / "out.mp4")) as c:
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    for j in (0, 9, 19):  # right frame at the right index (frames differ from each other)
        err = np.abs(decoded[j].astype(int) - make_frame(j, 64, 64).astype(int)).mean()
        assert err < 6, (j, err)


def test_close_renames_atomically_and_leaves_no_temp(tmp_path):
    info = StreamInfo(width=64, height=64, fps=25, sample_rate=16000)
    target = tmp_path / "out.mp4"
    sink = Mp4Sink(target)
    render(sink, info, 30, make_audio(info.frame_pts(30), 16000))
    temp = sink.temp_path
    assert (
        temp is not None and temp.parent == tmp_path and temp.name.startswith(".out.mp4.partial-")
    )
    assert not target.exists()  # nothing at the target until the file is complete
    sink.close()
    assert target.exists() and not temp.exists()
    assert os.listdir(tmp_path) == ["out.mp4"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_abort_leaves_no_file(tmp_path):
    info = StreamInfo(width=64, height=64, fps=25, sample_rate=16000)
    sink = Mp4Sink(tmp_path / "out.mp4")
    render(sink, info, 60, make_audio(info.frame_pts(60), 16000))
    sink.abort()
    assert os.listdir(tmp_path) == []
    sink.close()  # after abort: a no-op, still nothing
    assert os.listdir(tmp_path) == []


def test_abort_keeps_an_existing_target(tmp_path):
    target = tmp_path / "out.mp4"
    target.write_bytes(b"previous render")
    sink = Mp4Sink(target)
    render(sink, StreamInfo(64, 64, 25, 16000), 5, make_audio(3200, 16000))
    sink.abort()
    assert target.read_bytes() == b"previous render"


def test_close_without_frames_creates_nothing(tmp_path):
    sink = Mp4Sink(tmp_path / "out.mp4")
    sink.open(StreamInfo(64, 64, 25, 16000))
    sink.close()
    assert os.listdir(tmp_path) == []


def test_missing_directory_fails_at_open(tmp_path):
    sink = Mp4Sink(tmp_path / "no" / "such" / "out.mp4")
    with pytest.raises(InputError, match="does not exist.*no/such"):
        sink.open(StreamInfo(64, 64, 25, 16000))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_fails_at_open(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(InputError, match="cannot write.*locked"):
            Mp4Sink(locked / "out.mp4").open(StreamInfo(64, 64, 25, 16000))
    finally:
        locked.chmod(0o755)


def test_directory_that_is_a_file_fails_at_open(tmp_path):
    # Works as root too: the "directory" is a regular file, so nothing can be created in it.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="does not exist"):
        Mp4Sink(blocker / "out.mp4").open(StreamInfo(64, 64, 25, 16000))


def test_unwritable_directory_on_readonly_fs_fails_at_open():
    # /proc is read-only for everyone, root included.
    with pytest.raises(InputError, match="cannot write.*/proc"):
        Mp4Sink("/proc/out.mp4").open(StreamInfo(64, 64, 25, 16000))


@pytest.mark.parametrize(("w", "h"), [(63, 64), (64, 47), (0, 64)])
def test_odd_or_empty_size_fails_at_open(tmp_path, w, h):
    with pytest.raises(InputError, match=f"{w}x{h}"):
        Mp4Sink(tmp_path / "out.mp4").open(StreamInfo(w, h, 25, 16000))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs", [{"crf": 60}, {"preset": "warp"}, {"audio_bitrate": 0}])
def test_bad_settings_fail_at_construction(tmp_path, kwargs):
    with pytest.raises(ConfigError):
        Mp4Sink(tmp_path / "out.mp4", **kwargs)


def test_out_of_order_writes_are_refused(tmp_path):
    info = StreamInfo(64, 64, 25, 16000)
    sink = Mp4Sink(tmp_path / "out.mp4")
    sink.open(info)
    frames = np.zeros((2, 64, 64, 3), np.uint8)
    sink.write(VideoChunk(frames, 0), AudioChunk(np.zeros(1280, np.float32), 0))
    with pytest.raises(ValueError, match="expected frame 2"):
        sink.write(VideoChunk(frames, 5), AudioChunk(np.zeros(1280, np.float32), 1280))
    with pytest.raises(ValueError, match="expected audio sample 1280"):
        sink.write(VideoChunk(frames, 2), AudioChunk(np.zeros(1280, np.float32), 0))
    with pytest.raises(ValueError, match=r"\(T, 64, 64, 3\)"):
        sink.write(VideoChunk(np.zeros((1, 32, 64, 3), np.uint8), 2), AudioChunk(np.zeros(0), 0))
    sink.abort()
    assert os.listdir(tmp_path) == []


def test_audio_pending_between_writes_is_bounded(tmp_path):
    info = StreamInfo(64, 64, 25, 16000)
    sink = Mp4Sink(tmp_path / "out.mp4")
    sink.open(info)
    for k in range(10):  # 640 samples per write: never a whole AAC frame at once
        a = np.zeros(640, np.float32)
        sink.write(VideoChunk(np.zeros((1, 64, 64, 3), np.uint8), k), AudioChunk(a, k * 640))
        assert sink._pending.shape[0] < 1024
    sink.close()
    assert probe(tmp_path / "out.mp4").end_pts["audio"] == 6400
