"""Static int8 quantisation of an exported conv network (ONNX Runtime's quantiser, QDQ format).

Weights per output channel (int8), activations per tensor (uint8) with ranges taken from
calibration inputs the caller supplies. The QDQ graph runs on both backends: ONNX Runtime fuses
it into its int8 kernels, OpenVINO into int8 convolutions.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def quantize_int8(
    fp32: Path,
    out: Path,
    name: str,
    calibration: Iterable[np.ndarray],
    keep_float: tuple[str, ...] = (),
) -> None:
    """Write the int8 version of ``fp32`` (one input, ``name``) to ``out``.

    Args:
        fp32: the float32 ONNX graph.
        out: where the quantised graph goes.
        name: the graph's input name.
        calibration: inputs of the exported shape, each ``(B, ...)`` float32.
        keep_float: names of ONNX nodes left in float32.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.batches, None)
            return None if x is None else {name: np.ascontiguousarray(x, np.float32)}

    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(fp32), str(pre))  # shape inference + graph cleanup first
        quantize_static(
            str(pre),
            str(out),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=list(keep_float),
        )
