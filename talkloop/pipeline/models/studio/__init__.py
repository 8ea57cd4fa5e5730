"""The studio family: synthetic characters, a latent model trained here on rendered talking faces.

``family.py`` builds the networks (one file each: VAE, audio and text encoders, expression net,
A2V DiT, SR DiT, mouth net) and the stages; ``backend.py`` runs the hot ones as exported graphs.
"""

from pathlib import Path

from talkloop.pipeline.models.spec import FamilySpec, SizeRule, StateField

SPEC = FamilySpec(
    name="studio",
    package=__name__,
    summary="the synthetic characters",
    # VAE x8, the A2V works at half the latent resolution with patch 2: multiples of 32.
    size_rule=SizeRule(32, 64, 1024),
    native_sizes=((256, 256),),
    block_modules=("a2v", "sr"),
    state_fields=(
        StateField("ref_latent", "(1, C, h, w) the reference as encoded, kept for prompt changes"),
        StateField("ref_latent_hr", "(1, C, h, w) with the prompt's expression: SR's reference"),
        StateField(
            "decoder_cache", "the streaming decoder's last few latent frames", starts_empty=True
        ),
    ),
    # Live calls: 5-frame chunks without I chunks and 2 Euler steps, the shortest chunks that kept
    # up in live calls (docs/benchmarks.md, "Why the live schedules are what they are").
    live_schedule={"first_len": 2, "n_len": 5, "i_len": 0, "ctx_len": 2},
    live_sampler={"steps": 2},
    backends=("torch", "onnxruntime", "openvino"),
    weights=Path(__file__).parent / "weights",
    cli_args="talkloop.pipeline.models.studio.cli:add_args",
    trainer="talkloop.pipeline.models.studio.cli:train",
    evaluator="talkloop.pipeline.models.studio.cli:evaluate_cli",
)
