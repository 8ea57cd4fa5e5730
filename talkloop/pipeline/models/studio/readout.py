"""Readout: a tiny CNN that reads mouth opening and smile from a mouth crop of a frame.

The evaluation needs these two numbers from *generated* frames, where the studio's ground truth
does not exist. The readout is trained on studio frames (real renders and their VAE
reconstructions, so blur from the decoder does not fool it) and ships next to the weights as
``readout.safetensors`` + ``readout.json``.

The crop is a square around the mouth of the reference (neutral) pose, wide enough that head
motion keeps the mouth inside; the network learns to find the mouth within it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from talkloop.pipeline.core.module import Module

OUTPUTS = ("mouth_open", "smile")


class ReadoutConfig(BaseModel):
    """Crop resolution and widths of the readout CNN."""

    model_config = ConfigDict(extra="forbid")

    crop: int = Field(32, ge=8, le=256, description="side of the resampled mouth crop")
    width: int = Field(24, ge=4, le=512)


class Readout(nn.Module):
    """(B, 3, crop, crop) in [-1, 1] -> (B, 2): mouth_open (about [0, 1]) and smile ([-1, 1])."""

    def __init__(self, cfg: ReadoutConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.body = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(w, w, 3, stride=2, padding=1),  # crop/2
            nn.ReLU(),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1),  # crop/4
            nn.ReLU(),
            nn.Conv2d(2 * w, 2 * w, 3, stride=2, padding=1),  # crop/8
            nn.ReLU(),
        )
        self.head = nn.Linear(2 * w, len(OUTPUTS))

    def forward(self, crops: Tensor) -> Tensor:
        x = self.body(crops)  # (B, 2w, crop/8, crop/8)
        return self.head(x.mean(dim=(2, 3)))  # (B, 2)


def crop_mouths(images: Tensor, boxes: Tensor, size: int) -> Tensor:
    """Resample square crops.

    Args:
        images: (B, 3, H, W) float.
        boxes: (B, 3) crop centre x, y and side, in pixels.
        size: output side.
    Returns:
        (B, 3, size, size), bilinear, zeros outside the image.
    """
    b, _, h, w = images.shape
    cx, cy, side = boxes[:, 0], boxes[:, 1], boxes[:, 2]
    theta = torch.zeros(b, 2, 3, dtype=images.dtype)
    # affine_grid works in [-1, 1] coordinates (align_corners=False: pixel edges).
    theta[:, 0, 0] = side / w
    theta[:, 1, 1] = side / h
    theta[:, 0, 2] = 2 * cx / w - 1
    theta[:, 1, 2] = 2 * cy / h - 1
    grid = F.affine_grid(theta, [b, 3, size, size], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", align_corners=False)


def readout_loss(net: Readout, crops: Tensor, targets: Tensor) -> Tensor:
    """MSE on (mouth_open, smile); the mouth term counts double (lip sync is read from it)."""
    pred = net(crops).float()
    err = (pred - targets).square().mean(dim=0)  # (2,)
    return 2.0 * err[0] + err[1]


def save_readout(net: Readout, folder: Path) -> None:
    """Write ``readout.safetensors`` and ``readout.json`` (fp16) into ``folder``."""
    Module("readout", net.cfg, net).save(folder, dtype=torch.float16)


def load_readout(folder: Path | None) -> tuple[Readout, bool]:
    """The readout saved in ``folder``, or a seeded random one; returns ``(net, trained)``."""
    cfg = ReadoutConfig()
    if folder is not None and (folder / "readout.safetensors").is_file():
        cfg = ReadoutConfig.model_validate(json.loads((folder / "readout.json").read_text()))
        with torch.random.fork_rng():
            torch.manual_seed(0)
            net = Readout(cfg)
        module = Module("readout", cfg, net)
        module.load(folder)
        return net.float().eval(), True
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = Readout(cfg)
    return net.eval(), False


@torch.no_grad()
def read_frames(net: Readout, frames: np.ndarray, crop: np.ndarray, batch: int = 256) -> np.ndarray:
    """(T, H, W, 3) uint8 frames -> (T, 2) readout [mouth_open, smile]."""
    out = []
    box = torch.from_numpy(np.asarray(crop, np.float32))[None]
    for s in range(0, len(frames), batch):
        x = torch.from_numpy(frames[s : s + batch]).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        crops = crop_mouths(x, box.expand(x.shape[0], -1), net.cfg.crop)
        out.append(net(crops).float())
    return torch.cat(out).numpy() if out else np.zeros((0, 2), np.float32)
