"""Run under ``torchrun --nproc-per-node 2``: render the tiny config with a2v and sr sharded.

Rank 0 (the publisher) saves the frames to ``argv[1]``; every rank checks that its a2v weights
are real shards (half of each tensor) and that only the publisher opened a sink.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest helpers

from talkloop.pipeline.assets import HELLO_WAV  # noqa: E402
from talkloop.pipeline.audio.io import load_audio  # noqa: E402
from talkloop.pipeline.models.registry import (
    build_pipeline,
    load_modules,  # noqa: E402
)
from talkloop.pipeline.offload.distributed import is_publisher  # noqa: E402
from talkloop.pipeline.offload.placement import apply_placement  # noqa: E402

from support import CollectSink, liven, make_reference, tiny_config  # noqa: E402


def main(out: str, dtype: str) -> None:
    config = tiny_config(model={"dtype": dtype, "placement": {"a2v": "sharded", "sr": "sharded"}})
    # The same random weights as the resident reference: liven full tensors, then shard them.
    modules = load_modules(tiny_config(model={"dtype": dtype}))
    liven(modules)
    apply_placement(modules, config.model)
    w = modules["a2v"].net.blocks[0].attn.qkv.weight
    assert w.to_local().shape[0] * 2 == w.shape[0], (w.to_local().shape, w.shape)
    sinks = [CollectSink()] if is_publisher() else []
    speech = load_audio(HELLO_WAV, 16000)[:8000]
    build_pipeline(config, modules).open_session(make_reference(), sinks=sinks).render([speech])
    if is_publisher():
        np.save(out, sinks[0].all_frames())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    # The frames are saved and every check has passed. Leave without the interpreter's and
    # torch's C++ teardown: in one of four CI runs on 2026-12-06 a gloo rank aborted there, after
    # main() had returned ("terminate called without an active exception": a thread still
    # joinable when its owner was destroyed), failing a run whose frames were right.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
