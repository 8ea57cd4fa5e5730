"""GraphForward: a module's forward replaced by exported graphs, one per input-shape signature.

Attached as an instance attribute (``net.forward = GraphForward(...)``), so the model file is
untouched and every other method of the network (training, eval read-outs) still runs in torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from talkloop.pipeline.backends.cache import cache_dir, cached_file, key, weights_hash
from talkloop.pipeline.backends.export import OPSET, RECIPE, export_onnx
from talkloop.pipeline.backends.runtime import Runner, make_runner

Shapes = tuple[tuple[int, ...], ...]
# (fp32 graph, int8 graph to write, input shapes) -> None
Quantizer = Callable[[Path, Path, Shapes], None]


class GraphForward:
    """Run ``graph(*inputs)`` on ``backend``; each new input-shape signature exports (or loads
    from the disk cache) its own graph the first time it is seen.

    Args:
        backend: ``onnxruntime`` or ``openvino``.
        tag: the network's name in cache file names.
        graph: float32 torch module whose ``forward(*inputs)`` is what gets exported.
        names: its input names.
        quantizer: if given, makes the int8 graph the backend runs instead of the float32 one.
        variant: what the quantizer does (part of the cache key; change it when it changes).
        dynamic: per input name, the dims whose size may change from call to call (one graph
            serves them all); other dims are fixed per graph.
    """

    def __init__(
        self,
        backend: str,
        tag: str,
        graph: torch.nn.Module,
        names: Sequence[str],
        quantizer: Quantizer | None = None,
        variant: str = "fp32",
        dynamic: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.backend = backend
        self.tag = tag
        self.graph = graph.eval()
        self.names = tuple(names)
        self.quantizer = quantizer
        self.variant = variant
        self.dynamic = {k: tuple(v) for k, v in (dynamic or {}).items()}
        self.hash = weights_hash(graph)
        self.runners: dict[Shapes, Runner] = {}
        # One call at a time: an OpenVINO infer request is not re-entrant, and on a small CPU
        # two concurrent calls would only split the same cores.
        self.lock = threading.Lock()

    def signature(self, inputs: Sequence[torch.Tensor]) -> Shapes:
        """The inputs' shapes, -1 at the dynamic dims: calls with one signature share a graph."""
        return tuple(
            tuple(-1 if d in self.dynamic.get(name, ()) else n for d, n in enumerate(t.shape))
            for name, t in zip(self.names, inputs, strict=True)
        )

    def path(self, signature: Shapes, variant: str) -> Path:
        k = key(self.hash, signature, OPSET, RECIPE, torch.__version__, variant)
        return cache_dir() / f"{self.tag}-{variant}-{k}.onnx"

    def prepare(self, *inputs: torch.Tensor) -> Path:
        """Export (and quantise) the graph for these inputs' signature; returns the file run."""
        sig = self.signature(inputs)
        axes = {n: {d: f"{n}_{d}" for d in dims} for n, dims in self.dynamic.items()}
        fp32 = cached_file(
            self.path(sig, "fp32"),
            lambda tmp: export_onnx(self.graph, inputs, self.names, tmp, axes),
        )
        if self.quantizer is None:
            return fp32
        shapes = tuple(tuple(t.shape) for t in inputs)
        q = self.quantizer
        return cached_file(self.path(sig, self.variant), lambda tmp: q(fp32, tmp, shapes))

    def runner(self, inputs: Sequence[torch.Tensor]) -> Runner:
        """The compiled graph for ``inputs``' signature (exported, loaded and compiled once)."""
        sig = self.signature(inputs)
        with self.lock:
            if sig not in self.runners:
                self.runners[sig] = make_runner(self.backend, self.prepare(*inputs))
            return self.runners[sig]

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        runner = self.runner(inputs)
        arrays = [np.ascontiguousarray(t.detach().float().numpy()) for t in inputs]
        with self.lock:
            out = runner(arrays)
        return torch.from_numpy(out)
