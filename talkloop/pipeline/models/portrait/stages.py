"""The portrait family's own stages: the photo prepared for warping, and parameters -> frames.

The chunk stages between them are the shared ones (audio features, N/I context, the A2V sampler):
the motion net is an A2V DiT over one 16-channel token per frame (``motion.py``).
"""

from __future__ import annotations

import copy
import hashlib
import threading
import weakref
from collections import OrderedDict

import numpy as np

from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.core.workers import Bound, shared_pool
from talkloop.pipeline.models.portrait.blinks import blink_track
from talkloop.pipeline.models.portrait.face import detect_faces, face_landmarks, person_mask
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.portrait.render import PortraitRenderer

BLINK = FRAME_FIELDS.index("blink")
PREPARED_PHOTOS = 4  # renderers kept for the photos used last (a few MB each)


class RenderWorkers:
    """Where the sessions' renderers render: on the session's own thread, or with
    ``processes`` in that many worker processes shared by every session of the process
    (``model.render_processes``, ``talkloop/pipeline/core/workers.py``). A photo's prepared
    renderer is sent to every one of them when its first session opens and renders once in
    each, so that session's first chunk pays for neither; later sessions of the photo (their
    handles on its arrays) render with the copies already there: a call start sends nothing
    and takes no worker's time from the calls running. A chunk's frames are split over the
    workers, each part in the one with the fewest renders in flight (rendering never changes a
    renderer): a chunk is ready when its slowest part is, and the calls' chunks spread over the
    cores. The renderer stays in the session's state too, and the frames are the ones it renders
    here (frame by frame: no frame depends on another)."""

    def __init__(self, processes: int = 0) -> None:
        self.pool = shared_pool(processes, (PortraitRenderer.__module__,)) if processes else None
        self._bound: weakref.WeakKeyDictionary[PortraitRenderer, Bound] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()  # the handles' lookup: held briefly (every render takes it)
        self._sending = threading.Lock()  # sessions starting together send their photo once

    def prepare(self, renderer: PortraitRenderer, shared: PortraitRenderer) -> None:
        """Let ``renderer`` (a session's handle on the arrays of ``shared``, the photo's prepared
        renderer) render in the workers: ``shared`` is sent to them the first time (nothing
        without processes). The workers keep it while ``shared`` or a handle lives."""
        if self.pool is None:
            return
        with self._lock:  # a photo the workers hold: no wait behind another photo's sending
            bound = self._bound.get(shared)
            if bound is not None:
                self._bound[renderer] = bound
                return
        with self._sending:
            with self._lock:
                bound = self._bound.get(shared)
            if bound is None:
                bound = self.pool.bind(shared, everywhere=True)
                zeros = np.zeros((1, len(FRAME_FIELDS)), np.float32)
                bound.call_each("render", zeros)  # first-use costs
            with self._lock:
                self._bound[shared] = self._bound[renderer] = bound

    def render(self, renderer: PortraitRenderer, params: np.ndarray) -> np.ndarray:
        """``renderer.render(params)``, in its worker when it has one."""
        with self._lock:
            bound = self._bound.get(renderer)
        if bound is None:
            return renderer.render(params)
        parts = min(len(params), bound.width)
        if parts <= 1:
            return bound.call("render", params)
        split = np.array_split(params, parts)
        return np.concatenate(bound.call_parts("render", [(p,) for p in split]))


class PortraitReferenceStage(Stage):
    """Landmarks and person mask of the framed photo -> its renderer (the photo, its mesh and
    warp weights, handed to ``workers``) and the motion net's rest parameters (the A2V's
    reference frame).

    A renderer is made once per photo (a fifth of a second: face models, mesh, mouth
    textures) and kept for the ``PREPARED_PHOTOS`` photos used last: a call with the same
    avatar as an earlier one starts from it. Rendering never changes a renderer, so sessions
    share its arrays (each holds its own handle) and, with render processes, the copies the
    workers hold."""

    name = "portrait_reference"
    reads = ("reference_image",)
    writes = ("renderer", "a2v_reference")
    needs = ("a2v",)

    def __init__(self, workers: RenderWorkers | None = None) -> None:
        self.workers = workers or RenderWorkers()
        self._prepared: OrderedDict[bytes, PortraitRenderer] = OrderedDict()
        self._lock = threading.Lock()  # the kept renderers
        self._making = threading.Lock()  # sessions of a new photo opening together make it once

    def run(self, ctx: StageContext) -> None:
        image = ctx.read("reference_image")  # (H, W, 3) uint8, framed by load_reference
        shared = self.prepared(image)
        renderer = copy.copy(shared)  # the session's own handle on the shared arrays
        self.workers.prepare(renderer, shared)
        ctx.write("renderer", renderer)
        ctx.write("a2v_reference", ctx.module("a2v").config.rest_latent())  # (1, 16, 1, 1)

    def prepared(self, image: np.ndarray) -> PortraitRenderer:
        """The renderer of ``image``: made now, or kept from a session of the same photo."""
        image = np.ascontiguousarray(image)
        key = hashlib.blake2b(image, digest_size=16).digest() + repr(image.shape).encode()
        key += image.dtype.str.encode()
        renderer = self._kept(key)
        if renderer is not None:
            return renderer
        with self._making:
            renderer = self._kept(key)  # made by a session that opened at the same moment
            if renderer is not None:
                return renderer
            faces = detect_faces(image)
            if not faces:
                raise InputError(
                    "no face found in the reference image: use a photo of one person facing the "
                    "camera"
                )
            landmarks = face_landmarks(image, faces[0])  # (478, 3)
            # Its own copy of the photo: the caller's array may change after the session opens.
            renderer = PortraitRenderer(image.copy(), landmarks, person_mask(image))
            with self._lock:
                self._prepared[key] = renderer
                while len(self._prepared) > PREPARED_PHOTOS:
                    self._prepared.popitem(last=False)
        return renderer

    def _kept(self, key: bytes) -> PortraitRenderer | None:
        with self._lock:
            renderer = self._prepared.get(key)
            if renderer is not None:
                self._prepared.move_to_end(key)
            return renderer


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
