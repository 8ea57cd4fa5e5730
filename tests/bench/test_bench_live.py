"""`talkloop bench --live`: a real call against a real server, on the tiny config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from talkloop.pipeline.cli import main

from support import tiny_args

TINY = [*tiny_args(), "--steps", "1"]


@pytest.mark.e2e
def test_live_call_reports_latency_sync_and_memory(tmp_path: Path, capsys) -> None:
    code = main(["bench", *TINY, "--live", "--seconds", "6", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr()
    r = json.loads((tmp_path / "live.json").read_text())
    assert r["errors"] == []
    # Figures, not timings: how fast this machine is at the moment is not the test's business.
    assert r["video_frames"] > 0 and r["fps"] > 0 and r["codec"] == "H264"
    assert r["frames_sent"] > 0  # from the last stats message (once a second)
    assert set(r["glass_to_glass_ms"]) == {"p50", "p95", "max", "samples", "unreadable"}
    assert r["glass_to_glass_ms"]["samples"] > 0  # its client read the frames' stamps
    assert r["av_offset_ms"]["end"] is not None
    # The call's agent spoke a reply, and its first sound reached the client.
    replies = r["reply_latency_ms"]
    assert replies["sent"] >= 1 and replies["n"] == replies["sent"] and replies["p50"] > 0
    assert len(r["late_timeline"]) >= 2 and r["memory"] and r["peak_rss_mb"] > 50
    # where the server's generation time went, as the offline bench reports it
    stages = r["stage_rtf"]
    assert "publish/decode" in stages and "n_chunk/a2v" in stages, stages
    assert all(v >= 0 for v in stages.values())
    assert sum(stages.values()) <= r["rtf"] * 1.01 + 0.005  # both rounded to 3 decimals
    out = capsys.readouterr().out
    assert "where the time goes (6 s call" in out and "reply_latency_ms p50" in out


@pytest.mark.e2e
def test_cycles_report_rss_after_every_call(tmp_path: Path, capsys) -> None:
    code = main(
        ["bench", *TINY, "--live", "--cycles", "3", "--seconds", "1", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    r = json.loads((tmp_path / "cycles.json").read_text())
    assert r["cycles"] == 3 and len(r["rss_mb"]) == 3 and r["base_rss_mb"] > 50
    assert r["calls_left_open"] == 0 and r["errors"] == []
    assert r["end_minus_base_mb"] == pytest.approx(r["rss_mb"][-1] - r["base_rss_mb"])
    assert "3 calls of 1 s" in out
    assert not (tmp_path / "live.json").exists()


@pytest.mark.unit
def test_cycles_need_live(tmp_path: Path, capsys) -> None:
    assert main(["bench", *TINY, "--cycles", "3", "--out", str(tmp_path)]) == 2
    assert "--cycles takes a count of calls with --live" in capsys.readouterr().err
