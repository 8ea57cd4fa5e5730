"""The page: a user picks a photo of a person and calls the portrait avatar made from it."""

from __future__ import annotations

import pytest

from netns import artifact, needs_chromium, run_in_netns
from support import portraits

pytestmark = pytest.mark.e2e
HOPPER = portraits()["grace_hopper"]


@needs_chromium
def test_a_photo_picked_in_the_page_is_the_avatar_of_the_call() -> None:
    shot = artifact("browser-portrait-upload.png")
    r = run_in_netns(
        "portrait_page.py", "--photo", str(HOPPER), "--screenshot", str(shot), timeout=300
    )
    s = r["stats"]
    # decoded at the portrait's size (no frame rate floor: that is this machine's speed)
    assert s["frameWidth"] == 256 and s["framesDecoded"] > 0
    # The session was opened on the uploaded photo (re-encoded by the page), not the default.
    assert r["diff_to_upload"] < 6 < r["diff_to_default"]
    assert [m for m in r["console"] if m.startswith("error")] == []
    assert shot.stat().st_size > 10_000
