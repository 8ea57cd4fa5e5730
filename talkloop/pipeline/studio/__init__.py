"""The studio: synthetic talking faces with exact ground truth, for training and metrics.

Public API::

    from talkloop.pipeline.studio import iter_clips, make_clip, sample_character, Renderer, FrameParams
"""

from __future__ import annotations

from talkloop.pipeline.studio.character import Character, sample_character
from talkloop.pipeline.studio.dataset import (
    Clip,
    iter_clips,
    load_clip,
    make_clip,
    region_weights,
    write_clip,
    write_dataset,
)
from talkloop.pipeline.studio.params import FRAME_FIELDS, MOUTH_FIELDS, FrameParams
from talkloop.pipeline.studio.renderer import Renderer, RenderOutput, render_frames
from talkloop.pipeline.studio.splits import SPLITS, voices
from talkloop.pipeline.studio.style import STYLE_FIELDS, Style, describe

__all__ = [
    "Character",
    "Clip",
    "FRAME_FIELDS",
    "FrameParams",
    "MOUTH_FIELDS",
    "RenderOutput",
    "Renderer",
    "SPLITS",
    "STYLE_FIELDS",
    "Style",
    "describe",
    "iter_clips",
    "load_clip",
    "make_clip",
    "region_weights",
    "render_frames",
    "sample_character",
    "voices",
    "write_clip",
    "write_dataset",
]
