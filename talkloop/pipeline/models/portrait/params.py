"""Per-frame avatar parameters: one float32 track per field, shape ``(T,)`` each.

Ranges: mouth_open, mouth_round, teeth, tongue, jaw, blink in [0, 1]; mouth_width, brow_raise,
smile, gaze_x, gaze_y in [-1, 1] (0 is neutral); yaw, pitch, roll in radians (|x| < 0.35);
tx, ty in image half-heights (down is positive).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_FIELDS = (
    "mouth_open",
    "mouth_width",
    "mouth_round",
    "teeth",
    "tongue",
    "jaw",
    "blink",
    "brow_raise",
    "smile",
    "gaze_x",
    "gaze_y",
    "yaw",
    "pitch",
    "roll",
    "tx",
    "ty",
)
MOUTH_FIELDS = ("mouth_open", "mouth_width", "mouth_round", "teeth", "tongue", "jaw")


@dataclass
class FrameParams:
    """Per-frame parameters as a ``(T, len(FRAME_FIELDS))`` float32 array with named access."""

    values: np.ndarray  # (T, F)

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.float32)
        if v.ndim != 2 or v.shape[1] != len(FRAME_FIELDS):
            raise ValueError(f"values must be (T, {len(FRAME_FIELDS)}), got {v.shape}")
        self.values = v

    @classmethod
    def neutral(cls, frames: int) -> FrameParams:
        """Mouth closed, eyes open, facing the camera."""
        return cls(np.zeros((frames, len(FRAME_FIELDS)), np.float32))

    @classmethod
    def from_tracks(cls, frames: int, **tracks: np.ndarray | float) -> FrameParams:
        """Neutral parameters with the named tracks set (scalars broadcast over frames)."""
        p = cls.neutral(frames)
        for name, track in tracks.items():
            p[name] = track
        return p

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[:, FRAME_FIELDS.index(name)]

    def __setitem__(self, name: str, track: np.ndarray | float) -> None:
        self.values[:, FRAME_FIELDS.index(name)] = track

    def slice(self, start: int, stop: int) -> FrameParams:
        """Frames ``[start, stop)`` (a copy)."""
        return FrameParams(self.values[start:stop].copy())

    def as_dict(self) -> dict[str, np.ndarray]:
        """``{field: (T,) float32}``."""
        return {name: self.values[:, i] for i, name in enumerate(FRAME_FIELDS)}
