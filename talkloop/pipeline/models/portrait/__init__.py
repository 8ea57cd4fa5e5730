"""The portrait family: a real person from one photo, animated by warping the photo.

Init: face detection, dense landmarks and a head-and-shoulders framing (``framing.py``,
``face.py``). Per chunk: a flow-matching DiT over per-frame motion parameters (``motion.py``).
Publish: a renderer that warps the photo along its landmark mesh and paints the mouth interior
(``render.py``). ``family.py`` builds the modules and stages.
"""

from pathlib import Path

from talkloop.pipeline.models.spec import FamilySpec, SizeRule, StateField

SPEC = FamilySpec(
    name="portrait",
    package=__name__,
    summary="a real person from one photo (--reference PHOTO)",
    # The photo is warped at any size; H.264 codes 16-pixel macroblocks (720x1280 phones).
    size_rule=SizeRule(16, 128, 1920),
    # Square 512 is the default; the framing keeps the face at the same share of any frame.
    native_sizes=((512, 512), (384, 384), (768, 768), (720, 1280)),
    block_modules=("a2v",),
    # The motion net as exported graphs (models/shared/a2v_graph.py); the rest stays torch.
    backends=("torch", "onnxruntime", "openvino"),
    state_fields=(
        StateField("renderer", "the photo's renderer: the image, its mesh, warp weights"),
    ),
    # Live calls: 2-frame chunks (80 ms, a 240 ms playout delay) without I chunks; the sampler
    # keeps its offline steps (docs/benchmarks.md, "Why the live schedules are what they are").
    live_schedule={"first_len": 2, "n_len": 2, "i_len": 0, "ctx_len": 2},
    # Guidance on the audio: p/b/m close and live lip sync holds with 2-frame chunks
    # (docs/benchmarks.md, "Why the live schedules are what they are" and the pixel-level
    # entry of 2026-12-02 03:35); the guided pass shares the batch of the plain one.
    sampler={"audio_guidance": 2.0},
    live_sampler={},
    weights=Path(__file__).parent / "weights",
    cli_args="talkloop.pipeline.models.portrait.cli:add_args",
    trainer="talkloop.pipeline.models.portrait.cli:train",
    evaluator="talkloop.pipeline.models.portrait.cli:evaluate_cli",
    # Each frame is the photo warped by that frame's parameters (and its seeded blink).
    publish_per_frame=True,
)
