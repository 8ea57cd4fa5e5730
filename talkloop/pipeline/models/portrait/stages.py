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


class RenderWorkers:
    """Where the sessions' renderers render: on the session's own thread, or with
    ``processes`` in that many worker processes shared by every session of the process
    (``model.render_processes``, ``talkloop/pipeline/core/workers.py``). A session's renderer is
    sent to one of them when the session opens and renders once there, so its first chunk pays
    for neither; it stays in the session's state too, and the frames are the ones it renders
    here."""

    def __init__(self, processes: int = 0) -> None:
        self.pool = shared_pool(processes, (PortraitRenderer.__module__,)) if processes else None
        self._bound: weakref.WeakKeyDictionary[PortraitRenderer, Bound] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def prepare(self, renderer: PortraitRenderer) -> None:
        """Send ``renderer`` to its worker (nothing without processes)."""
        if self.pool is None:
            return
        bound = self.pool.bind(renderer)
        bound.call("render", np.zeros((1, len(FRAME_FIELDS)), np.float32))  # first-use costs
        with self._lock:
            self._bound[renderer] = bound

    def render(self, renderer: PortraitRenderer, params: np.ndarray) -> np.ndarray:
        """``renderer.render(params)``, in its worker when it has one."""
        with self._lock:
            bound = self._bound.get(renderer)
        if bound is None:
            return renderer.render(params)
        return bound.call("render", params)


class PortraitReferenceStage(Stage):
    """Landmarks and person mask of the framed photo -> its renderer (the photo, its mesh and
    warp weights, handed to ``workers``) and the motion net's rest parameters (the A2V's
    reference frame)."""

    name = "portrait_reference"
    reads = ("reference_image",)
    writes = ("renderer", "a2v_reference")
    needs = ("a2v",)

    def __init__(self, workers: RenderWorkers | None = None) -> None:
        self.workers = workers or RenderWorkers()

    def run(self, ctx: StageContext) -> None:

        image = ctx.read("reference_image")  # (H, W, 3) uint8, framed by load_reference
        faces = detect_faces(image)
        if not faces:
            raise InputError(
                "no face found in the reference image: use a photo of one person facing the camera"
            )
        landmarks = face_landmarks(image, faces[0])  # (478, 3)
        renderer = PortraitRenderer(image, landmarks, person_mask(image))
        self.workers.prepare(renderer)
        ctx.write("renderer", renderer)
        ctx.write("a2v_reference", ctx.module("a2v").config.rest_latent())  # (1, 16, 1, 1)


class PortraitRenderStage(Stage):
    """Motion latents in display order -> raw parameters (plus the seeded blinks of
    ``blinks.py``) -> frames warped from the photo (by ``workers``: the same object the
    reference stage handed the renderer to)."""

    name = "render"
    reads = ("segment_latents", "segment_start", "seed", "renderer")
    writes = ("frames",)
    needs = ("a2v",)

    def __init__(self, fps: int, workers: RenderWorkers | None = None) -> None:
        self.fps = fps
        self.workers = workers or RenderWorkers()

    def run(self, ctx: StageContext) -> None:
        params = ctx.module("a2v").config.denormalise(ctx.read("segment_latents"))  # (T, 16)
        blinks = blink_track(ctx.read("seed"), ctx.read("segment_start"), len(params), self.fps)
        params[:, BLINK] = np.maximum(params[:, BLINK], blinks)
        frames = self.workers.render(ctx.read("renderer"), params)  # (T, H, W, 3) uint8
        ctx.write("frames", frames)
