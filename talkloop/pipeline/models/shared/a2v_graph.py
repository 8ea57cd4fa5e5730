"""The A2V DiT's forward as exported graphs (ONNX Runtime or OpenVINO), for every family.

:class:`A2VGraph` replaces an :class:`~talkloop.pipeline.models.shared.a2v.A2VDiT` instance's
``forward`` (``net.forward = A2VGraph(net, backend, tag)``): the sampler calls the network as
before and the class's own ``forward`` stays what is exported and what training runs.

Two graphs of the forward, one with a prompt embedding and one without; both take the per-sample
audio keep flags (0 or 1, what classifier-free guidance on the audio doubles its batch with).
And the sampler: :func:`~talkloop.pipeline.models.shared.sampling.euler_sample` on such a network
runs its whole loop (every step, the guided pass, the given frames' resets) as one graph per
(steps, shift, guidance, prompt or none), so a chunk is one call into the runtime and none of
the loop's small torch operations (each holding the GIL, next to a call's event loop). In every
graph the batch and frame dims are free: one graph serves the first, N and I chunks and any batch
of sessions the live engine runs together. Training's per-sample text dropout and a chunk
without audio run in torch.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from talkloop.pipeline.backends.graph import GraphForward
from talkloop.pipeline.models.shared.a2v import A2VDiT
from talkloop.pipeline.models.shared.sampling import euler_steps

NAMES = ("x", "t", "pos", "ref", "audio", "keep")
# Batch and frames are free in every input that has them.
DYNAMIC = {"x": (0, 1), "t": (0, 1), "pos": (0, 1), "ref": (0,), "audio": (0, 1), "keep": (0,)}


class _WithText(nn.Module):
    def __init__(self, net: A2VDiT) -> None:
        super().__init__()
        self.net = net

    def forward(
        self,
        x: Tensor,
        t: Tensor,
        pos: Tensor,
        ref: Tensor,
        audio: Tensor,
        keep: Tensor,
        text: Tensor,
    ) -> Tensor:
        return A2VDiT.forward(self.net, x, t, pos, ref, audio, text, audio_keep=keep > 0.5)


class _NoText(_WithText):
    def forward(  # type: ignore[override]
        self, x: Tensor, t: Tensor, pos: Tensor, ref: Tensor, audio: Tensor, keep: Tensor
    ) -> Tensor:
        return A2VDiT.forward(self.net, x, t, pos, ref, audio, None, audio_keep=keep > 0.5)


SAMPLER_NAMES = ("x_given", "given", "pos", "ref", "audio", "noise")
SAMPLER_DYNAMIC = {
    "x_given": (0, 1),
    "given": (0, 1),
    "pos": (0, 1),
    "ref": (0,),
    "audio": (0, 1),
    "noise": (0, 1),
}


class _Sampler(nn.Module):
    """``euler_steps`` at fixed steps, shift and guidance, on the class forward of ``net``."""

    def __init__(self, net: A2VDiT, steps: int, shift: float, guidance: float) -> None:
        super().__init__()
        self.net, self.steps, self.shift, self.guidance = net, steps, shift, guidance

    def _forward(self, *args: Tensor | None, **kw: Tensor | None) -> Tensor:
        return A2VDiT.forward(self.net, *args, **kw)

    def forward(
        self,
        x_given: Tensor,
        given: Tensor,
        pos: Tensor,
        ref: Tensor,
        audio: Tensor,
        noise: Tensor,
        text: Tensor | None = None,
    ) -> Tensor:
        return euler_steps(
            self._forward,
            x_given,
            given > 0.5,
            pos,
            ref,
            audio,
            text,
            noise,
            self.steps,
            self.shift,
            self.guidance,
        )


class _SamplerNoText(_Sampler):
    def forward(  # type: ignore[override]
        self,
        x_given: Tensor,
        given: Tensor,
        pos: Tensor,
        ref: Tensor,
        audio: Tensor,
        noise: Tensor,
    ) -> Tensor:
        return super().forward(x_given, given, pos, ref, audio, noise, None)


class A2VGraph:
    """``net``'s forward on ``backend``; ``tag`` names its graph files (the family's name).

    Args:
        net: the float32 network (its weights are what the graphs are exported from).
        backend: ``onnxruntime`` or ``openvino``.
        tag: the prefix of the graphs' cache files.
    """

    def __init__(self, net: A2VDiT, backend: str, tag: str) -> None:
        self.net = net
        self.backend = backend
        self.text = GraphForward(
            backend,
            f"{tag}-a2v",
            _WithText(net),
            (*NAMES, "text"),
            dynamic={**DYNAMIC, "text": (0,)},
        )
        self.no_text = GraphForward(
            backend, f"{tag}-a2v-notext", _NoText(net), NAMES, dynamic=DYNAMIC
        )
        self.tag = tag
        self.samplers: dict[tuple, GraphForward] = {}
        self._lock = threading.Lock()

    def __call__(
        self,
        x: Tensor,
        t: Tensor,
        pos: Tensor,
        ref: Tensor,
        audio: Tensor | None,
        text: Tensor | None,
        *,
        audio_keep: Tensor | None = None,
        text_keep: Tensor | None = None,
    ) -> Tensor:
        if audio is None or text_keep is not None:
            return A2VDiT.forward(
                self.net, x, t, pos, ref, audio, text, audio_keep=audio_keep, text_keep=text_keep
            )
        self.net._check(x, t, pos, ref)  # the graphs have no shape checks of their own
        b = x.shape[0]
        keep = torch.ones(b) if audio_keep is None else audio_keep.float()
        if text is None:
            return self.no_text(x, t, pos, ref, audio, keep)
        return self.text(x, t, pos, ref, audio, keep, text)

    def sample(
        self,
        x_given: Tensor,
        given_mask: Tensor,
        pos: Tensor,
        ref: Tensor,
        audio: Tensor | None,
        text: Tensor | None,
        noise: Tensor,
        steps: int,
        shift: float,
        audio_guidance: float,
    ) -> Tensor:
        """:func:`~talkloop.pipeline.models.shared.sampling.euler_sample`'s result, its loop
        run as one graph (inputs checked there). Without audio the loop runs in torch."""
        if audio is None:
            return euler_steps(
                self,
                x_given,
                given_mask,
                pos,
                ref,
                audio,
                text,
                noise,
                steps,
                shift,
                audio_guidance,
            )
        self.net._check(x_given, pos, pos, ref)  # (pos stands in for t: both are (B, F))
        graph = self.sampler(steps, shift, audio_guidance, text is not None)
        inputs = [x_given, given_mask.float(), pos, ref, audio, noise]
        return graph(*inputs, *([] if text is None else [text]))

    def sampler(self, steps: int, shift: float, guidance: float, text: bool) -> GraphForward:
        """The sampler graph of these settings (made on first use; its files are cached)."""
        key = (steps, float(shift), float(guidance), text)
        with self._lock:
            if key not in self.samplers:
                # The settings are constants of the graph: they name its files.
                tag = f"{self.tag}-sampler-s{steps}-sh{shift:g}-g{guidance:g}"
                if text:
                    module, names = _Sampler(self.net, steps, shift, guidance), SAMPLER_NAMES
                    names, dynamic = (*names, "text"), {**SAMPLER_DYNAMIC, "text": (0,)}
                else:
                    module = _SamplerNoText(self.net, steps, shift, guidance)
                    names, dynamic, tag = SAMPLER_NAMES, SAMPLER_DYNAMIC, f"{tag}-notext"
                self.samplers[key] = GraphForward(self.backend, tag, module, names, dynamic=dynamic)
            return self.samplers[key]

    def warm_up(
        self,
        frames: int,
        latent: tuple[int, int, int],
        steps: Sequence[int],
        shift: float,
        guidance: float,
    ) -> None:
        """Export (or load from the disk cache) and compile the sampler graphs of these settings
        (each of ``steps``), what sessions run, now rather than in a session's first chunk;
        ``latent`` is one frame's (C, h, w). The forward graphs (a direct call of the net, as
        a backend probe makes) are made when first called."""
        cfg = self.net.cfg
        x, tf = torch.zeros(1, frames, *latent), torch.zeros(1, frames)
        ref, audio = torch.zeros(1, *latent), torch.zeros(1, frames, cfg.audio_dim)
        text = torch.zeros(1, cfg.text_dim)
        for n, with_text in itertools.product(sorted(set(steps)), (True, False)):
            graph = self.sampler(n, shift, guidance, with_text)
            graph.runner([x, tf, tf, ref, audio, x, *([text] if with_text else [])])


def attach_a2v_graph(net: A2VDiT, backend: str, tag: str) -> A2VGraph:
    """Run ``net`` (float32) on ``backend`` from now on; returns the graph forward."""
    graph = A2VGraph(net.float(), backend, tag)
    net.forward = graph  # type: ignore[method-assign]
    return graph
