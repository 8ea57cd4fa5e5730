"""MouthNet: the mouth each frame's speech calls for, painted onto the generated latents.

The A2V moves the mouth with the speech but with too little amplitude and accuracy: on held-out
clips the mouth opening read from its video correlated 0.65 with the truth, and the dark-skinned
faces opened their mouths about half as much as the light ones. The same audio features hold
much more: this net's per-frame head, reading them alone, predicts the true mouth opening of the
same clips (held-out faces, voices and sentences) with a correlation of 0.78. So the mouth gets an
explicit path, like the visemes of a puppet:

1. ``head``: one frame's audio feature (the A2V's own audio encoder output) -> that frame's mouth
   shape, the studio's ``MOUTH_FIELDS`` (opening, width, rounding, teeth, tongue, jaw).
2. ``edit``: the high-res latent after SR, ``z' = z + delta(z, shape)``: FiLM residual conv
   blocks conditioned on the shape.

The studio gives both their exact targets: the head learns the rendered shape of training clips
from their audio; the editor sees a frame rendered with a wrong mouth and passed through the real
SR (as A2V output is at inference), and learns to add the latent change that the right mouth makes
(the whole change, and nothing else: the rest of the frame stays as the SR left it). Per frame, so
a stream split into any chunks gets the same result. Zero-initialised output: the untrained editor is the identity.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from talkloop.pipeline.models.shared.layers import FiLMEditor

# The studio's per-frame parameters the mouth path predicts and conditions on (FRAME_FIELDS names).
MOUTH_FIELDS = ("mouth_open", "mouth_width", "mouth_round", "teeth", "tongue", "jaw")


class MouthConfig(BaseModel):
    """MouthNet sizes."""

    model_config = ConfigDict(extra="forbid")

    latent_channels: int = Field(8, ge=1, le=64)
    audio_dim: int = Field(128, ge=1, le=4096)
    hidden: int = Field(128, ge=8, le=4096, description="width of the audio -> shape head")
    channels: int = Field(32, ge=8, le=1024, description="width of the latent editor")
    blocks: int = Field(3, ge=1, le=32)
    style_dim: int = Field(64, ge=8, le=4096)


class MouthNet(FiLMEditor):
    """``(high-res latents, per-frame audio features) -> latents with the speech's mouth``."""

    def __init__(self, cfg: MouthConfig) -> None:
        super().__init__(cfg.latent_channels, cfg.channels, cfg.blocks, cfg.style_dim)
        self.cfg = cfg
        n, sd = len(MOUTH_FIELDS), cfg.style_dim
        self.head = nn.Sequential(
            nn.Linear(cfg.audio_dim, cfg.hidden),
            nn.GELU(),
            nn.Linear(cfg.hidden, cfg.hidden),
            nn.GELU(),
            nn.Linear(cfg.hidden, n),
        )
        self.style = nn.Sequential(nn.Linear(n, sd), nn.SiLU(), nn.Linear(sd, sd))

    def shape_of(self, audio: Tensor) -> Tensor:
        """(T, audio_dim) audio features -> (T, len(MOUTH_FIELDS)) predicted mouth shape."""
        if audio.ndim != 2 or audio.shape[1] != self.cfg.audio_dim:
            raise ValueError(f"audio must be (T, {self.cfg.audio_dim}), got {tuple(audio.shape)}")
        return self.head(audio)

    def edit(self, z: Tensor, shape: Tensor) -> Tensor:
        """Give each latent frame its mouth shape.

        Args:
            z: (T, C, H, W) scaled high-res latents.
            shape: (T, len(MOUTH_FIELDS)) mouth shape per frame.
        Returns:
            (T, C, H, W) ``z + delta``.
        """
        c = self.cfg
        if z.ndim != 4 or z.shape[1] != c.latent_channels:
            raise ValueError(f"z must be (T, {c.latent_channels}, H, W), got {tuple(z.shape)}")
        if shape.shape != (z.shape[0], len(MOUTH_FIELDS)):
            raise ValueError(
                f"shape must be ({z.shape[0]}, {len(MOUTH_FIELDS)}), got {tuple(shape.shape)}"
            )
        return self.apply_style(z, self.style(shape.to(z.dtype)))

    def forward(self, z: Tensor, audio: Tensor) -> Tensor:
        """(T, C, H, W) latents, (T, audio_dim) features of the same frames -> edited latents."""
        if audio.shape[0] != z.shape[0]:
            raise ValueError(f"{z.shape[0]} latent frames but {audio.shape[0]} audio features")
        return self.edit(z, self.shape_of(audio))
