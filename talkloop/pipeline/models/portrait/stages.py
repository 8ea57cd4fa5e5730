"""The portrait family's own stages: the photo prepared for warping, and parameters -> frames.

The chunk stages between them are the shared ones (audio features, N/I context, the A2V sampler):
the motion net is an A2V DiT over one 16-channel token per frame (``motion.py``).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.core.workers import Bound, shared_pool
from talkloop.pipeline.models.portrait.blinks import blink_track
from talkloop.pipeline.models.portrait.face import detect_faces, face_landmarks, person_mask
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.portrait.render import PortraitRenderer

BLINK = FRAME_FIELDS.index("blink")


class PortraitReferenceStage(Stage):
    """Landmarks and person mask of the framed photo -> its renderer (the photo, its mesh and
    warp weights) and the motion net's rest parameters (the A2V's reference frame)."""

    name = "portrait_reference"
    reads = ("reference_image",)
    writes = ("renderer", "a2v_reference")
    needs = ("a2v",)

    def run(self, ctx: StageContext) -> None:

        image = ctx.read("reference_image")  # (H, W, 3) uint8, framed by load_reference
        faces = detect_faces(image)
        if not faces:
            raise InputError(
                "no face found in the reference image: use a photo of one person facing the camera"
            )
        landmarks = face_landmarks(image, faces[0])  # (478, 3)
        ctx.write("renderer", PortraitRenderer(image, landmarks, person_mask(image)))
        ctx.write("a2v_reference", ctx.module("a2v").config.rest_latent())  # (1, 16, 1, 1)


class PortraitRenderStage(Stage):
    """Motion latents in display order -> raw parameters (plus the seeded blinks of
    ``blinks.py``) -> frames warped from the photo.

    With ``processes`` the frames are rendered in that many worker processes shared by every
    session of the process (``model.render_processes``, ``talkloop/pipeline/core/workers.py``):
    each session's renderer is sent to one of them at its first chunk, the same renderer that
    stays in the session's state, so the frames are the ones it would render here.
    """

    name = "render"
    reads = ("segment_latents", "segment_start", "seed", "renderer")
    writes = ("frames",)
    needs = ("a2v",)

    def __init__(self, fps: int, processes: int = 0) -> None:
        self.fps = fps
        self.pool = shared_pool(processes, (PortraitRenderer.__module__,)) if processes else None
        self._bound: weakref.WeakKeyDictionary[PortraitRenderer, Bound] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def run(self, ctx: StageContext) -> None:
        params = ctx.module("a2v").config.denormalise(ctx.read("segment_latents"))  # (T, 16)
        blinks = blink_track(ctx.read("seed"), ctx.read("segment_start"), len(params), self.fps)
        params[:, BLINK] = np.maximum(params[:, BLINK], blinks)
        ctx.write("frames", self._render(ctx.read("renderer"), params))  # (T, H, W, 3) uint8

    def _render(self, renderer: PortraitRenderer, params: np.ndarray) -> np.ndarray:
        if self.pool is None:
            return renderer.render(params)
        with self._lock:
            bound = self._bound.get(renderer)
        if bound is None:  # the session's first chunk (one session's chunks never overlap)
            bound = self.pool.bind(renderer)
            with self._lock:
                self._bound[renderer] = bound
        return bound.call("render", params)
