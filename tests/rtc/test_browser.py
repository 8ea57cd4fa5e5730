"""Headless Chromium makes a call through the page; stats come from the browser's getStats()."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from netns import artifact, needs_chromium, run_in_netns

pytestmark = pytest.mark.e2e


@needs_chromium
def test_browser_call_decodes_video() -> None:
    shot = artifact("browser-call.png")
    r = run_in_netns("browser.py", "--seconds", "8", "--screenshot", str(shot))
    s = r["stats"]
    assert r["title"].startswith("talkloop")
    assert s["codec"] == "video/H264"
    # No frame rate floor and no freeze count: both are how fast this machine was (talkloop
    # bench --live measures that); the page decoded the call's video and played its audio.
    assert s["framesDecoded"] > 0
    assert s["frameWidth"] == 128
    assert s["audioSamples"] > 0 and s["micPackets"] > 0  # fake microphone reached the server
    assert float(r["overlay_fps"]) >= 0  # the page shows the server's stats (a number)
    assert r["notice"] == "No trained weights are installed (test)."  # the banner shows it
    # the agent URL the page shows: a hex token, nothing to quote but the "&" (examples/agent.py
    # takes it whole with --url)
    assert re.fullmatch(r"ws://127\.0\.0\.2:\d+/ws\?token=[0-9a-f]{32}&role=agent", r["agent_url"])
    assert r["sessions_left"] == 0  # ending the call in the page freed the session
    assert [m for m in r["console"] if m.startswith("error")] == []  # e.g. no 404 for an icon
    assert shot.stat().st_size > 10_000


@pytest.mark.skipif(not Path("/usr/bin/firefox-esr").exists(), reason="needs Debian's firefox-esr")
def test_firefox_call_negotiates_vp8_and_decodes_video() -> None:
    shot = artifact("firefox-call.png")
    r = run_in_netns("firefox.py", "--seconds", "8", "--screenshot", str(shot), timeout=240)
    s = r["stats"]
    assert r["title"].startswith("talkloop") and r["status"] == "Live"
    # Firefox has no H.264 without its downloadable plugin: the server falls back to VP8.
    assert s["codec"] == "video/VP8"
    assert s["framesDecoded"] > 0  # decoded; its rate is this machine's speed, not judged
    assert s["frameWidth"] == 128
    assert s["audioPackets"] > 0 and s["micPackets"] > 0
    assert float(r["overlay_fps"]) >= 0  # the page shows the server's stats (a number)
    assert r["sessions_left"] == 0
    assert shot.stat().st_size > 10_000


@needs_chromium
def test_page_asks_for_the_access_token_once_over_https() -> None:
    shot = artifact("browser-access.png")
    r = run_in_netns("access.py", "--screenshot", str(shot))
    # asked, refused, asked again; then kept for the tab: a reload does not ask
    assert len(r["dialogs"]) == 2 and all("access token" in d for d in r["dialogs"])
    assert r["statuses"] == ["Access token refused", "Live", "Live"]
    assert r["stored"] == r["token"]
    assert r["sessions_left"] == 0
    assert [m for m in r["console"] if m.startswith("error") and "4401" not in m] == []
    assert shot.stat().st_size > 10_000
