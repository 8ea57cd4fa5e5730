"""``talkloop bench --calls N``: the calls per node, measured with real calls, cached for
``talkloop worker --slots auto``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from talkloop.pipeline.bench.calls import (
    capacity_file,
    measured_capacity,
    passes,
    start_together,
)
from talkloop.pipeline.cli import main
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
def test_slots_auto_takes_the_measured_figure_and_says_how_to_get_one(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TALKLOOP_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="talkloop bench --calls"):
        auto_slots("portrait")
    capacity_file("portrait").write_text(json.dumps({"calls": 3, "family": "portrait"}))
    assert auto_slots("portrait") == 3 and measured_capacity("studio") is None


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
@pytest.mark.parametrize(
    ("flags", "words"),
    [(["--calls", "0"], "--calls"), (["--calls", "2", "--seconds", "5"], "--seconds")],
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
    assert main(["bench", "--calls", "1", "--seconds", "12", "--out", str(out)]) == 0
    result = json.loads((out / "calls.json").read_text())
    (level,) = result["levels"]
    (call,) = level["per_call"]
    assert call["frames_sent"] >= 200 and not call["errors"]  # a real call ran its 12 s
    cost = level["cost"]  # what the call cost: the server with its render workers, the client
    assert cost["server_cores"] > 0 and cost["client_cores"] > 0
    assert cost["cores_per_call"] == pytest.approx(cost["server_cores"] + cost["client_cores"])
    # ...and how the server's split: a real call's threads, named by the server, and its workers
    parts = cost["server_parts"]
    assert {"render_workers", "event_loop", "engine", "executor", "microphone"} <= set(parts)
    assert all(parts[p] > 0 for p in ("render_workers", "event_loop", "engine", "executor"))
    assert sum(parts.values()) == pytest.approx(cost["server_cores"], abs=0.02)
    assert result["calls"] == (1 if level["passed"] else 0)
    assert measured_capacity("portrait") == result["calls"]
    printed = capsys.readouterr().out
    assert "calls per node:" in printed and "cores a call (server and render workers" in printed
    assert "the server's cores by part: " in printed and "render workers" in printed
