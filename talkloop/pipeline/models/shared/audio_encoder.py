"""AudioEncoder: per-video-frame log-mel windows -> one feature vector per frame.

Three steps, split so the caller owns the only state (the normalisation statistics):
``log_mel`` (fixed DSP, no parameters), ``normalise`` (streaming EMA, state in and out) and
``forward`` (the small learned encoder).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from talkloop.pipeline.core.clock import frame_start_sample


class AudioEncoderConfig(BaseModel):
    """Front end and encoder sizes. Each video frame gets a window ending ``lookahead_ms`` late."""

    model_config = ConfigDict(extra="forbid")

    sample_rate: int = Field(16000, ge=8000, le=48000)
    window_ms: float = Field(160.0, gt=0.0, le=2000.0)
    lookahead_ms: float = Field(40.0, ge=0.0, le=500.0)
    n_fft: int = Field(400, ge=16, le=4096)
    hop: int = Field(160, ge=1, le=4096)
    n_mels: int = Field(40, ge=4, le=256)
    f_min: float = Field(20.0, ge=0.0)
    f_max: float | None = Field(None, gt=0.0, description="None: sample_rate / 2")
    dim: int = Field(128, ge=8, le=2048, description="output feature width")
    hidden: int = Field(128, ge=8, le=2048, description="conv width")
    ema_decay: float = Field(0.98, ge=0.0, lt=1.0, description="per-frame EMA decay")
    var_floor: float = Field(0.25, gt=0.0, description="variance floor (log-mel units^2)")
    clip: float = Field(5.0, gt=0.0, description="normalised values are clamped to +-clip")

    @model_validator(mode="after")
    def _check(self) -> AudioEncoderConfig:
        if self.window_samples < self.n_fft:
            raise ValueError(
                f"window_ms={self.window_ms} gives {self.window_samples} samples, fewer than "
                f"n_fft={self.n_fft}; raise window_ms or lower n_fft"
            )
        f_max = self.f_max if self.f_max is not None else self.sample_rate / 2
        if not self.f_min < f_max <= self.sample_rate / 2:
            raise ValueError(
                f"need f_min < f_max <= sample_rate/2, got f_min={self.f_min}, f_max={f_max}, "
                f"sample_rate={self.sample_rate}"
            )
        return self

    @property
    def window_samples(self) -> int:
        return int(round(self.window_ms * self.sample_rate / 1000.0))

    @property
    def lookahead_samples(self) -> int:
        return int(round(self.lookahead_ms * self.sample_rate / 1000.0))

    @property
    def n_steps(self) -> int:
        """STFT frames per window (``center=False``: no padding beyond the window)."""
        return 1 + (self.window_samples - self.n_fft) // self.hop


def mel_filterbank(
    n_freqs: int, n_mels: int, sample_rate: int, f_min: float, f_max: float
) -> Tensor:
    """Triangular HTK-mel filterbank, Slaney-normalised to equal area.

    Returns:
        (n_mels, n_freqs) float32.
    """

    def hz_to_mel(f: Tensor) -> Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    def mel_to_hz(m: Tensor) -> Tensor:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    freqs = torch.linspace(0.0, sample_rate / 2, n_freqs, dtype=torch.float64)  # (n_freqs,)
    m = torch.linspace(
        hz_to_mel(torch.tensor(f_min, dtype=torch.float64)).item(),
        hz_to_mel(torch.tensor(f_max, dtype=torch.float64)).item(),
        n_mels + 2,
        dtype=torch.float64,
    )
    hz = mel_to_hz(m)  # (n_mels + 2,)
    lower, center, upper = hz[:-2, None], hz[1:-1, None], hz[2:, None]  # (n_mels, 1)
    up = (freqs[None] - lower) / (center - lower)
    down = (upper - freqs[None]) / (upper - center)
    fb = torch.clamp(torch.minimum(up, down), min=0.0)  # (n_mels, n_freqs)
    fb = fb * (2.0 / (upper - lower))  # equal area per filter
    return fb.float()


class AudioEncoder(nn.Module):
    """Log-mel front end, streaming normalisation and a small conv + MLP encoder."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        f_max = cfg.f_max if cfg.f_max is not None else cfg.sample_rate / 2
        # Fixed DSP tables are non-persistent buffers: rebuilt from config, never checkpointed.
        self.register_buffer("window", torch.hann_window(cfg.n_fft), persistent=False)
        self.register_buffer(
            "mel_fb",
            mel_filterbank(cfg.n_fft // 2 + 1, cfg.n_mels, cfg.sample_rate, cfg.f_min, f_max),
            persistent=False,
        )
        h = cfg.hidden
        self.conv1 = nn.Conv1d(cfg.n_mels, h, 3, padding=1)
        self.conv2 = nn.Conv1d(h, h, 3, padding=1, stride=2)
        n2 = (cfg.n_steps - 1) // 2 + 1
        # Flatten keeps where in the window a sound happened (onset vs lookahead matters for lips).
        self.mlp = nn.Sequential(
            nn.Linear(h * n2, 2 * cfg.dim), nn.GELU(), nn.Linear(2 * cfg.dim, cfg.dim)
        )
        self.out_norm = nn.LayerNorm(cfg.dim)

    def log_mel(self, windows: Tensor) -> Tensor:
        """(T, window_samples) float32 audio in [-1, 1] -> (T, n_mels, n_steps) natural-log mel."""
        cfg = self.cfg
        if windows.ndim != 2 or windows.shape[1] != cfg.window_samples:
            raise ValueError(
                f"windows must be (T, {cfg.window_samples}), got {tuple(windows.shape)}"
            )
        # DSP stays float32 whatever autocast says: log of bf16 power spectra is too coarse.
        with torch.autocast("cpu", enabled=False):
            spec = torch.stft(
                windows.float(),
                n_fft=cfg.n_fft,
                hop_length=cfg.hop,
                window=self.window,
                center=False,
                return_complex=True,
            )  # (T, n_freqs, n_steps)
            power = spec.real.square() + spec.imag.square()
            mel = torch.matmul(self.mel_fb, power)  # (T, n_mels, n_steps)
            return torch.log(mel.clamp_min(1e-5))

    def init_norm_state(self) -> Tensor:
        """Fresh normalisation state (2, n_mels): row 0 running mean, row 1 running variance.

        A negative variance marks "empty": the first frame seen seeds the statistics.
        """
        state = torch.zeros(2, self.cfg.n_mels)
        state[1] = -1.0
        return state

    def normalise(self, mel: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Streaming per-channel normalisation with an EMA over frames, processed in order.

        Each frame first updates the statistics with its own mean/variance over time steps, then is
        normalised with the updated statistics. The loop runs frame by frame on (n_mels,) vectors,
        so the same frames give bitwise the same result however they are split across calls.

        Args:
            mel: (T, n_mels, n_steps) log-mel.
            state: (2, n_mels) from :meth:`init_norm_state` or the previous call.
        Returns:
            ``(mel_normed (T, n_mels, n_steps) in [-clip, clip], new_state (2, n_mels))``.
        """
        cfg = self.cfg
        d = cfg.ema_decay
        with torch.autocast("cpu", enabled=False):
            mel = mel.float()
            mean, var = state[0].float().clone(), state[1].float().clone()  # (n_mels,) each
            frame_mean = mel.mean(dim=2)  # (T, n_mels)
            frame_var = mel.var(dim=2, unbiased=False)  # (T, n_mels)
            out = torch.empty_like(mel)
            for i in range(mel.shape[0]):
                if var[0] < 0:  # empty state: seed with this frame
                    mean, var = frame_mean[i].clone(), frame_var[i].clone()
                else:
                    delta = frame_mean[i] - mean
                    mean = mean + (1.0 - d) * delta
                    # Within-frame variance plus spread of frame means around the running mean.
                    var = d * var + (1.0 - d) * (frame_var[i] + d * delta.square())
                std = torch.sqrt(var.clamp_min(cfg.var_floor))
                out[i] = ((mel[i] - mean[:, None]) / std[:, None]).clamp(-cfg.clip, cfg.clip)
            return out, torch.stack([mean, var])

    def forward(self, mel_normed: Tensor) -> Tensor:
        """(T, n_mels, n_steps) normalised log-mel -> (T, dim) features, one per video frame."""
        x = F.gelu(self.conv1(mel_normed))  # (T, hidden, n_steps)
        x = F.gelu(self.conv2(x))  # (T, hidden, ceil(n_steps / 2))
        x = self.mlp(x.flatten(1))  # (T, dim)
        return self.out_norm(x)


__all__ = ["AudioEncoderConfig", "AudioEncoder", "mel_filterbank"]


def audio_windows(
    audio: np.ndarray, frames: int, fps: int, sample_rate: int, window: int, lookahead: int
) -> Tensor:
    """(T, window) raw windows, frame j's ending ``lookahead`` samples after its interval.

    Exactly what ``Session._windows`` feeds the audio encoder: zeros outside the audio.
    """
    ends = np.array(
        [frame_start_sample(j + 1, fps, sample_rate) + lookahead for j in range(frames)]
    )
    pad_left = window
    padded = np.concatenate(
        [np.zeros(pad_left, np.float32), audio, np.zeros(lookahead + window, np.float32)]
    )
    idx = (ends - window + pad_left)[:, None] + np.arange(window)[None]
    return torch.from_numpy(padded[idx])  # (T, window)
