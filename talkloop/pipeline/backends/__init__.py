"""Inference backends: the hot networks exported once (ONNX) and run by ONNX Runtime or OpenVINO.

``torch`` runs the networks as they are. ``onnxruntime`` and ``openvino`` run graphs exported from
the same weights (``export.py``), cached on disk keyed by the weights' hash and the input shapes
(``cache.py``); the decoder's convolutions run in int8, statically quantised with activation
ranges calibrated on synthetic clips (``quantize.py``). ``auto`` times the available ones on this
machine once and caches the choice (``select.py``). docs/architecture.md, "Inference backends".
"""

from __future__ import annotations

from talkloop.pipeline.backends.runtime import BACKENDS, available_backends, check_available

__all__ = ["BACKENDS", "available_backends", "check_available"]
