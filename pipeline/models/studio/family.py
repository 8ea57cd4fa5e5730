"""The studio family: one root config and the constructor of its seven networks."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from pipeline.models.studio.a2v import A2VConfig, A2VDiT
from pipeline.models.studio.audio_encoder import AudioEncoderConfig, StudioAudioEncoder
from pipeline.models.studio.expression import ExpressionConfig, ExpressionNet
from pipeline.models.studio.mouth import MouthConfig, MouthNet
from pipeline.models.studio.sr import SRConfig, SRDiT
from pipeline.models.studio.text_encoder import StudioTextEncoder, TextEncoderConfig
from pipeline.models.studio.vae import StudioVAE, VAEConfig

NETWORK_KEYS = ("vae", "audio_encoder", "text_encoder", "expression", "a2v", "sr", "mouth")


class StudioConfig(BaseModel):
    """Root config of the studio family; cross-network sizes are checked to agree."""

    model_config = ConfigDict(extra="forbid")

    vae: VAEConfig = Field(default_factory=VAEConfig)
    audio: AudioEncoderConfig = Field(default_factory=AudioEncoderConfig)
    text: TextEncoderConfig = Field(default_factory=TextEncoderConfig)
    expression: ExpressionConfig = Field(default_factory=ExpressionConfig)
    a2v: A2VConfig = Field(default_factory=A2VConfig)
    sr: SRConfig = Field(default_factory=SRConfig)
    mouth: MouthConfig = Field(default_factory=MouthConfig)

    @model_validator(mode="after")
    def _agree(self) -> StudioConfig:
        c = self.vae.latent_channels
        others = {n: getattr(self, n).latent_channels for n in ("a2v", "sr", "expression", "mouth")}
        if set(others.values()) != {c}:
            raise ValueError(
                f"latent_channels disagree: vae={c}, "
                + ", ".join(f"{n}={v}" for n, v in others.items())
            )
        for name in ("a2v", "mouth"):
            if getattr(self, name).audio_dim != self.audio.dim:
                raise ValueError(
                    f"{name}.audio_dim={getattr(self, name).audio_dim} must equal "
                    f"audio.dim={self.audio.dim}"
                )
        for name in ("a2v", "expression"):
            if getattr(self, name).text_dim != self.text.dim:
                raise ValueError(
                    f"{name}.text_dim={getattr(self, name).text_dim} must equal "
                    f"text.dim={self.text.dim}"
                )
        return self

    @classmethod
    def default(cls) -> StudioConfig:
        """Sized for faster than real time at 256x256, 25 fps on a 2-core CPU in bf16."""
        return cls()

    @classmethod
    def tiny(cls) -> StudioConfig:
        """Tests: every network runs in milliseconds (the text encoder is the real one)."""
        return cls(
            vae=VAEConfig(
                enc_channels=16,
                enc_latent_channels=16,
                enc_blocks=1,
                dec_latent_channels=16,
                dec_channels=8,
                dec_latent_blocks=1,
                dec_blocks=1,
                decode_batch=1,
            ),
            audio=AudioEncoderConfig(dim=16, hidden=16),
            expression=ExpressionConfig(channels=16, blocks=1, style_dim=16),
            a2v=A2VConfig(patch=2, dim=32, depth=2, heads=2, audio_dim=16, max_frames=32),
            sr=SRConfig(dim=32, depth=1, heads=2),
            mouth=MouthConfig(audio_dim=16, hidden=16, channels=8, blocks=1, style_dim=8),
        )

    @classmethod
    def large(cls) -> StudioConfig:
        """GPU scale, for the offload check at 1280x720 (scripts/gpu_check.py), random weights.

        720 / 8 = 90 latent rows, pooled to 45 for the A2V: its patch is 5 (144 tokens a frame at
        1280x720). About 1.5 B A2V parameters in 28 blocks (~100 MB each in bf16).
        """
        return cls(
            a2v=A2VConfig(patch=5, dim=1536, depth=28, heads=12, max_frames=64),
            sr=SRConfig(patch=2, dim=1024, depth=12, heads=8),
        )


def build_networks(config: StudioConfig) -> dict[str, nn.Module]:
    """Construct all seven networks from the current ``torch.manual_seed`` state (caller seeds).

    Returns:
        ``NETWORK_KEYS`` -> module, in eval mode.
        The text encoder holds no parameters (its ``state_dict()`` is empty).
    """
    nets: dict[str, nn.Module] = {
        "vae": StudioVAE(config.vae),
        "audio_encoder": StudioAudioEncoder(config.audio),
        "text_encoder": StudioTextEncoder(config.text),
        "expression": ExpressionNet(config.expression),
        "a2v": A2VDiT(config.a2v),
        "sr": SRDiT(config.sr),
        "mouth": MouthNet(config.mouth),
    }
    for net in nets.values():
        net.eval()
    return nets
