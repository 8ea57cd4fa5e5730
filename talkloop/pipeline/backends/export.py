"""torch -> ONNX export of a network at fixed input shapes.

The TorchScript-based exporter at opset 17 (what ONNX Runtime and OpenVINO both read); the one
operator it lacks here, ``aten::rms_norm`` (the DiTs' QK norm), is written out as its formula,
and the tanh GELU of the DiTs' MLPs is one ``com.microsoft`` FastGelu node (both runtimes read it)
instead of the eight element-wise nodes of its formula, which ONNX Runtime did not fuse: faster
A2V and SR calls, the same outputs (docs/benchmarks.md, "Figures behind code choices").
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

OPSET = 17
# Part of every exported graph's cache key: bump when what export_onnx writes changes.
RECIPE = "fastgelu-1"


@functools.cache
def _register_rms_norm() -> None:
    from torch.onnx import register_custom_op_symbolic

    def rms_norm(g, x, shape, weight, eps):  # noqa: ANN001  (TorchScript graph values)
        eps_value = torch.onnx.symbolic_helper._maybe_get_const(eps, "f")
        eps_value = 1e-6 if eps_value is None else float(eps_value)
        ms = g.op("ReduceMean", g.op("Mul", x, x), axes_i=[-1], keepdims_i=1)
        denom = g.op("Sqrt", g.op("Add", ms, g.op("Constant", value_t=torch.tensor(eps_value))))
        y = g.op("Div", x, denom)
        return y if weight.node().mustBeNone() else g.op("Mul", y, weight)

    register_custom_op_symbolic("aten::rms_norm", rms_norm, OPSET)


@functools.cache
def _register_fast_gelu() -> None:
    from torch.onnx import register_custom_op_symbolic, symbolic_helper, symbolic_opset9

    def gelu(g, x, approximate="none"):  # noqa: ANN001  (TorchScript graph values)
        if symbolic_helper._maybe_get_const(approximate, "s") == "tanh":
            return g.op("com.microsoft::FastGelu", x)
        return symbolic_opset9.gelu(g, x, approximate)

    register_custom_op_symbolic("aten::gelu", gelu, OPSET)


def export_onnx(
    forward: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    names: Sequence[str],
    path: Path,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
) -> None:
    """Trace ``forward(*inputs)`` (float32, eval mode) into an ONNX file at ``path``; the dims
    named in ``dynamic_axes`` (input name -> {dim: symbol}) stay free in the graph."""
    _register_rms_norm()
    _register_fast_gelu()
    # No autocast: a graph first used inside a bf16 session would otherwise trace bf16 ops
    # beside its float32 inputs (ONNX Runtime then refuses the graph's mixed types).
    with (
        warnings.catch_warnings(),
        torch.inference_mode(False),
        torch.no_grad(),
        torch.autocast("cpu", enabled=False),
    ):
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        # Clones: inputs made under inference_mode cannot be traced.
        torch.onnx.export(
            forward,
            tuple(t.detach().float().clone() for t in inputs),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=list(names),
            output_names=["out"],
            dynamic_axes={k: dict(v) for k, v in (dynamic_axes or {}).items()} or None,
            do_constant_folding=True,
        )
