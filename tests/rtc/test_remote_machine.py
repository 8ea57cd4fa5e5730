"""A call from "another machine": `talkloop serve --host 0.0.0.0` with a self-signed certificate
and an access token in one network namespace, headless Chromium in a second one, joined by a
veth pair on loopback-range addresses (tests/rtc/scenarios/remote.py)."""

from __future__ import annotations

import shutil

import pytest

from netns import needs_chromium, run_in_netns

pytestmark = [
    pytest.mark.e2e,
    needs_chromium,
    pytest.mark.skipif(shutil.which("nsenter") is None, reason="needs nsenter"),
]


def test_chromium_on_another_machine_calls_over_https_with_the_token(tmp_path) -> None:
    shot = tmp_path / "remote.png"
    r = run_in_netns("remote.py", "--seconds", "5", "--screenshot", str(shot))
    assert "serving on https://" in r["serving_line"]  # the real CLI, on every address
    assert r["dialogs"] == ["This talkloop server needs its access token:"]  # asked once
    assert r["secure"]  # https: the page may use the microphone from another machine
    s = r["stats"]
    assert s["codec"] == "video/H264" and s["frameWidth"] == 128
    assert s["framesDecoded"] > 0  # decoded (its rate is this machine's speed: not judged)
    assert s["micPackets"] > 0  # the fake microphone's audio went to the server
    # the media went over the link between the two namespaces, nowhere else
    pair = {k: r["pair"][k] for k in ("localAddress", "remoteAddress", "localType")}
    assert pair == {
        "localAddress": r["client_addr"],
        "remoteAddress": r["server_addr"],
        "localType": "host",
    }
    assert [m for m in r["console"] if m.startswith("error")] == []
    assert r["serve_exit"] == 0 and "Traceback" not in r["serve_err"]
    assert shot.stat().st_size > 10_000
