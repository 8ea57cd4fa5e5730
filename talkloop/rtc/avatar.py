"""A photo sent by the page as the avatar of its call: checked, decoded and framed.

The page connects with ``/ws?avatar=1`` and sends ``avatar {image}`` first: the photo as base64
(the page re-encodes the user's file as a JPEG of at most 800 px, so it fits one message). The
server opens the call's session on that photo instead of the server's own avatar. A bad photo
gets one ``error {code: "bad_avatar"}`` naming the problem and the connection closes; the server
and every other call go on.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from talkloop.agent.protocol import ProtocolError
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.models.registry import load_reference

MAX_AVATAR_BYTES = 180_000  # decoded; base64 makes it 240 kB, under the 256 kB message cap
AVATAR_FORMATS = ("JPEG", "PNG", "WEBP")
MAX_AVATAR_PIXELS = 4096 * 4096  # a small file can still claim a huge canvas (decompression bomb)
AVATAR_WAIT_S = 20.0  # how long a connection that announced a photo may take to send it


def decode_avatar(image_b64: object, config: TalkloopConfig) -> np.ndarray:
    """``avatar.image`` -> the session's ``(height, width, 3)`` uint8 reference.

    Raises:
        ProtocolError: code ``bad_avatar``, the message names what is wrong with the photo.
    """
    if not isinstance(image_b64, str) or not image_b64:
        raise ProtocolError("bad_avatar", "avatar: field 'image' must be a base64 string")
    if len(image_b64) > (MAX_AVATAR_BYTES * 4) // 3 + 4:
        raise ProtocolError(
            "bad_avatar", f"avatar photo is larger than {MAX_AVATAR_BYTES // 1000} kB"
        )
    try:
        data = base64.b64decode(image_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("bad_avatar", "avatar photo is not valid base64") from None
    if len(data) > MAX_AVATAR_BYTES:
        raise ProtocolError(
            "bad_avatar", f"avatar photo is larger than {MAX_AVATAR_BYTES // 1000} kB"
        )
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format not in AVATAR_FORMATS:
                raise ProtocolError(
                    "bad_avatar",
                    f"avatar photo is {im.format or 'an unknown format'}; use JPEG, PNG or WebP",
                )
            if im.width * im.height > MAX_AVATAR_PIXELS:
                raise ProtocolError(
                    "bad_avatar", f"avatar photo is {im.width}x{im.height}: too many pixels"
                )
            im.load()
            image = np.asarray(ImageOps.exif_transpose(im).convert("RGB"), np.uint8).copy()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        raise ProtocolError("bad_avatar", "avatar photo is not a readable image") from None

    try:
        return load_reference(config, image)
    except InputError as err:
        raise ProtocolError("bad_avatar", f"avatar photo: {err}") from None
