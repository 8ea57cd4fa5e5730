"""Pixel-level evaluation of the portrait family: what ships, rendered and read back.

``talkloop eval --family portrait --photos P --audio A --out O``. Every photo x audio file x
prompt is rendered by ``talkloop render``'s own code (``talkloop.pipeline.render.render_file``:
the same config, ``build_pipeline``, session and mp4, written to ``O/clips/``), with the offline
schedule and, with ``--live``, the family's live one. A sink beside the mp4 keeps the frames as
the renderer made them (before H.264). The shipped face models (``face.py``) then read every
frame back: the landmarks of frame 0 from a detection, each next frame's refitted around the
previous frame's (mediapipe's tracking), a new detection where that fails. Nothing here reads
the motion net's parameters.

Units and definitions (``DEFINITIONS``, also written to ``eval.json``):

- **face height**: eye line (mean of the four eye corners) to chin (152), on the framed photo
  as the same models read it; one fixed length per photo, so the jaw's own motion does not move
  the unit. Openings are in face heights.
- **opening**: the inner lips' gap, mean of three pairs across the middle (82-87, 13-14,
  312-317), measured across the line between the inner corners (78-308); signed, so lips the
  landmarks see pressed together read about 0 or below.
- **pauses / speech**: each frame's 40 ms of audio (the frame's own interval) has an RMS; the
  clip's speech level is the 95th percentile of those. Speech: frames at or above -30 dB of
  it. Pauses: below it for at least 200 ms, less 80 ms at either end (the mouth may still be
  closing or already opening).
- **envelope correlation**: Pearson r of the opening and that RMS per frame, at the best lag
  within +-80 ms (+ = the video late).
- **bilabials** (``bilabials.py``): per p/b/m, the smallest opening over the frames its phone
  overlaps, one frame more each side; closed = below ``CLOSED`` face heights above what closed
  lips read on that face (its renderer's neutral rest, all-zero parameters, read back).
- **width**: mouth-corner distance (61-291) / face width (234-454) in the same frame; at rest
  = the median over pause frames.
- **teeth stability**: mean absolute RGB change (0-255) inside both frames' inner-lip polygons,
  mouths mapped onto one patch by their inner corners, over pairs of speech frames whose
  openings are at least ``TEETH_OPEN`` above closed and within ``TEETH_TOLERANCE`` of each other
  and whose widths are within ``TEETH_WIDTH_TOLERANCE`` (the same mouth shape: what changes is
  the interior, teeth and tongue).
- **background change**: mean absolute RGB change (0-255) against the framed photo where
  the photo's person mask (``face.person_mask``), grown by 3 % of the frame width, is below
  0.05.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from talkloop.pipeline.audio.io import load_audio
from talkloop.pipeline.core.config import SamplerConfig, ScheduleConfig, TalkloopConfig
from talkloop.pipeline.core.errors import ConfigError, InputError
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.models import registry
from talkloop.pipeline.models.portrait import family
from talkloop.pipeline.models.portrait import topology as topo
from talkloop.pipeline.models.portrait.bilabials import Phone, bilabials, clip_phones
from talkloop.pipeline.models.portrait.evaluate import matmul_dtype
from talkloop.pipeline.models.portrait.face import (
    CHIN,
    LEFT_EYE_CORNERS,
    MOUTH_CORNERS,
    RIGHT_EYE_CORNERS,
    detect_faces,
    face_landmarks,
    person_mask,
    refine_landmarks,
)
from talkloop.pipeline.models.portrait.mesh import N_FACE
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.portrait.render import PortraitRenderer
from talkloop.pipeline.render import render_file
from talkloop.pipeline.train.metrics import envelope, lag_correlations

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac")
DEFAULT_PROMPTS = ("serious", "smiling")

EYE_CORNERS = RIGHT_EYE_CORNERS + LEFT_EYE_CORNERS
INNER_PAIRS = ((82, 87), (13, 14), (312, 317))  # upper, lower inner-lip points across the middle
INNER_CORNERS = (78, 308)
CHEEKS = (234, 454)
INNER_LIP = topo.LIPS_INNER_UPPER + topo.LIPS_INNER_LOWER[-2:0:-1]  # closed polygon

QUIET_DB = -30.0
SPEECH_LEVEL_PERCENTILE = 95
MIN_PAUSE_FRAMES = 5
PAUSE_MARGIN_FRAMES = 2
MAX_LAG_FRAMES = 2
WIDE_LAG_FRAMES = 5
# Face heights above what closed lips read on the face (``Photo.closed``).
CLOSED = 0.01
TEETH_OPEN = 0.03
TEETH_TOLERANCE = 0.005
TEETH_WIDTH_TOLERANCE = 0.01  # mouth width / face width
TEETH_PAIRS = 2000
BACKGROUND_MASK = 0.05
BACKGROUND_GROW = 0.03
PATCH = (96, 48)  # mouth patch (width, height); the inner corners at x = 12 and 84
ZOOM = 3

SWEEP_OPEN = (0.25, 0.5, 1.0)  # mouth_open values of the per-photo opening sweep

DEFINITIONS = {
    "face_height": "eye line (mean of eye corners 33, 133, 263, 362) to chin (152) on the framed "
    "photo, read by the shipped landmark model; one length per photo",
    "opening": "inner-lip gap (mean of pairs 82-87, 13-14, 312-317) across the inner-corner line "
    "78-308, signed, in face heights",
    "pauses": f"frames whose 40 ms RMS is below {QUIET_DB:g} dB of the clip's speech level (the "
    f"{SPEECH_LEVEL_PERCENTILE}th percentile of frame RMS) for >= {MIN_PAUSE_FRAMES * 40} ms, "
    f"{PAUSE_MARGIN_FRAMES * 40} ms trimmed at either end",
    "speech": f"frames whose 40 ms RMS is at or above {QUIET_DB:g} dB of the speech level",
    "envelope_corr": f"Pearson r of opening and frame RMS, best lag within "
    f"+-{MAX_LAG_FRAMES * 40} ms (+ = video late)",
    "bilabial_min_opening": "per p/b/m phone: the smallest opening over the frames it overlaps, "
    f"one frame more each side; closed = below closed_reads + {CLOSED} face heights",
    "closed_reads": "the opening read on the photo's renderer at all-zero parameters (the neutral "
    "rest, lips closed by construction): what closed lips read on that face",
    "width": "mouth corners 61-291 / face width 234-454 in the same frame; rest = median over pauses",
    "teeth_change": f"mean |RGB change| (0-255) inside both inner-lip polygons, mouths mapped "
    f"onto one patch by their inner corners, speech frame pairs with openings >= closed_reads "
    f"+ {TEETH_OPEN} within +-{TEETH_TOLERANCE} face heights and widths within "
    f"+-{TEETH_WIDTH_TOLERANCE}",
    "opening_by_parameter": "per photo, the opening at mouth_open "
    f"{', '.join(f'{v:g}' for v in SWEEP_OPEN)} (every other parameter 0): 'rig' from the rig's "
    "moved landmarks (the geometry the renderer draws), 'read' from the rendered frame; the rig "
    "is in face units, so a photo's 'read' below or above the others' is how its mouth looks",
    "background_change": "mean |RGB change| (0-255) against the framed photo where its person "
    f"mask, grown by {BACKGROUND_GROW:.0%} of the frame width, is below {BACKGROUND_MASK}",
}


# -- measures -----------------------------------------------------------------------------------------


def face_height(landmarks: np.ndarray) -> float:
    """Eye line (mean of the four eye corners) to chin, in pixels, of one (478, 3) face."""
    lm = np.asarray(landmarks, np.float64)[:, :2]
    return float(np.linalg.norm(lm[CHIN] - lm[list(EYE_CORNERS)].mean(0)))


def mouth_opening(landmarks: np.ndarray, unit: float) -> np.ndarray:
    """Signed inner-lip gap of (T, 478, 3) landmarks in units of ``unit`` pixels -> (T,)."""
    lm = np.asarray(landmarks, np.float64)[..., :2]
    d = lm[:, INNER_CORNERS[1]] - lm[:, INNER_CORNERS[0]]
    down = np.stack([-d[:, 1], d[:, 0]], 1) / np.linalg.norm(d, axis=1, keepdims=True)
    up, low = (list(p) for p in zip(*INNER_PAIRS, strict=True))
    gap = ((lm[:, low] - lm[:, up]) * down[:, None, :]).sum(-1).mean(1)
    return gap / unit


def mouth_width(landmarks: np.ndarray) -> np.ndarray:
    """Mouth-corner distance / face width of (T, 478, 3) landmarks -> (T,)."""
    lm = np.asarray(landmarks, np.float64)[..., :2]
    mouth = np.linalg.norm(lm[:, MOUTH_CORNERS[1]] - lm[:, MOUTH_CORNERS[0]], axis=1)
    return mouth / np.linalg.norm(lm[:, CHEEKS[1]] - lm[:, CHEEKS[0]], axis=1)


@dataclass(frozen=True)
class SpeechSplit:
    """Per-frame RMS of the audio and which frames are speech and which are pauses."""

    rms: np.ndarray  # (T,) float32
    level: float  # the speech level: the SPEECH_LEVEL_PERCENTILE-th percentile of rms
    speech: np.ndarray  # (T,) bool
    pauses: np.ndarray  # (T,) bool


def split_speech(audio: np.ndarray, frames: int, fps: int, sample_rate: int) -> SpeechSplit:
    """Speech and pause frames of a clip from its audio energy (see the module docstring).

    Args:
        audio: (n,) float32 mono at ``sample_rate``.
        frames: the clip's frames.
    """
    rms = envelope(audio, frames, fps, sample_rate)
    level = float(np.percentile(rms, SPEECH_LEVEL_PERCENTILE)) if frames else 0.0
    quiet = rms < level * 10 ** (QUIET_DB / 20) if level > 0 else np.ones(frames, bool)
    pauses = np.zeros(frames, bool)
    j = 0
    while j < frames:
        if not quiet[j]:
            j += 1
            continue
        k = j
        while k < frames and quiet[k]:
            k += 1
        if k - j >= MIN_PAUSE_FRAMES:
            pauses[j + PAUSE_MARGIN_FRAMES : k - PAUSE_MARGIN_FRAMES] = True
        j = k
    return SpeechSplit(rms, level, ~quiet, pauses)


def track_landmarks(frames: Sequence[np.ndarray]) -> np.ndarray:
    """(T, 478, 3) landmarks of the largest face in each frame; NaN where none is found.

    Frame 0 (and any frame after a lost one) from a detection; the others refitted around the
    previous frame's landmarks, as mediapipe tracks a face in video.
    """
    out = np.full((len(frames), 478, 3), np.nan, np.float32)
    prev = None
    for t, frame in enumerate(frames):
        lm = None
        if prev is not None:
            try:
                lm = refine_landmarks(frame, prev)
            except InputError:
                lm = None
        if lm is None:
            faces = detect_faces(frame)
            try:
                lm = face_landmarks(frame, faces[0]) if faces else None
            except InputError:
                lm = None
        if lm is not None:
            out[t] = lm
        prev = lm
    return out


def mouth_patches(
    frames: Sequence[np.ndarray], landmarks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each frame's mouth on one patch (inner corners at fixed points) and its inner-lip mask.

    Returns:
        ``(T, PATCH_H, PATCH_W, 3)`` uint8 patches and ``(T, PATCH_H, PATCH_W)`` bool masks
        (empty where the frame has no landmarks).
    """
    w, h = PATCH
    dst = np.array([[12.0, h / 2], [w - 12.0, h / 2]])
    patches = np.zeros((len(frames), h, w, 3), np.uint8)
    masks = np.zeros((len(frames), h, w), bool)
    for t, frame in enumerate(frames):
        lm = landmarks[t, :, :2].astype(np.float64)
        if not np.isfinite(lm).all():
            continue
        src = lm[list(INNER_CORNERS)]
        m = _similarity(src, dst)  # (2, 3) frame -> patch
        patches[t] = cv2.warpAffine(frame, m, (w, h), flags=cv2.INTER_LINEAR)
        poly = lm[list(INNER_LIP)] @ m[:, :2].T + m[:, 2]
        mask = np.zeros((h, w), np.uint8)
        cv2.fillPoly(mask, [np.round(poly * 4).astype(np.int32)], 1, cv2.LINE_8, shift=2)
        masks[t] = cv2.erode(mask, np.ones((3, 3), np.uint8)).astype(bool)
    return patches, masks


