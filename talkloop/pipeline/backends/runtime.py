"""ONNX Runtime and OpenVINO sessions behind one small interface: arrays in, arrays out."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from talkloop.pipeline.core.errors import ConfigError

BACKENDS = ("torch", "onnxruntime", "openvino")
_PACKAGES = {"onnxruntime": "onnxruntime", "openvino": "openvino"}


def available_backends() -> tuple[str, ...]:
    """The backends whose packages are importable here (``torch`` always is)."""
    return tuple(
        b for b in BACKENDS if b == "torch" or importlib.util.find_spec(_PACKAGES[b]) is not None
    )


def check_available(backend: str) -> None:
    """Raise ConfigError naming the missing package if ``backend`` cannot run here."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}: use one of auto, {', '.join(BACKENDS)}")
    if backend not in available_backends():
        raise ConfigError(
            f"backend {backend!r} is not available: the {_PACKAGES[backend]!r} package is not "
            f"installed (pip install {_PACKAGES[backend]}); available here: "
            f"{', '.join(available_backends())}, or use --backend auto"
        )


class Runner(Protocol):
    def __call__(self, inputs: Sequence[np.ndarray]) -> np.ndarray: ...


_graph_threads: int | None = None


def graph_threads() -> int:
    """Intra-op threads of every exported graph in this process: torch's thread count when the
    first graph was loaded (or what :func:`set_graph_threads` gave), fixed from then on, so a
    family that then narrows torch to one thread for its glue (a family's ``use_backend``) does
    not narrow its graphs, and no graph oversubscribes the cores torch was given."""
    global _graph_threads
    if _graph_threads is None:
        _graph_threads = max(1, torch.get_num_threads())
    return _graph_threads


def set_graph_threads(threads: int) -> None:
    """Fix the exported graphs' thread count (before their runners are made)."""
    global _graph_threads
    if threads < 1:
        raise ConfigError(f"graph threads must be >= 1, got {threads}")
    _graph_threads = threads


class OrtRunner:
    """One ONNX Runtime session over an ONNX file."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = graph_threads()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning worker threads would take the core the H.264 encoder runs on between calls.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def __call__(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        return self.session.run(None, dict(zip(self.names, inputs, strict=True)))[0]


class OvRunner:
    """One compiled OpenVINO model over an ONNX file (float32 inference precision)."""

    def __init__(self, path: Path) -> None:
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(
            core.read_model(str(path)),
            "CPU",
            {
                "INFERENCE_NUM_THREADS": graph_threads(),
                "PERFORMANCE_HINT": "LATENCY",
                # f32 activations everywhere but the int8-quantised convolutions: OpenVINO
                # would otherwise pick bf16 on CPUs that have it, below the numerics we test.
                "INFERENCE_PRECISION_HINT": "f32",
            },
        )
        self.request = compiled.create_infer_request()

    def __call__(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        return self.request.infer(list(inputs))[0].copy()  # the request reuses its buffer


def make_runner(backend: str, path: Path) -> Runner:
    """A runner of ``path`` on ``backend`` (``onnxruntime`` or ``openvino``)."""
    check_available(backend)
    if backend == "onnxruntime":
        return OrtRunner(path)
    if backend == "openvino":
        return OvRunner(path)
    raise ConfigError(f"backend {backend!r} runs torch modules, not exported graphs")
