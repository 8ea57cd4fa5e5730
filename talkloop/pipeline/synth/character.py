"""Character identity: the per-person parameters of a synthetic avatar, drawn from a seed.

Everything that stays fixed over a clip lives here (face shape, skin, hair, eyes, brows, lips,
clothing, background). Lengths are in head units: the face is about 1.1 wide and 1.35 tall, and
the renderer maps one head unit to ``head_scale`` image half-heights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

HAIR_STYLES = ("short", "bob", "long", "curly", "bun", "buzz", "sidepart")
COLLARS = ("crew", "vneck", "shirt", "hoodie")

RGB = tuple[float, float, float]

# Skin tones from light to deep; hair colours natural plus a few dyed ones.
_SKIN: tuple[RGB, ...] = (
    (0.99, 0.87, 0.77),
    (0.96, 0.80, 0.69),
    (0.92, 0.74, 0.60),
    (0.85, 0.65, 0.50),
    (0.76, 0.55, 0.40),
    (0.62, 0.43, 0.30),
    (0.48, 0.32, 0.22),
    (0.36, 0.24, 0.17),
)
_HAIR: tuple[RGB, ...] = (
    (0.10, 0.07, 0.06),
    (0.22, 0.14, 0.09),
    (0.38, 0.24, 0.14),
    (0.56, 0.38, 0.22),
    (0.80, 0.64, 0.38),
    (0.62, 0.27, 0.13),
    (0.72, 0.72, 0.74),
    (0.30, 0.33, 0.62),
    (0.78, 0.40, 0.55),
    (0.18, 0.45, 0.42),
)
_EYES: tuple[RGB, ...] = (
    (0.30, 0.18, 0.10),
    (0.45, 0.30, 0.15),
    (0.20, 0.40, 0.65),
    (0.30, 0.52, 0.35),
    (0.45, 0.45, 0.50),
    (0.15, 0.10, 0.08),
)
_PALETTE: tuple[RGB, ...] = (
    (0.20, 0.42, 0.75),
    (0.85, 0.35, 0.30),
    (0.25, 0.60, 0.50),
    (0.95, 0.70, 0.25),
    (0.55, 0.35, 0.70),
    (0.20, 0.22, 0.28),
    (0.90, 0.90, 0.88),
    (0.45, 0.65, 0.85),
    (0.80, 0.50, 0.60),
    (0.40, 0.50, 0.25),
)


@dataclass(frozen=True)
class Character:
    """Identity parameters of one avatar (fixed over a clip)."""

    seed: int
    face_width: float  # half-width of the face at cheek level
    face_top: float  # centre -> crown
    face_bottom: float  # centre -> chin
    jaw_taper: float  # 0 round face, 0.5 pointy chin
    skin: RGB
    blush: float  # 0..1 cheek tint strength
    hair_style: str
    hair: RGB
    hair_volume: float  # how far hair stands off the head
    eye: RGB
    eye_spacing: float  # half-distance between eye centres
    eye_size: float  # eye half-height
    eye_width: float  # eye half-width as a multiple of eye_size
    brow_thickness: float
    brow_arch: float
    lip: RGB
    lip_fullness: float
    mouth_base_width: float  # half-width of the closed mouth
    nose_size: float
    clothing: RGB
    collar: str
    background: RGB
    background2: RGB
    head_scale: float  # image half-heights per head unit
    head_y: float  # head centre, image units (down is positive)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def _pick(rng: np.random.Generator, items: tuple[RGB, ...], jitter: float) -> RGB:
    base = np.asarray(items[int(rng.integers(len(items)))])
    col = np.clip(base + rng.normal(0.0, jitter, 3), 0.0, 1.0)
    return (float(col[0]), float(col[1]), float(col[2]))


def _mix(a: RGB, b: RGB, t: float) -> RGB:
    return (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t)


def sample_character(seed: int) -> Character:
    """Draw a character deterministically from ``seed`` (any int >= 0)."""
    rng = np.random.default_rng([seed, 0x5EED])
    skin = _pick(rng, _SKIN, 0.015)
    bg = _pick(rng, _PALETTE, 0.05)
    bg = _mix(bg, (0.92, 0.92, 0.92), float(rng.uniform(0.35, 0.7)))  # soft, desaturated
    bg2 = _mix(bg, (0.15, 0.15, 0.2), float(rng.uniform(0.15, 0.35)))
    clothing = _pick(rng, _PALETTE, 0.04)
    lip = _mix(skin, (0.75, 0.28, 0.32), float(rng.uniform(0.45, 0.7)))
    return Character(
        seed=int(seed),
        face_width=float(rng.uniform(0.5, 0.6)),
        face_top=float(rng.uniform(0.62, 0.72)),
        face_bottom=float(rng.uniform(0.66, 0.78)),
        jaw_taper=float(rng.uniform(0.1, 0.45)),
        skin=skin,
        blush=float(rng.uniform(0.0, 1.0)),
        hair_style=HAIR_STYLES[int(rng.integers(len(HAIR_STYLES)))],
        hair=_pick(rng, _HAIR, 0.03),
        hair_volume=float(rng.uniform(0.05, 0.16)),
        eye=_pick(rng, _EYES, 0.03),
        eye_spacing=float(rng.uniform(0.2, 0.25)),
        eye_size=float(rng.uniform(0.085, 0.11)),
        eye_width=float(rng.uniform(1.0, 1.3)),
        brow_thickness=float(rng.uniform(0.018, 0.032)),
        brow_arch=float(rng.uniform(0.01, 0.05)),
        lip=lip,
        lip_fullness=float(rng.uniform(0.7, 1.3)),
        mouth_base_width=float(rng.uniform(0.17, 0.21)),
        nose_size=float(rng.uniform(0.8, 1.2)),
        clothing=clothing,
        collar=COLLARS[int(rng.integers(len(COLLARS)))],
        background=bg,
        background2=bg2,
        head_scale=float(rng.uniform(0.6, 0.68)),
        head_y=float(rng.uniform(-0.16, -0.06)),
    )