def _similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(2, 3) rotation + scale + shift taking the two points ``src`` onto ``dst``."""
    s, d = complex(*(src[1] - src[0])), complex(*(dst[1] - dst[0]))
    a = d / s
    shift = complex(*dst[0]) - a * complex(*src[0])
    return np.array([[a.real, -a.imag, shift.real], [a.imag, a.real, shift.imag]])


def teeth_change(
    patches: np.ndarray,
    masks: np.ndarray,
    opening: np.ndarray,
    width: np.ndarray,
    eligible: np.ndarray,
    closed: float = 0.0,
    seed: int = 0,
) -> dict:
    """Pixel change inside the mouth between eligible frames of (nearly) equal opening and
    width (the same mouth shape), the opening at least ``TEETH_OPEN`` above ``closed``."""
    idx = np.nonzero(eligible & (opening >= closed + TEETH_OPEN))[0]
    pairs = [
        (int(i), int(j))
        for a, i in enumerate(idx)
        for j in idx[a + 1 :]
        if abs(opening[i] - opening[j]) <= TEETH_TOLERANCE
        and abs(width[i] - width[j]) <= TEETH_WIDTH_TOLERANCE
    ]
    if len(pairs) > TEETH_PAIRS:
        pick = np.random.default_rng(seed).choice(len(pairs), TEETH_PAIRS, replace=False)
        pairs = [pairs[k] for k in sorted(pick)]
    diffs = []
    for i, j in pairs:
        both = masks[i] & masks[j]
        if both.sum() < 20:
            continue
        d = np.abs(patches[i].astype(np.int16) - patches[j].astype(np.int16))[both]
        diffs.append(float(d.mean()))
    return {
        "pairs": len(diffs),
        "frames": int(idx.size),
        "median": float(np.median(diffs)) if diffs else None,
        "p90": float(np.percentile(diffs, 90)) if diffs else None,
    }


def background_region(photo: np.ndarray) -> np.ndarray:
    """(H, W) bool: where the framed photo is background, well away from the person."""
    h, w = photo.shape[:2]
    person = (person_mask(photo) >= BACKGROUND_MASK).astype(np.uint8)
    r = max(1, round(BACKGROUND_GROW * w))
    grown = cv2.dilate(person, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1)))
    return grown == 0


def background_change(frames: Sequence[np.ndarray], photo: np.ndarray, region: np.ndarray) -> dict:
    """Mean |RGB change| against the photo over ``region``: the clip's mean and worst frame."""
    if not region.any():
        return {"fraction_of_frame": 0.0, "mean": None, "max_frame": None}
    ref = photo[region].astype(np.int16)
    per_frame = [float(np.abs(f[region].astype(np.int16) - ref).mean()) for f in frames]
    return {
        "fraction_of_frame": float(region.mean()),
        "mean": float(np.mean(per_frame)),
        "max_frame": float(np.max(per_frame)),
    }


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else None


