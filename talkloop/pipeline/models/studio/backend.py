"""The studio family on an inference backend: which networks run as exported graphs, and how.

The decoder (half the frame time in float32 torch) runs in int8, its activation ranges calibrated
on the decoder inputs of studio clips (``calibration_inputs``); the A2V, SR and mouth nets run as
float32 graphs (the A2V's are the families' shared ones, ``models/shared/a2v_graph.py``). The
audio, text and expression nets stay in torch: they run once per chunk or once per session and
cost little.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from talkloop.pipeline.backends.cache import weights_hash
from talkloop.pipeline.backends.export import RECIPE
from talkloop.pipeline.backends.graph import GraphForward, Shapes
from talkloop.pipeline.backends.quantize import quantize_int8
from talkloop.pipeline.backends.runtime import Runner, graph_threads
from talkloop.pipeline.backends.select import resolve_backend, schedule_key
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.models.shared.a2v import A2VDiT
from talkloop.pipeline.models.shared.a2v_graph import A2VGraph
from talkloop.pipeline.models.studio.stages import micro_batch
from talkloop.pipeline.models.studio.vae import Decoder, StudioVAE
from talkloop.pipeline.synth.dataset import make_clip
from talkloop.pipeline.synth.renderer import Renderer

# Part of the int8 decoder's cache key: bump when the calibration set, the recipe or
# DecoderGraph changes.
DECODER_INT8 = "int8-studio-v2"
CALIBRATION_CLIPS = (0, 1, 2)  # train clips
CALIBRATION_FRAMES = 24  # consecutive frames per clip, from frame 25 (speech under way)


class _ClassForward(nn.Module):
    """The network's own class ``forward``: what is exported, even once the instance's
    ``forward`` has been replaced by the graph."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, *inputs: Tensor) -> Tensor:
        return type(self.net).forward(self.net, *inputs)


