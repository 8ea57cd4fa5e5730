"""Module: one network, its config and its checkpoint.

A Module knows how to save and load its weights (safetensors + a JSON config), its dtype and its
memory footprint. It holds no session state: many sessions share one Module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from pydantic import BaseModel, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from talkloop.pipeline.core.errors import CheckpointError

C = TypeVar("C", bound=BaseModel)


class Module(Generic[C]):
    """A named network plus the pydantic config it was built from.

    Args:
        name: the role of the network in its family ("a2v", "vae", ...); names checkpoint files.
        config: the architecture config.
        net: the network; put in eval mode and frozen (inference only).
    """

    def __init__(self, name: str, config: C, net: torch.nn.Module) -> None:
        self.name = name
        self.config = config
        self.net = net.eval().requires_grad_(False)
        # Set by pipeline.offload.placement: "resident", "offloaded" or "sharded", and the
        # offloaded module's BlockOffloader (hooks on the net do the work; nothing here changes).
        self.placement = "resident"
        self.runtime: Any = None
        # The dtype its matmuls compute in, set when the family's modules are loaded
        # (models.registry.finish_modules: the resolved ``model.dtype``, ``auto`` measured).
        self.compute_dtype: str | None = None

    def __repr__(self) -> str:
        return f"Module({self.name!r}, {self.num_parameters() / 1e6:.2f}M params)"

    def cast_matmuls(self, dtype: torch.dtype) -> None:
        """Store Linear and Conv weights in ``dtype`` (inference under autocast).

        Autocast would otherwise cast every fp32 weight to bf16 on every call, a large share of
        the A2V's time (docs/benchmarks.md, "Figures behind code choices"). Norms and embeddings
        keep their precision.
        """
        for layer in self.net.modules():
            if isinstance(layer, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)):
                layer.to(dtype)
        self.compute_dtype = "bfloat16" if dtype == torch.bfloat16 else "float32"

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.net.state_dict().items() if isinstance(v, torch.Tensor)}

    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.state_dict().values())

    def footprint_bytes(self) -> int:
        """Bytes held by the module's tensors (parameters and buffers)."""
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())

    # -- checkpoints -----------------------------------------------------------------------------

    def paths(self, folder: Path) -> tuple[Path, Path]:
        return folder / f"{self.name}.safetensors", folder / f"{self.name}.json"

    def save(self, folder: Path, dtype: torch.dtype | None = None) -> None:
        """Write ``<name>.safetensors`` and ``<name>.json`` into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        weights, cfg = self.paths(folder)
        tensors = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if dtype is not None:
            tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
        save_file(tensors, str(weights))
        cfg.write_text(json.dumps(self.config.model_dump(mode="json"), indent=2) + "\n")

    def load(self, folder: Path) -> None:
        """Load weights from ``folder``, checking config and every tensor name and shape."""
        weights, cfg = self.paths(folder)
        if not weights.is_file() or not cfg.is_file():
            raise CheckpointError(
                f"checkpoint for {self.name!r} not found: expected {weights} and {cfg}"
            )
        try:
            tensors = load_file(str(weights))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"cannot read {weights}: {err}") from None
        # Tensors first: a shape mismatch names the tensor, which says most about what is wrong.
        load_checked(self.net, tensors, source=str(weights))
        try:
            saved_config = json.loads(cfg.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{cfg} is not valid JSON: {err}") from None
        mine = self.config.model_dump(mode="json")
        if saved_config != mine:
            diff = sorted(
                k for k in set(mine) | set(saved_config) if mine.get(k) != saved_config.get(k)
            )
            raise CheckpointError(
                f"{cfg} does not match the {self.name!r} config: {diff[0]} is "
                f"{saved_config.get(diff[0])!r} in the checkpoint but {mine.get(diff[0])!r} in the config"
            )


def load_checked(net: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``tensors`` into ``net``; any missing, extra or mis-shaped tensor is a CheckpointError."""
    expected = {k: v for k, v in net.state_dict().items() if isinstance(v, torch.Tensor)}
    for name, want in expected.items():
        got = tensors.get(name)
        if got is None:
            raise CheckpointError(
                f"{source}: tensor {name!r} is missing (expected shape {tuple(want.shape)})"
            )
        if tuple(got.shape) != tuple(want.shape):
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(got.shape)} in the checkpoint "
                f"but {tuple(want.shape)} in the model"
            )
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{source}: unexpected tensor {extra[0]!r} (not in the model)")
    converted = {k: tensors[k].to(expected[k].dtype) for k in expected}
    net.load_state_dict(converted, strict=True)


def build_module(
    name: str, config: C, factory: Callable[[C], torch.nn.Module], folder: Path | None
) -> Module[C]:
    """Build a module from its config and, when ``folder`` is given, load its checkpoint."""
    try:
        net = factory(config)
    except ValidationError as err:  # pragma: no cover - configs are validated before this
        raise CheckpointError(f"bad config for {name!r}: {err}") from None
    module = Module(name, config, net)
    if folder is not None:
        module.load(folder)
    return module