def _filled(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN frames filled from their neighbours (for correlations)."""
    ok = np.isfinite(x)
    if ok.all() or not ok.any():
        return np.nan_to_num(x)
    t = np.arange(len(x))
    return np.interp(t, t[ok], x[ok])


def bilabial_figures(
    phones: list[Phone], opening: np.ndarray, fps: int, closed: float = 0.0
) -> tuple[dict, list[dict]]:
    """Closure at each bilabial (``DEFINITIONS``; closed: below ``closed + CLOSED``) and the
    figures over a clip."""
    rows = []
    for p in bilabials(phones):
        a = max(0, int(np.floor(p.start * fps)) - 1)
        b = min(len(opening), int(np.ceil(p.end * fps)) + 1)
        seg = opening[a:b]
        seg = seg[np.isfinite(seg)]
        if seg.size == 0:
            continue
        k = a + int(np.nanargmin(opening[a:b]))
        rows.append(
            {
                "phone": p.phone,
                "time": round((p.start + p.end) / 2, 3),
                "frame": k,
                "min_opening": float(seg.min()),
            }
        )
    mins = np.array([r["min_opening"] for r in rows])
    summary = {
        "count": len(rows),
        "min_opening_median": float(np.median(mins)) if rows else None,
        "closed_fraction": float((mins < closed + CLOSED).mean()) if rows else None,
    }
    return summary, rows


# -- one clip ---------------------------------------------------------------------------------------


class FrameSink:
    """Keeps every frame the session publishes, in order (short clips only)."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        self.chunks.append(np.array(video.frames, copy=True))

    def close(self) -> None:
        pass

    abort = close

    def frames(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros((0, 1, 1, 3), np.uint8)


@dataclass
class Photo:
    """A framed photo, its landmarks as the shipped models read them, and its units.

    ``neutral`` is the photo's renderer (built as ``PortraitReferenceStage`` builds it) at
    all-zero parameters: the rest face with the lips closed by construction. Read back, its
    opening is what closed lips read on this face (``closed``), the zero of the bilabial and
    teeth thresholds.
    """

    name: str
    path: Path
    image: np.ndarray  # (H, W, 3) uint8, as load_reference frames it
    landmarks: np.ndarray  # (478, 3)
    unit: float  # face height in pixels
    background: np.ndarray  # (H, W) bool
    neutral: np.ndarray  # (H, W, 3) uint8
    neutral_landmarks: np.ndarray  # (478, 3)
    sweep: dict  # opening_by_parameter (DEFINITIONS)

    @classmethod
    def load(cls, config: TalkloopConfig, path: Path) -> Photo:
        image = registry.load_reference(config, path)
        faces = detect_faces(image)
        if not faces:
            raise InputError(f"{path}: the landmark model finds no face in the framed photo")
        lm = face_landmarks(image, faces[0])
        renderer = PortraitRenderer(image, lm, person_mask(image))
        neutral = renderer.render(np.zeros((1, len(FRAME_FIELDS)), np.float32))[0]
        back = track_landmarks([neutral])[0]
        if not np.isfinite(back).all():
            raise InputError(f"{path}: the landmark model finds no face in the neutral render")
        unit = face_height(lm)
        sweep = opening_sweep(renderer, lm, unit)
        return cls(path.stem, path, image, lm, unit, background_region(image), neutral, back, sweep)

    @property
    def closed(self) -> float:
        """The opening closed lips read on this face (the neutral render's), in face heights."""
        return float(mouth_opening(self.neutral_landmarks[None], self.unit)[0])


def opening_sweep(renderer: PortraitRenderer, landmarks: np.ndarray, unit: float) -> dict:
    """``opening_by_parameter`` (DEFINITIONS) of one photo's renderer."""
    params = np.zeros((len(SWEEP_OPEN), len(FRAME_FIELDS)), np.float32)
    params[:, FRAME_FIELDS.index("mouth_open")] = SWEEP_OPEN
    moved = np.repeat(np.asarray(landmarks, np.float32)[None], len(SWEEP_OPEN), 0)
    moved[:, :N_FACE, :2] += renderer.rig.displacements(params)[:, :N_FACE]
    read = mouth_opening(track_landmarks(list(renderer.render(params))), unit)
    return {
        "mouth_open": list(SWEEP_OPEN),
        "rig": [float(x) for x in mouth_opening(moved, unit)],
        "read": [None if not np.isfinite(x) else float(x) for x in read],
    }


@dataclass
class Clip:
    """One rendered clip: its frames, what the models read back and its figures."""

    photo: str
    voice: str
    prompt: str
    schedule: str
    frames: np.ndarray  # (T, H, W, 3) uint8
    landmarks: np.ndarray  # (T, 478, 3), NaN where lost
    opening: np.ndarray  # (T,)
    width: np.ndarray  # (T,)
    split: SpeechSplit
    bilabial_rows: list[dict]
    figures: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return clip_key(self.photo, self.voice, self.prompt, self.schedule)


def clip_key(photo: str, voice: str, prompt: str, schedule: str) -> str:
    """The file stem of a clip's sheet and mp4: ``photo__voice__prompt__schedule``."""
    return "__".join(slug(s) for s in (photo, voice, prompt, schedule))


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` ("" -> "none")."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "none"


def measure_clip(
    photo: Photo,
    audio_path: Path,
    audio: np.ndarray,
    frames: np.ndarray,
    prompt: str,
    schedule: str,
    fps: int,
    sample_rate: int,
) -> Clip:
    """Read a rendered clip back and compute its figures (``DEFINITIONS``)."""
    t0 = time.perf_counter()
    lm = track_landmarks(frames)
    opening, width = mouth_opening(lm, photo.unit), mouth_width(lm)
    split = split_speech(audio, len(frames), fps, sample_rate)
    phones, source = clip_phones(audio_path, audio, sample_rate)
    speech_open = _median(opening[split.speech])
    bil, rows = bilabial_figures(phones, opening, fps, photo.closed)
    wide = lag_correlations([_filled(opening)], [split.rms.astype(np.float64)], WIDE_LAG_FRAMES)
    lags, corrs = lag_correlations(
        [_filled(opening)], [split.rms.astype(np.float64)], MAX_LAG_FRAMES
    )
    best = int(np.argmax(corrs))
    patches, masks = mouth_patches(frames, lm)
    lost = ~np.isfinite(opening)
    figures = {
        "frames": len(frames),
        "frames_without_face": int(lost.sum()),
        "speech_frames": int(split.speech.sum()),
        "pause_frames": int(split.pauses.sum()),
        "face_height_px": photo.unit,
        "closed_reads": photo.closed,
        "opening_pause_median": _median(opening[split.pauses]),
        "opening_pause_max": float(np.nanmax(opening[split.pauses]))
        if split.pauses.any()
        else None,
        "opening_speech_median": speech_open,
        "opening_speech_p90": float(np.nanpercentile(opening[split.speech], 90))
        if split.speech.any()
        else None,
        "envelope_corr": {
            "r": float(corrs[best]),
            "lag_ms": int(lags[best]) * 1000 // fps,
            "r_at_0": float(corrs[MAX_LAG_FRAMES]),
            # Wider than the figure's window, to show where the peak lies when it is at an edge.
            "r_by_lag_ms": {
                int(lag) * 1000 // fps: round(float(r), 3) for lag, r in zip(*wide, strict=True)
            },
        },
        "bilabials": {"source": source, **bil},
        "width_rest_median": _median(width[split.pauses]),
        "width_speech_median": _median(width[split.speech]),
        "teeth_change": teeth_change(patches, masks, opening, width, split.speech, photo.closed),
        "background_change": background_change(frames, photo.image, photo.background),
        "readback_seconds": time.perf_counter() - t0,
    }
    return Clip(
        photo.name,
        audio_path.stem,
        prompt,
        schedule,
        frames,
        lm,
        opening,
        width,
        split,
        rows,
        figures,
    )


# -- contact sheets ----------------------------------------------------------------------------------

_PANEL = 256


_AROUND = [(dx, dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1) if dx or dy]


def _label(img: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """White text outlined in black. The outline is the same thin text drawn a pixel off in
    each direction: OpenCV spaces a thicker stroke's letters wider, so a thick black copy
    under the thin white one drifted off it along the line and made it unreadable."""
    out = img.copy()
    font = cv2.FONT_HERSHEY_SIMPLEX
    for k, text in enumerate(lines):
        y = 16 + 16 * k
        for dx, dy in _AROUND:
            cv2.putText(out, text, (5 + dx, y + dy), font, 0.42, (0, 0, 0), 1, cv2.LINE_AA)
        cv2.putText(out, text, (5, y), font, 0.42, (255, 255, 255), 1, cv2.LINE_AA)
    return out


def _mouth_zoom(frame: np.ndarray, lm: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """A ``_PANEL`` square of the mouth at ``ZOOM`` x the frame's pixels."""
    pts = lm if np.isfinite(lm).all() else fallback
    c = pts[[*MOUTH_CORNERS, 0, 17], :2].mean(0)
    side = _PANEL / ZOOM
    m = np.array([[1 / ZOOM, 0, c[0] - side / 2], [0, 1 / ZOOM, c[1] - side / 2]])
    return cv2.warpAffine(
        frame,
        m,
        (_PANEL, _PANEL),
        flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REPLICATE,
    )


def _strip(clip: Clip, marks: dict[str, int], width: int, fps: int) -> np.ndarray:
    """Opening (blue) and audio RMS (grey) over time; pauses shaded, bilabials ticked."""
    h = 150
    img = np.full((h, width, 3), 255, np.uint8)
    n = len(clip.opening)
    if n < 2:
        return img
    xs = (np.arange(n) * (width - 1) / (n - 1)).astype(np.int32)
    for t in np.nonzero(clip.split.pauses)[0]:
        img[:, max(0, xs[t] - 1) : xs[t] + 2] = (235, 235, 200)
    rms = clip.split.rms / max(float(clip.split.rms.max()), 1e-9)
    ys = (h - 10 - rms * (h - 30)).astype(np.int32)
    cv2.polylines(img, [np.stack([xs, ys], 1)], False, (160, 160, 160), 1, cv2.LINE_AA)
    top = max(0.15, float(np.nanmax(clip.opening)) if np.isfinite(clip.opening).any() else 0.15)
    o = np.nan_to_num(clip.opening, nan=0.0)
    yo = (h - 10 - np.clip(o, -0.02, top) / top * (h - 30)).astype(np.int32)
    cv2.polylines(img, [np.stack([xs, yo], 1)], False, (30, 60, 220), 2, cv2.LINE_AA)
    zero = h - 10
    cv2.line(img, (0, zero), (width, zero), (0, 0, 0), 1)
    closed = int(h - 10 - (clip.figures["closed_reads"] + CLOSED) / top * (h - 30))
    cv2.line(img, (0, closed), (width, closed), (0, 160, 0), 1)
    for r in clip.bilabial_rows:
        x = int(r["time"] * fps * (width - 1) / (n - 1))
        cv2.line(img, (x, zero - 6), (x, zero + 6), (0, 120, 0), 2)
    for name, t in marks.items():
        cv2.line(img, (int(xs[t]), 14), (int(xs[t]), zero), (200, 0, 0), 1)
        cv2.putText(
            img,
            name,
            (int(xs[t]) + 2, 12),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.38,
            (200, 0, 0),
            1,
            cv2.LINE_AA,
        )
    cv2.putText(
        img,
        f"opening (blue, face heights, top {top:.2f}); audio RMS (grey); pauses shaded; "
        f"p/b/m ticks; green line = closed reading + {CLOSED}",
        (5, h - 1),
        cv2.FONT_HERSHEY_SIMPLEX,
        0.35,
        (0, 0, 0),
        1,
        cv2.LINE_AA,
    )
    return img


def sheet_frames(clip: Clip) -> dict[str, int]:
    """The frames a contact sheet shows: the most closed bilabial (else the most closed speech
    frame), the widest speech frame, the middle of the longest pause."""
    o = np.where(np.isfinite(clip.opening), clip.opening, np.nan)
    speech = clip.split.speech & np.isfinite(o)
    pick: dict[str, int] = {}
    if clip.bilabial_rows:
        rows = sorted(clip.bilabial_rows, key=lambda r: r["min_opening"])
        pick["p/b/m (median)"] = int(rows[len(rows) // 2]["frame"])
    elif speech.any():
        pick["closed"] = int(np.nanargmin(np.where(speech, o, np.inf)))
    if speech.any():
        pick["widest"] = int(np.nanargmax(np.where(speech, o, -np.inf)))
    runs, j, p = [], 0, clip.split.pauses
    while j < len(p):
        if p[j]:
            k = j
            while k < len(p) and p[k]:
                k += 1
            runs.append((k - j, (j + k) // 2))
            j = k
        else:
            j += 1
    if runs:
        pick["pause"] = max(runs)[1]
    return pick


def contact_sheet(clip: Clip, photo: Photo, other: Clip | None, path: Path, fps: int) -> None:
    """One PNG per clip: the photo, the bilabial, widest and pause frames, and the widest frame's
    moment in ``other`` (the same audio under another prompt); under each its mouth at 3x; then
    the opening over time."""
    marks = sheet_frames(clip)
    panels: list[tuple[str, np.ndarray, np.ndarray, list[str]]] = [
        (
            "photo",
            photo.image,
            photo.landmarks,
            ["framed photo", f"opening {mouth_opening(photo.landmarks[None], photo.unit)[0]:+.3f}"],
        ),
        (
            "neutral",
            photo.neutral,
            photo.neutral_landmarks,
            ["renderer, zero params", f"opening {photo.closed:+.3f} (closed)"],
        ),
    ]
    for name, t in marks.items():
        lines = [f"{name}: frame {t} ({t / fps:.2f} s)", f"opening {clip.opening[t]:+.3f}"]
        panels.append((name, clip.frames[t], clip.landmarks[t], lines))
    if other is not None and "widest" in marks:
        t = min(marks["widest"], len(other.frames) - 1)
        lines = [f"'{other.prompt}' at frame {t}", f"opening {other.opening[t]:+.3f}"]
        panels.append(("other", other.frames[t], other.landmarks[t], lines))
    cols = []
    for _, frame, lm, lines in panels:
        small = cv2.resize(frame, (_PANEL, _PANEL), interpolation=cv2.INTER_AREA)
        zoom = _mouth_zoom(frame, lm, photo.landmarks)
        cols.append(np.concatenate([_label(small, lines), zoom], 0))
    grid = np.concatenate(cols, 1)
    title = np.full((28, grid.shape[1], 3), 255, np.uint8)
    f = clip.figures
    text = (
        f"{clip.photo} | {clip.voice} | prompt '{clip.prompt}' | {clip.schedule} | pause "
        f"{_fmt(f['opening_pause_median'])} speech {_fmt(f['opening_speech_median'])} | "
        f"env r {f['envelope_corr']['r']:.2f} | width rest {_fmt(f['width_rest_median'])}"
    )
    cv2.putText(title, text, (5, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    strip = _strip(clip, marks, grid.shape[1], fps)
    sheet = np.concatenate([title, grid, strip], 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR))


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


# -- the evaluation ----------------------------------------------------------------------------------


def collect(paths: Sequence[Path], suffixes: tuple[str, ...], what: str) -> list[Path]:
    """Files of ``suffixes`` in the given folders (sorted) and the given files themselves."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.iterdir() if f.suffix.lower() in suffixes)
        elif p.is_file():
            found.append(p)
        else:
            raise InputError(f"{what} {p} does not exist")
    if not found:
        raise InputError(f"no {what} files ({', '.join(suffixes)}) in {', '.join(map(str, paths))}")
    return found


def schedules(config: TalkloopConfig, live: bool) -> dict[str, TalkloopConfig]:
    """The offline config and, with ``live``, the family's live schedule and sampler on it."""
    out = {"offline": config}
    if live:
        # As `talkloop serve` makes a call's config (talkloop.rtc.app.live_config_dict).
        sampler = SamplerConfig(**{**config.sampler.model_dump(), **family.LIVE_SAMPLER})
        out["live"] = config.model_copy(
            update={"schedule": ScheduleConfig(**family.LIVE_SCHEDULE), "sampler": sampler}
        )
    return out


def evaluate_pixels(
    config: TalkloopConfig,
    photos: Sequence[Path],
    audio: Sequence[Path],
    out: Path,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    live: bool = False,
    progress: bool = True,
) -> dict:
    """Render every photo x audio file x prompt (x schedule) and score the frames.

    Args:
        config: the ``talkloop render`` config (``config_from_args``).
        photos, audio: files, or folders of them.
        out: writes ``eval.json``, ``sheets/*.png`` (one per clip) and ``clips/*.mp4``.
        prompts: the style prompts each clip is rendered with.
        live: also render with the family's live schedule.

    Returns:
        What ``eval.json`` holds.
    """
    if config.model.family != "portrait":
        raise ConfigError(
            f"the pixel evaluation is the portrait family's, not {config.model.family}"
        )
    if not prompts:
        raise ConfigError("give at least one prompt")
    photo_files = collect(photos, PHOTO_SUFFIXES, "photo")
    audio_files = collect(audio, AUDIO_SUFFIXES, "audio")
    out = Path(out)
    (out / "clips").mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    t0 = time.perf_counter()
    plans = schedules(config, live)
    modules = registry.load_modules(config)
    pipelines = {name: registry.build_pipeline(c, modules) for name, c in plans.items()}
    fps, rate = config.video.fps, config.audio.sample_rate
    result: dict = {
        "definitions": DEFINITIONS,
        "video": {"width": config.video.width, "height": config.video.height, "fps": fps},
        "weights": str(config.model.weights or family.installed_weights()),
        "dtype": matmul_dtype(modules["a2v"]),
        "seed": config.seed,
        "schedules": {
            n: c.schedule.model_dump() | {"steps": c.sampler.steps} for n, c in plans.items()
        },
        "prompts": list(prompts),
        "photos": {},
        "clips": [],
    }
    for photo_path in photo_files:
        try:
            photo = Photo.load(config, photo_path)
        except InputError as err:
            say(f"{photo_path}: skipped: {err}")
            result["photos"][photo_path.stem] = {"path": str(photo_path), "error": str(err)}
            continue
        result["photos"][photo.name] = {
            "path": str(photo_path),
            "face_height_px": photo.unit,
            "opening": float(mouth_opening(photo.landmarks[None], photo.unit)[0]),
            "width": float(mouth_width(photo.landmarks[None])[0]),
            "closed_reads": photo.closed,
            "neutral_width": float(mouth_width(photo.neutral_landmarks[None])[0]),
            "opening_by_parameter": photo.sweep,
        }
        for audio_path in audio_files:
            samples = load_audio(audio_path, rate)
            for schedule, pipeline in pipelines.items():
                clips: list[Clip] = []
                for prompt in prompts:
                    sink = FrameSink()
                    t = time.perf_counter()
                    key = clip_key(photo.name, audio_path.stem, prompt, schedule)
                    mp4 = out / "clips" / f"{key}.mp4"
                    render_file(
                        plans[schedule],
                        audio_path,
                        mp4,
                        photo_path,
                        prompt,
                        pipeline=pipeline,
                        extra_sinks=[sink],
                    )
                    render_s = time.perf_counter() - t
                    clip = measure_clip(
                        photo, audio_path, samples, sink.frames(), prompt, schedule, fps, rate
                    )
                    clip.figures["render_seconds"] = render_s
                    clips.append(clip)
                for k, clip in enumerate(clips):
                    other = clips[k + 1] if k + 1 < len(clips) else (clips[0] if k else None)
                    sheet = out / "sheets" / f"{clip.key}.png"
                    contact_sheet(clip, photo, other, sheet, fps)
                    result["clips"].append(
                        {
                            "photo": clip.photo,
                            "voice": clip.voice,
                            "prompt": clip.prompt,
                            "schedule": clip.schedule,
                            "audio": str(audio_path),
                            "sheet": str(sheet.relative_to(out)),
                            "video": f"clips/{clip.key}.mp4",
                            **clip.figures,
                            "bilabial_phones": clip.bilabial_rows,
                        }
                    )
                    f = clip.figures
                    say(
                        f"{clip.key}: rendered in {f['render_seconds']:.1f} s, read back in "
                        f"{f['readback_seconds']:.1f} s"
                    )
    result["seconds"] = time.perf_counter() - t0
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


TABLE_HEADER = (
    "photo | voice | prompt | sched | open pause | open speech | env r (lag) | p/b/m closed "
    "(min) | width rest | teeth | bg"
)


def row_line(row: dict) -> str:
    """One clip's figures on a line (``TABLE_HEADER``)."""
    b, e = row["bilabials"], row["envelope_corr"]
    closed = (
        "n/a"
        if not b["count"]
        else f"{b['closed_fraction']:.0%} of {b['count']} ({b['min_opening_median']:.3f})"
    )
    return " | ".join(
        [
            row["photo"],
            row["voice"],
            row["prompt"],
            row["schedule"],
            _fmt(row["opening_pause_median"]),
            _fmt(row["opening_speech_median"]),
            f"{e['r']:.2f} ({e['lag_ms']:+d} ms)",
            closed,
            _fmt(row["width_rest_median"]),
            "n/a"
            if row["teeth_change"]["median"] is None
            else f"{row['teeth_change']['median']:.1f}",
            "n/a"
            if row["background_change"]["mean"] is None
            else f"{row['background_change']['mean']:.2f}",
        ]
    )


def sweep_line(name: str, photo: dict) -> str:
    """One photo's ``opening_by_parameter`` on a line."""
    sweep = photo["opening_by_parameter"]
    cells = zip(sweep["mouth_open"], sweep["rig"], sweep["read"], strict=True)
    return f"{name}: opening at mouth_open (rig / read, face heights): " + ", ".join(
        f"{v:g}: {g:.3f} / {_fmt(r)}" for v, g, r in cells
    )


__all__ = [
    "DEFINITIONS",
    "SpeechSplit",
    "evaluate_pixels",
    "face_height",
    "mouth_opening",
    "mouth_width",
    "split_speech",
    "sweep_line",
    "track_landmarks",
]
