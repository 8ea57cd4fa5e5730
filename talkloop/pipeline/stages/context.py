"""ContextGen: audio features, the given (context / anchor) frames and seeded noise for a chunk."""

from __future__ import annotations

import torch

from talkloop.pipeline.core.schedule import IChunk, NChunk
from talkloop.pipeline.core.stage import Stage, StageContext


def chunk_generator(seed: int, job: NChunk | IChunk) -> torch.Generator:
    """A generator whose stream depends only on (seed, chunk kind, chunk index).

    Noise is therefore identical however the audio arrived (streaming or batch).
    """
    salt = 2 * job.index + (1 if job.kind == "I" else 0)
    mixed = (seed * 0x9E3779B97F4A7C15 + salt * 0xBF58476D1CE4E5B9 + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def _noise(seed: int, job: NChunk | IChunk, frames: int, like: torch.Tensor) -> torch.Tensor:
    shape = (1, frames, *like.shape[1:])  # (1, F, C, h, w)
    return torch.randn(shape, generator=chunk_generator(seed, job), dtype=torch.float32)


class AudioFeatureStage(Stage):
    """Per-frame audio windows -> streaming-normalised log-mel -> one feature vector per frame."""

    name = "audio_features"
    reads = ("audio_windows", "audio_norm")
    writes = ("chunk_audio", "audio_norm")
    needs = ("audio_encoder",)

    def run(self, ctx: StageContext) -> None:
        enc = ctx.module("audio_encoder").net
        windows = torch.from_numpy(ctx.read("audio_windows"))  # (T, W)
        norm = ctx.read("audio_norm")
        if norm is None:
            norm = enc.init_norm_state()
        mel = enc.log_mel(windows)  # (T, n_mels, steps)
        mel, norm = enc.normalise(mel, norm)
        ctx.write("audio_norm", norm)
        ctx.write("chunk_audio", enc(mel).float())  # (T, D_audio)


class NContextStage(Stage):
    """N chunk inputs: the motion context of the previous N chunk (given), then new frames."""

    name = "n_context"
    reads = ("job", "seed", "chunk_audio", "context_latents", "context_audio", "a2v_reference")
    writes = ("given", "given_mask", "positions", "cond_audio", "noise")

    def run(self, ctx: StageContext) -> None:
        job: NChunk = ctx.read("job")
        audio = ctx.read("chunk_audio")  # (n, D_audio)
        ref = ctx.read("a2v_reference")  # (1, C, h, w)
        ctx_lat, ctx_aud = ctx.read("context_latents"), ctx.read("context_audio")
        n, c = job.length, 0 if ctx_lat is None else ctx_lat.shape[0]
        given = torch.zeros((1, c + n, *ref.shape[1:]))
        if c:
            given[0, :c] = ctx_lat
            audio = torch.cat([ctx_aud, audio])
        mask = torch.zeros((1, c + n), dtype=torch.bool)
        mask[0, :c] = True
        positions = torch.arange(-c, n, dtype=torch.float32).unsqueeze(0)  # context at -c..-1
        ctx.write("given", given)
        ctx.write("given_mask", mask)
        ctx.write("positions", positions)
        ctx.write("cond_audio", audio.unsqueeze(0))  # (1, c + n, D_audio)
        ctx.write("noise", _noise(ctx.read("seed"), job, c + n, ref))


class IContextStage(Stage):
    """I chunk inputs: [near anchor, interior to regenerate, far anchor] with their audio."""

    name = "i_context"
    reads = (
        "job",
        "seed",
        "next_latents",
        "next_audio",
        "context_latents",
        "context_audio",
        "a2v_reference",
    )
    writes = ("given", "given_mask", "positions", "cond_audio", "noise")

    def run(self, ctx: StageContext) -> None:
        job: IChunk = ctx.read("job")
        nxt, nxt_audio = ctx.read("next_latents"), ctx.read("next_audio")  # N(k+1): (n, ...)
        near, near_audio = ctx.read("context_latents")[-1:], ctx.read("context_audio")[-1:]
        m = job.length
        # The interior's current values (N(k+1)'s first frames) are placeholders: it is regenerated.
        given = torch.cat([near, nxt[: m + 1]]).unsqueeze(0)  # (1, m + 2, C, h, w)
        mask = torch.zeros((1, m + 2), dtype=torch.bool)
        mask[0, 0] = mask[0, -1] = True
        positions = torch.arange(-1, m + 1, dtype=torch.float32).unsqueeze(0)  # anchors at -1, m
        audio = torch.cat([near_audio, nxt_audio[: m + 1]]).unsqueeze(0)
        ctx.write("given", given)
        ctx.write("given_mask", mask)
        ctx.write("positions", positions)
        ctx.write("cond_audio", audio)
        ctx.write("noise", _noise(ctx.read("seed"), job, m + 2, nxt))
