"""Training of the studio family and its evaluation on held-out studio clips.

``talkloop train`` runs the phases VAE -> audio encoder + A2V -> SR -> readout and writes fp16
weights in the layout ``load_modules`` reads; ``talkloop eval`` scores weights on the test split.
"""

from __future__ import annotations

from talkloop.pipeline.train.config import TrainConfig
from talkloop.pipeline.train.trainer import Trainer, train

__all__ = ["TrainConfig", "Trainer", "train"]
