"""Mp4Sink over longer renders: flat memory, and a hard-killed writer leaves a playable file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.mp4 import Mp4Sink

from mp4_probe import make_audio, make_frame, probe

pytestmark = pytest.mark.e2e


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_memory_stays_flat_over_3000_frames(tmp_path):
    info = StreamInfo(width=256, height=256, fps=25, sample_rate=16000)
    sink = Mp4Sink(tmp_path / "long.mp4")
    sink.open(info)
    base = [make_frame(j, 256, 256) for j in range(50)]
    chunk = 10
    rss: dict[int, float] = {}
    for k in range(0, 3000, chunk):
        # Fresh arrays every segment, like a generator's output; content keeps changing.
        frames = np.stack([base[(k + i) % 50] for i in range(chunk)])
        a0, a1 = info.frame_pts(k), info.frame_pts(k + chunk)
        sink.write(VideoChunk(frames, k), AudioChunk(make_audio(a1 - a0, 16000, seed=k), a0))
        if k + chunk in (300, 3000):
            rss[k + chunk] = rss_mb()  # after a warm-up (encoder buffers, lookahead) and at end
    sink.close()
    growth = rss[3000] - rss[300]
    # 2700 more frames are 530 MB of RGB: anything kept per frame would show up here.
    assert growth < 30, f"RSS grew {growth:.1f} MB over 2700 frames"
    p = probe(tmp_path / "long.mp4")
    assert p.video_frames == 3000
    assert p.end_pts["video"] == info.frame_pts(3000) == p.end_pts["audio"]


KILLED_WRITER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    sys.path[:0] = [{helpers!r}, os.path.dirname({helpers!r})]  # and tests/, for support
    from mp4_probe import make_audio, make_frame
    from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
    from talkloop.pipeline.outputs.mp4 import Mp4Sink

    info = StreamInfo(width=64, height=64, fps=25, sample_rate=16000)
    sink = Mp4Sink({target!r})
    sink.open(info)
    for k in range(130):  # 5.2 s: keyframes (and fragments) at 0, 2 and 4 s
        a0, a1 = info.frame_pts(k), info.frame_pts(k + 1)
        frame = make_frame(k, 64, 64)[None]
        sink.write(VideoChunk(frame, k), AudioChunk(make_audio(a1 - a0, 16000, seed=k), a0))
    print(sink.temp_path, flush=True)
    os._exit(0)  # no close, no finally, no atexit: as if killed
    """
)


def test_hard_killed_writer_leaves_a_playable_temp_file(tmp_path):
    target = tmp_path / "out.mp4"
    script = KILLED_WRITER.format(helpers=os.path.dirname(__file__), target=str(target))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    temp = tmp_path / os.path.basename(done.stdout.strip())
    assert not target.exists()  # never a half-written file at the target
    assert temp.name.startswith(".out.mp4.partial-") and temp.exists()
    p = probe(temp)
    assert p.codecs == {"video": "h264", "audio": "aac"}
    assert p.start_times == {"video": 0, "audio": 0}
    # Whole fragments survive: at least frames 0..99 (two GOPs; x264 may cut extra keyframes
    # at scene changes, hence extra fragments); the fragment still open at the kill is lost.
    n = p.video_frames
    assert 100 <= n < 130
    assert p.end_pts["video"] == info_pts(n)  # a clean prefix, frame n-1 ending on the clock
    assert p.end_pts["audio"] >= info_pts(n) - 1024


def info_pts(frame: int) -> int:
    return StreamInfo(64, 64, 25, 16000).frame_pts(frame)
