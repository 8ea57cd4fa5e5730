"""On a CUDA device: offloaded frames equal resident ones, masters are pinned, stalls are measured.

Skipped without CUDA (tests/conftest.py). Passed on one NVIDIA H200 (2026-11-30, 9.7 s).
"""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.models.registry import build_pipeline, load_modules
from talkloop.pipeline.offload.offloaded import BlockOffloader

from support import CollectSink, liven, make_reference, tiny_config

pytestmark = pytest.mark.gpu


def frames(placement: dict, speech: np.ndarray, measure: bool = False):
    config = tiny_config(model={"device": "cuda", "dtype": "bfloat16", "placement": placement})
    modules = load_modules(config)
    liven(modules)
    for m in modules.values():
        if isinstance(m.runtime, BlockOffloader):
            m.runtime.measure = measure
    sink = CollectSink()
    build_pipeline(config, modules).open_session(make_reference(), sinks=[sink]).render(
        [speech[:8000]]
    )
    return sink.all_frames(), modules


def test_cuda_offloaded_frames_equal_cuda_resident_frames(speech):
    want, _ = frames({}, speech)
    got, modules = frames({"a2v": "offloaded", "sr": "offloaded"}, speech, measure=True)
    np.testing.assert_array_equal(got, want)
    off: BlockOffloader = modules["a2v"].runtime
    assert all(b.master.is_pinned() for b in off.blocks)  # else copies silently go synchronous
    stalls = off.stalls()
    assert stalls["per_block"] and all(ms >= 0 for ms in stalls["per_block"])
