"""A photo sent by the page becomes the avatar of its call; bad photos end only that connection."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import websockets
from PIL import Image

from talkloop.agent.protocol import ProtocolError
from talkloop.pipeline.reference import fit_array
from talkloop.rtc.avatar import MAX_AVATAR_BYTES, decode_avatar

from support import load_rgb, make_reference, portraits, run, tiny_config, with_server

pytestmark = pytest.mark.unit


def encoded(image: np.ndarray, fmt: str = "JPEG", **save) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format=fmt, **save)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (None, "must be a base64 string"),
        ("", "must be a base64 string"),
        ("not base64 at all!", "not valid base64"),
        (base64.b64encode(b"just some text, no image").decode(), "not a readable image"),
        ("A" * (MAX_AVATAR_BYTES * 2), "larger than 180 kB"),
    ],
)
def test_bad_photos_are_refused_with_the_reason(image, message) -> None:
    with pytest.raises(ProtocolError, match=message) as err:
        decode_avatar(image, tiny_config())
    assert err.value.code == "bad_avatar"


def test_other_image_formats_are_refused() -> None:
    gif = encoded(make_reference(), "GIF")
    with pytest.raises(ProtocolError, match="GIF; use JPEG, PNG or WebP"):
        decode_avatar(gif, tiny_config())


def test_exif_orientation_is_applied() -> None:
    upright = make_reference(64, 96)  # portrait orientation
    stored = np.ascontiguousarray(np.rot90(upright))  # as a camera stores it: landscape
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view"
    got = decode_avatar(encoded(stored, "PNG", exif=exif), tiny_config(video={"height": 96}))
    assert got.shape == (96, 64, 3)
    assert np.abs(got.astype(int) - upright.astype(int)).mean() < 2


def test_a_portrait_photo_is_framed_and_a_faceless_one_refused() -> None:
    config = tiny_config(video={"width": 192, "height": 192}, model={"family": "portrait"})
    framed = decode_avatar(encoded(load_rgb(portraits()["astronaut"]), quality=90), config)
    assert framed.shape == (192, 192, 3)
    blank = np.full((300, 300, 3), 200, np.uint8)
    with pytest.raises(ProtocolError, match="no face"):
        decode_avatar(encoded(blank), config)


# -- through the server ---------------------------------------------------------------------------


def test_the_call_opens_on_the_sent_photo(live_pipeline) -> None:
    photo = np.zeros((80, 120, 3), np.uint8)
    photo[:, :, 0] = 220  # a red photo, nothing like the server's avatar

    async def body(server, url, port):
        opened = []
        server.on_call = opened.append
        async with websockets.connect(url + "?avatar=1") as ws:
            await ws.send(json.dumps({"type": "avatar", "image": encoded(photo, "PNG")}))
            hello = json.loads(await ws.recv())
            late = json.dumps({"type": "avatar", "image": encoded(photo, "PNG")})
            await ws.send(late)
            refused = json.loads(await ws.recv())
            return hello, refused, opened[0].session.state.fields["ref_latent"].clone()

    hello, refused, latent = run(with_server(live_pipeline, body))
    assert hello["type"] == "session"
    assert refused["type"] == "error" and refused["code"] == "bad_state"
    mine = live_pipeline.open_session(fit_array(photo, 64, 64)).state.fields["ref_latent"]
    server_own = live_pipeline.open_session(make_reference()).state.fields["ref_latent"]
    assert np.array_equal(latent.numpy(), mine.numpy())
    assert not np.array_equal(latent.numpy(), server_own.numpy())


def test_a_bad_photo_ends_only_its_connection(live_pipeline) -> None:
    async def body(server, url, port):
        async with websockets.connect(url + "?avatar=1") as ws:
            await ws.send(json.dumps({"type": "avatar", "image": "%%%"}))
            refused = json.loads(await ws.recv())
            await ws.wait_closed()
        async with websockets.connect(url + "?avatar=1") as ws:
            await ws.send(json.dumps({"type": "offer", "sdp": "v=0"}))
            wrong_first = json.loads(await ws.recv())
        async with websockets.connect(url) as ws:  # the slot is free again
            hello = json.loads(await ws.recv())
        return refused, wrong_first, hello

    refused, wrong_first, hello = run(with_server(live_pipeline, body))
    assert refused["code"] == "bad_avatar" and "base64" in refused["message"]
    assert wrong_first["code"] == "bad_avatar" and "'offer'" in wrong_first["message"]
    assert hello["type"] == "session"
