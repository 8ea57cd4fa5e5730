"""``talkloop bench --calls N``: the calls per node, measured with real calls, cached for
``talkloop worker --slots auto``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from talkloop.pipeline.args import config_from_args, serve_flags
from talkloop.pipeline.bench import calls as calls_bench
from talkloop.pipeline.bench import run as bench_run
from talkloop.pipeline.bench.calls import (
    capacity_file,
    measure_calls,
    measured_capacity,
    one_call,
    passes,
    start_together,
    stop_server,
)
from talkloop.pipeline.cli import build_parser, main
from talkloop.pipeline.cluster.cli import auto_slots
from talkloop.pipeline.core.errors import ConfigError


def _call(late_pct: float = 0.0, skipped: int = 0, errors: tuple = ()) -> dict:
    return {"late_pct": late_pct, "skipped_frames": skipped, "errors": list(errors)}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("calls", "ok"),
    [
        ([_call(0.0), _call(1.0)], True),
        ([_call(0.0), _call(1.2)], False),  # one call over 1 % fails the level
        ([_call(0.0, skipped=3)], False),  # a skipped chunk fails it
        ([_call(0.0, errors=("boom",))], False),
    ],
)
def test_a_level_passes_only_when_every_call_kept_up(calls, ok) -> None:
    assert passes({"per_call": calls}) is ok


@pytest.mark.unit
def test_a_call_reports_how_evenly_its_media_reached_the_client() -> None:
    # Audio every 20 ms but for one stall of 100 ms and one of 70: two gaps past 60 ms; video
    # every 40 ms but one 120 ms wait. The server's own counts say nothing of either.
    audio = [0.02 * i for i in range(50)] + [1.08 + 0.02 * i for i in range(20)]
    audio += [audio[-1] + 0.07 + 0.02 * i for i in range(10)]
    video = [0.04 * i for i in range(25)] + [1.08 + 0.04 * i for i in range(10)]
    stats = {"frames_sent": 35, "late_frames": 0, "overrun_frames": 0, "skipped_frames": 0}
    stats["runtime"] = {"backend": "onnxruntime", "dtype": "float32", "int8": []}
    record = {"stats": [stats], "video_times": video, "audio_times": audio}
    call = one_call({**record, "session": {"video": None}, "errors": []})
    assert call["runtime"] == stats["runtime"]  # what the server computed with
    assert call["audio_gaps"] == 2
    assert call["longest_audio_gap_ms"] == pytest.approx(100.0)
    assert call["longest_video_gap_ms"] == pytest.approx(120.0)
    assert call["late_pct"] == 0.0  # what the server counted: nothing late
    lone = one_call(
        {**record, "video_times": [0.0], "audio_times": [], "session": {}, "errors": []}
    )
    assert lone["audio_gaps"] == 0 and lone["longest_video_gap_ms"] is None


def _parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.unit
def test_the_servers_of_a_calls_bench_get_the_video_and_model_flags_it_was_given() -> None:
    # The defaults: the family and its default size, nothing else (the key of the usual figure).
    assert serve_flags(_parse("bench", "--calls", "2")) == [
        "--family",
        "portrait",
        "--size",
        "512x512",
    ]
    given = ["--size", "384", "--steps", "2", "--preset", "tiny", "--untrained", "--fps", "20"]
    given += [
        "--placement",
        "a2v=offloaded",
        "--render-processes",
        "1",
        "--playout-delay-ms",
        "300",
    ]
    bench = _parse("bench", "--calls", "2", *given)
    flags = serve_flags(bench)
    assert flags[:4] == ["--family", "portrait", "--size", "384x384"]
    serve = _parse("serve", *flags)  # a `talkloop serve` with these runs what the bench was given
    assert config_from_args(serve) == config_from_args(bench)
    assert serve.playout_delay_ms == 300


@pytest.mark.unit
def test_slots_auto_takes_the_figure_measured_for_its_family_and_size(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TALKLOOP_CACHE", str(tmp_path))
    worker = _parse("worker", "--head", "--slots", "auto")
    with pytest.raises(
        ConfigError, match="talkloop bench --calls 6 --family portrait --size 512x512"
    ):
        auto_slots(worker)
    small = _parse("bench", "--calls", "6", "--size", "384")
    capacity_file(serve_flags(small)).write_text(json.dumps({"calls": 3}))
    with pytest.raises(ConfigError):  # measured at 384x384: not the figure of the default size
        auto_slots(worker)
    slots, flags = auto_slots(_parse("worker", "--head", "--slots", "auto", "--size", "384x384"))
    assert slots == 3 and flags == serve_flags(small)
    assert measured_capacity(serve_flags(_parse("bench", "--family", "studio"))) is None


@pytest.mark.unit
@pytest.mark.parametrize("flag", [("--size", "384"), ("--family", "studio")])
def test_a_worker_size_or_family_without_slots_auto_is_refused(capsys, flag) -> None:
    assert main(["worker", "--head", "--slots", "2", *flag]) == 2
    assert f"{flag[0]} picks the measured figure --slots auto takes" in capsys.readouterr().err


@pytest.mark.unit
def test_a_client_that_dies_before_it_is_ready_stops_the_level_and_the_others() -> None:
    waiting = (
        "print('ready', flush=True); import sys; sys.stdin.readline(); import time; time.sleep(60)"
    )
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for code in (waiting, "raise SystemExit(3)")
    ]
    with pytest.raises(RuntimeError, match="exited with 3 before its call started"):
        start_together(clients)
    assert clients[0].wait(timeout=10) != 0  # stopped, not left waiting for its start


@pytest.mark.unit
def test_a_server_that_does_not_exit_after_sigterm_is_killed_and_named(tmp_path) -> None:
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + (
        "print('up', flush=True); time.sleep(60)"
    )
    server = subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "up"  # its handler is in place
    with pytest.raises(RuntimeError, match=r"had not exited 1 s after SIGTERM and was killed"):
        stop_server(server, tmp_path / "serve-3.log", timeout=1.0)
    assert server.returncode == -9  # not left running
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop_server(polite, tmp_path / "serve-1.log", timeout=30.0)
    assert polite.returncode == -15


@pytest.mark.unit
def test_a_level_counts_only_when_every_run_of_it_passed(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # Level 1 passes its three runs; level 2 fails its second run only (a slow minute of the
    # VM): all three runs of it still run and are reported, the capacity is 1, level 3 never runs.
    monkeypatch.setenv("TALKLOOP_CACHE", str(tmp_path / "cache"))
    ran = []

    def level(n, seconds, serve_args, out, host, run=1):
        ran.append((n, run))
        late = 3 if (n, run) == (2, 2) else 0  # 3 of 100 slots late: over the 1 % bound
        stats = {"frames_sent": 100, "late_frames": late, "overrun_frames": 0}
        record = {"stats": [stats], "video_times": [0.0, 0.04], "audio_times": [0.0, 0.02]}
        call = one_call({**record, "session": {}, "errors": []})
        return {"calls": n, "run": run, "per_call": [call] * n, "cost": {"cores_per_call": None}}

    monkeypatch.setattr(calls_bench, "run_level", level)
    flags = serve_flags(_parse("bench", "--calls", "4"))
    result = measure_calls(4, 30, flags, tmp_path / "out", runs=3)
    assert ran == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    assert [lv["passed"] for lv in result["levels"]] == [True] * 4 + [False, True]
    assert result["calls"] == 1 and result["level_runs"] == 3
    assert measured_capacity(flags) == 1  # what `talkloop worker --slots auto` takes
    printed = capsys.readouterr().out
    assert "2 call(s), run 2 of 3, call 2: 3.0 % late or missed" in printed
    assert printed.rstrip().endswith("no skipped chunk in each of 3 runs")
    # `talkloop bench --calls 4 --level-runs 3` prints every run and how often each level passed.
    monkeypatch.setattr(bench_run, "run_worker", lambda spec, module, netns: result)
    assert main(["bench", "--calls", "4", "--level-runs", "3", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "  2 call(s), run 2: worst 3.0 % late or missed, 0 frames skipped: FAIL" in printed
    assert "cores, passed 1 calls 3/3, 2 calls 2/3); wrote" in printed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--calls", "0"], "--calls"),
        (["--calls", "2", "--seconds", "5"], "--seconds"),
        (["--calls", "2", "--level-runs", "0"], "--level-runs"),
        (["--level-runs", "3"], "--level-runs"),  # runs of what: no --calls
    ],
)
def test_bad_calls_flags_are_refused_before_anything_runs(
    tmp_path: Path, capsys, flags, words
) -> None:
    out = tmp_path / "calls"
    assert main(["bench", *flags, "--out", str(out)]) == 2
    assert words in capsys.readouterr().err and not out.exists()


@pytest.mark.e2e
def test_bench_calls_measures_real_calls_and_caches_the_figure(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("TALKLOOP_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "calls"
    bench = ["bench", "--calls", "1", "--seconds", "12", "--size", "384", "--out", str(out)]
    assert main(bench) == 0
    result = json.loads((out / "calls.json").read_text())
    (level,) = result["levels"]
    (call,) = level["per_call"]
    assert call["frames_sent"] >= 200 and not call["errors"]  # a real call ran its 12 s
    assert call["video"] == {"width": 384, "height": 384, "fps": 25}  # at the size asked for
    assert call["runtime"]["backend"] in ("torch", "onnxruntime", "openvino")
    assert 20 <= call["longest_audio_gap_ms"] < 2000  # 20 ms packets reached the client
    assert 40 <= call["longest_video_gap_ms"] < 2000
    cost = level["cost"]  # what the call cost: the server with its render workers, the client
    assert cost["server_cores"] > 0 and cost["client_cores"] > 0
    assert cost["cores_per_call"] == pytest.approx(cost["server_cores"] + cost["client_cores"])
    # ...and how the server's split: a real call's threads, named by the server, and its workers
    parts = cost["server_parts"]
    assert {"render_workers", "event_loop", "engine", "executor", "microphone"} <= set(parts)
    assert all(parts[p] > 0 for p in ("render_workers", "event_loop", "engine", "executor"))
    assert sum(parts.values()) == pytest.approx(cost["server_cores"], abs=0.02)
    assert result["calls"] == (1 if level["passed"] else 0)
    assert measured_capacity(serve_flags(_parse(*bench))) == result["calls"]
    assert measured_capacity(serve_flags(_parse("bench"))) is None  # not the default size's
    printed = capsys.readouterr().out
    assert "calls per node:" in printed and "cores a call (server and render workers" in printed
    assert "the server's cores by part: " in printed and "render workers" in printed
    assert "at the clients at most" in printed and "audio gaps over 60 ms a call" in printed
    assert f"computed on {call['runtime']['backend']}, {call['runtime']['dtype']}" in printed