def _weights_dtype(net: nn.Module) -> torch.dtype:
    """The dtype ``net``'s convolutions and linear layers store their weights in
    (:meth:`talkloop.pipeline.core.module.Module.cast_matmuls`)."""
    for layer in net.modules():
        if isinstance(layer, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            return layer.weight.dtype
    return torch.float32


@functools.cache
def _calibration_latents(vae: StudioVAE, width: int, height: int) -> tuple[Tensor, ...]:
    """Per calibration clip, (CALIBRATION_FRAMES, C, h, w) VAE latents of its frames rendered
    at ``width`` x ``height``."""

    out = []
    for index in CALIBRATION_CLIPS:
        clip = make_clip("train", index, render=False, augment=False)
        start = min(25, max(0, clip.num_frames - CALIBRATION_FRAMES))
        params = clip.params.slice(start, start + CALIBRATION_FRAMES)
        frames = Renderer(clip.character, (width, height)).render(params).frames  # (T, H, W, 3)
        images = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        # The encoder stays in the torch dtype (only the decoder is exported): where its
        # weights are bf16, it computes under autocast as in a session.
        bf16 = _weights_dtype(vae.encoder) == torch.bfloat16
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out.append(vae.encode(images))  # (T, C, h, w) float32
    return tuple(out)


def calibration_inputs(vae: StudioVAE, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Decoder inputs of the calibration clips, decoded as a stream, in micro-batches of the
    decoder graph's input ``shape`` (B, C*(K+1), h, w)."""
    batch, h, w = shape[0], shape[2], shape[3]
    f = vae.cfg.spatial_factor
    batches = []
    with torch.inference_mode():
        for z in _calibration_latents(vae, w * f, h * f):
            x, _ = vae.decoder_inputs(z)  # (T, C*(K+1), h, w)
            for s in range(0, x.shape[0] - batch + 1, batch):
                batches.append(np.ascontiguousarray(x[s : s + batch].numpy()))
    return batches


def attach_backend(nets: dict[str, nn.Module], backend: str) -> None:
    """Run the hot networks of ``nets`` (built and loaded, float32) on ``backend``."""
    vae: StudioVAE = nets["vae"]  # type: ignore[assignment]
    vae.decoder.forward = DecoderForward(vae, backend)  # type: ignore[method-assign]
    nets["a2v"].forward = A2VGraph(nets["a2v"], backend, "studio")  # type: ignore[method-assign]
    nets["sr"].forward = _sr_forward(nets["sr"], backend)  # type: ignore[method-assign]
    nets["mouth"].forward = _mouth_forward(nets["mouth"], backend)  # type: ignore[method-assign]


def warm_up(nets: dict[str, nn.Module], config: TalkloopConfig) -> None:
    """Export, quantise and compile every graph ``config``'s sessions run, now rather than in
    a session's first chunks (a first use costs seconds; the files are cached on disk)."""

    vae: StudioVAE = nets["vae"]  # type: ignore[assignment]
    a2v: A2VDiT = nets["a2v"]  # type: ignore[assignment]
    c, k = vae.cfg.latent_channels, vae.cfg.cache_frames
    h, w = config.video.height // 8, config.video.width // 8  # high-res latent grid
    s = config.schedule
    f = s.ctx_len + s.n_len
    batch = micro_batch(s.n_len, vae.cfg.decode_batch)
    vae.decoder.forward.runner([torch.zeros(batch, c * (k + 1), h, w)])
    sm = config.sampler
    steps = (sm.steps, sm.i_steps) if s.i_len else (sm.steps,)
    a2v.forward.warm_up(f, (c, h // 2, w // 2), steps, sm.shift, sm.audio_guidance)
    audio = torch.zeros(1, f, a2v.cfg.audio_dim)
    z_lr = torch.zeros(s.n_len, c, h // 2, w // 2)
    nets["sr"].forward.runner([z_lr, torch.zeros(1, c, h, w)])
    nets["mouth"].forward.runner([torch.zeros(s.n_len, c, h, w), audio[0, : s.n_len]])


def _probes(nets: dict[str, nn.Module], config: TalkloopConfig, dtype: str):
    """``make_probes`` for :func:`talkloop.pipeline.backends.select.resolve_backend`: the networks' work
    for one N chunk of ``config``'s schedule (the graphs :func:`warm_up` compiles) on fixed
    inputs: the sampler's A2V steps, SR and the mouth net over the chunk's frames, and the
    decoder over them in its micro-batches."""

    autocast_bf16 = dtype == "bfloat16"
    g = torch.Generator().manual_seed(0)
    vae: StudioVAE = nets["vae"]  # type: ignore[assignment]
    c, k = vae.cfg.latent_channels, vae.cfg.cache_frames
    h, w = config.video.height // 8, config.video.width // 8  # high-res latent grid
    s = config.schedule
    n = s.n_len
    x_dec = torch.randn(micro_batch(n, vae.cfg.decode_batch), c * (k + 1), h, w, generator=g)
    decoder_calls = n // x_dec.shape[0]
    f = s.ctx_len + n
    audio_dim = nets["a2v"].cfg.audio_dim
    a2v_in = (
        torch.randn(1, f, c, h // 2, w // 2, generator=g),
        torch.rand(1, f, generator=g),
        torch.arange(f, dtype=torch.float32)[None] - s.ctx_len,
        torch.randn(1, c, h // 2, w // 2, generator=g),
        torch.randn(1, f, audio_dim, generator=g),
        torch.randn(1, nets["a2v"].cfg.text_dim, generator=g),
    )
    sr_in = (torch.randn(n, c, h // 2, w // 2, generator=g), torch.randn(1, c, h, w, generator=g))
    mouth_in = (torch.randn(n, c, h, w, generator=g), torch.randn(n, audio_dim, generator=g))
    steps = config.sampler.steps

    def make(candidates: tuple[str, ...]) -> dict:
        probes = {}
        for name in candidates:
            if name == "torch":
                fwd = {n_: nets[n_] for n_ in ("a2v", "sr", "mouth")}
                dec = vae.decoder
                ctx = (
                    (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
                    if autocast_bf16
                    else contextlib.nullcontext
                )
                x = x_dec.contiguous(memory_format=torch.channels_last)
            else:
                # Graphs are exported from float32 (the nets may compute in bf16 here).
                f32 = {n_: copy.deepcopy(nets[n_]).float() for n_ in ("vae", "a2v", "sr", "mouth")}
                dec = DecoderForward(f32["vae"], name)  # type: ignore[arg-type]
                fwd = {
                    "a2v": A2VGraph(f32["a2v"], name, "studio"),  # type: ignore[arg-type]
                    "sr": _sr_forward(f32["sr"], name),
                    "mouth": _mouth_forward(f32["mouth"], name),
                }
                ctx, x = contextlib.nullcontext, x_dec

            def run(dec=dec, fwd=fwd, ctx=ctx, x=x) -> None:
                with torch.inference_mode(), ctx():
                    for _ in range(steps):
                        fwd["a2v"](*a2v_in)
                    fwd["sr"](*sr_in)
                    fwd["mouth"](*mouth_in)
                    for _ in range(decoder_calls):
                        dec(x)

            probes[name] = run
        return probes

    return make


def _sr_forward(sr: nn.Module, backend: str) -> GraphForward:
    return GraphForward(
        backend, "studio-sr", _ClassForward(sr), ("z_lr", "ref_hr"), dynamic={"z_lr": (0,)}
    )


def _mouth_forward(mouth: nn.Module, backend: str) -> GraphForward:
    return GraphForward(
        backend,
        "studio-mouth",
        _ClassForward(mouth),
        ("z", "audio"),
        dynamic={"z": (0,), "audio": (0,)},
    )


class DecoderGraph(nn.Module):
    """The decoder as it is exported: the same function, laid out for a CPU graph runtime.

    ONNX Runtime's DepthToSpace (what ``pixel_shuffle`` exports to) is slow: the two of them took
    a large share of an int8 decoder call (docs/benchmarks.md, "Figures behind code choices"). So:

    - the 1x1 conv + pixel shuffle x2 is the stride-2 2x2 transposed conv it equals, plus the
      1x1 conv's bias per channel and position in the 2x2 cell;
    - the output conv's channels are reordered from (colour, row, column) of the 4x4 cell to
      (row, column, colour), and the graph returns them channels-last, tanh applied:
      ``(T, 2h, 2w, 48)``. Frames are then one copy away (:func:`cells_to_frames`).

    Built from the decoder's weights (float32); the decoder itself is left as it is.
    """

    def __init__(self, decoder: Decoder) -> None:
        super().__init__()
        self.stem, self.blocks1, self.blocks2 = decoder.stem, decoder.blocks1, decoder.blocks2
        c1, c2 = decoder.up.in_channels, decoder.up.out_channels // 4
        up_w = decoder.up.weight.detach().float()[:, :, 0, 0]  # (4 c2, c1), row c2*4 + i*2 + j
        self.up = nn.ConvTranspose2d(c1, c2, 2, stride=2, bias=False)
        self.up.weight.data = up_w.view(c2, 2, 2, c1).permute(3, 0, 1, 2).contiguous()
        self.register_buffer("up_bias", decoder.up.bias.detach().float().view(1, c2, 2, 2).clone())
        out = decoder.out
        order = [c * 16 + i * 4 + j for i in range(4) for j in range(4) for c in range(3)]
        self.out = nn.Conv2d(out.in_channels, out.out_channels, 3, padding=1)
        self.out.weight.data = out.weight.detach().float()[order].clone()
        self.out.bias.data = out.bias.detach().float()[order].clone()

    def forward(self, x: Tensor) -> Tensor:
        """(T, C*(K+1), h, w) -> (T, 2h, 2w, 48) in [-1, 1], channel (i * 4 + j) * 3 + colour
        at pixel (4 row + i, 4 col + j) of the frame."""
        x = self.blocks1(F.relu(self.stem(x)))
        y = self.up(x)  # (T, c2, 2h, 2w)
        y = y + self.up_bias.repeat(1, 1, x.shape[2], x.shape[3])
        y = self.out(self.blocks2(F.relu(y)))
        return torch.tanh(y.permute(0, 2, 3, 1))


def cells_to_frames(cells: Tensor) -> Tensor:
    """:class:`DecoderGraph`'s ``(T, 2h, 2w, 48)`` -> frames ``(T, 3, 8h, 8w)``, the decoder's
    output: a channels-last view of one contiguous ``(T, 8h, 8w, 3)`` copy (so
    :func:`talkloop.pipeline.models.studio.stages.to_uint8` reads it in order)."""
    t, h, w, _ = cells.shape
    hwc = torch.empty((t, h, 4, w, 12), dtype=torch.float32)
    hwc.copy_(cells.view(t, h, w, 4, 12).permute(0, 1, 3, 2, 4))
    return hwc.view(t, 4 * h, 4 * w, 3).permute(0, 3, 1, 2)


class DecoderForward:
    """The decoder's forward on a backend: :class:`DecoderGraph` in int8, calibrated on the
    decoder inputs of studio clips, then :func:`cells_to_frames`."""

    def __init__(self, vae: StudioVAE, backend: str) -> None:
        def quantize(fp32: Path, out: Path, shapes: Shapes) -> None:
            quantize_int8(fp32, out, "x", calibration_inputs(vae, shapes[0]))

        self.backend, self.variant = backend, DECODER_INT8
        self.graph = GraphForward(
            backend, "studio-decoder", DecoderGraph(vae.decoder), ("x",), quantize, DECODER_INT8
        )

    def runner(self, inputs: Sequence[Tensor]) -> Runner:
        """The compiled graph for ``inputs``' signature (what :func:`warm_up` compiles)."""
        return self.graph.runner(inputs)

    def __call__(self, x: Tensor) -> Tensor:
        return cells_to_frames(self.graph(x))


def exported_nets(nets: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The networks an exported backend runs as graphs, by name."""
    return {
        "a2v": nets["a2v"],
        "sr": nets["sr"],
        "mouth": nets["mouth"],
        "decoder": nets["vae"].decoder,
    }


def use_backend(
    nets: dict[str, nn.Module],
    config: TalkloopConfig,
    dtype: str,
    float32_weights: dict[str, dict[str, Tensor]] | None = None,
) -> str:
    """Resolve ``model.backend`` (``auto`` is timed once per machine, then cached), attach it
    and compile the graphs ``config``'s sessions run.

    Args:
        nets: the family's networks, loaded, in their compute dtype.
        config: the root config (model.backend, model.device, the schedule and frame size).
        dtype: that compute dtype (``model.dtype`` resolved): what torch's probe runs in.
        float32_weights: the :func:`exported_nets`' float32 state dicts from before a bf16
            cast, which the graphs are then exported from (None: the nets' own, cast up).
    Returns:
        The backend the hot networks now run on.
    """

    weights = ",".join(weights_hash(nets[n]) for n in ("vae", "a2v", "sr", "mouth"))
    # The exported graphs' recipes are part of it: a new one may rank the backends differently.
    identity = f"studio:{weights}:{schedule_key(config)}:{RECIPE}:{DECODER_INT8}"
    m = config.model
    probes = _probes(nets, config, dtype)
    backend = resolve_backend(m.backend, m.device, identity, probes)
    if backend != "torch":
        # The graphs are float32 (decoder int8) whatever the torch dtype: export from float32.
        for name, net in exported_nets(nets).items():
            net.float()
            if float32_weights is not None:
                net.load_state_dict(float32_weights[name])
        graph_threads()  # the graphs keep the threads torch has now
        attach_backend(nets, backend)
        warm_up(nets, config)
        # What stays in torch is glue (the audio encoder, sampler arithmetic, frame conversion):
        # one thread. With torch's OpenMP pool on the same cores as the graphs' pool, each
        # waited on threads the other held (its workers spin after every parallel op) and live
        # chunks took longer (docs/benchmarks.md, "Figures behind code choices").
        torch.set_num_threads(1)
    return backend
