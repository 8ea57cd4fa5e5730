"""The data generator: synthetic talking faces with exact ground truth, for training and metrics.

Public API::

    from talkloop.pipeline.synth import iter_clips, make_clip, sample_character, Renderer, FrameParams
"""

from __future__ import annotations

from talkloop.pipeline.models.portrait.params import FRAME_FIELDS, MOUTH_FIELDS, FrameParams
from talkloop.pipeline.synth.character import Character, sample_character
from talkloop.pipeline.synth.dataset import (
    Clip,
    iter_clips,
    load_clip,
    make_clip,
    region_weights,
    write_clip,
    write_dataset,
)
from talkloop.pipeline.synth.renderer import Renderer, RenderOutput, render_frames
from talkloop.pipeline.synth.splits import SPLITS, voices
from talkloop.pipeline.synth.style import STYLE_FIELDS, Style, describe

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
