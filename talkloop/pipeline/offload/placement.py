"""Apply ``model.placement`` to loaded modules: resident, offloaded or sharded.

Called by :func:`talkloop.pipeline.models.registry.load_modules`. Each module ends with ``placement`` (its
mode) and ``runtime`` (the :class:`BlockOffloader` of an offloaded module, else None) set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from talkloop.pipeline.core.config import ModelConfig
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.offload.device import DeviceOps, make_ops
from talkloop.pipeline.offload.distributed import ensure_process_group
from talkloop.pipeline.offload.io import attach_io
from talkloop.pipeline.offload.offloaded import BlockOffloader, blocks_of
from talkloop.pipeline.offload.sharded import shard


@dataclass(frozen=True)
class ModuleMemory:
    """Where one module's bytes are: on the device, in host masters."""

    name: str
    placement: str
    device_bytes: int
    host_bytes: int


def apply_placement(
    modules: Mapping[str, Module], config: ModelConfig, ops: DeviceOps | None = None
) -> DeviceOps:
    """Place every module as ``config.placement`` says. Returns the device ops used.

    Raises:
        ConfigError: a module to offload or shard has no ``.blocks``, or sharding has one rank.
    """
    ops = ops or make_ops(config.device)
    if config.pin_memory is not None:
        ops.pins = config.pin_memory and ops.kind == "cuda"
    placement = config.placement.model_dump()
    unknown = sorted(set(placement) - set(modules))
    wanted = {k: v for k, v in placement.items() if k in modules}
    if unknown and any(placement[k] != "resident" for k in unknown):
        raise ConfigError(f"model.placement names modules that are not loaded: {unknown}")
    # Check every module first, so a bad config fails before anything is moved or pinned.
    for name, mode in wanted.items():
        if mode != "resident":
            blocks_of(modules[name].net, name)
    world = 1
    if "sharded" in wanted.values():
        world = ensure_process_group(ops)
        if world < 2:
            raise ConfigError(
                "model.placement shards a module but this is a single process (world size 1); "
                "launch with torchrun --nproc-per-node 2 or set the module to 'offloaded'"
            )
    # The dtype the family loaded them in (registry.finish_modules): what a shard is cut in.
    bf16 = any(m.compute_dtype == "bfloat16" for m in modules.values())
    dtype = torch.bfloat16 if bf16 else torch.float32
    for name, module in modules.items():
        mode = wanted.get(name, "resident")
        module.placement = mode
        if mode == "offloaded":
            module.runtime = BlockOffloader(name, module.net, ops, slots=config.offload_slots)
        elif mode == "sharded":
            module.runtime = None
            module.shard_bytes = shard(name, module.net, ops, dtype, world)
        else:
            module.runtime = None
            if name == "text_encoder":
                continue  # the packaged sentence encoder runs on the host (no state of ours)
            for t in list(module.net.parameters()) + list(module.net.buffers()):
                t.data = ops.move(t.data)
        if name != "text_encoder":
            attach_io(module.net, ops.device)
    return ops


def memory_report(modules: Mapping[str, Module]) -> list[ModuleMemory]:
    """Bytes each module holds on the device and in host masters (weights only)."""
    out = []
    for name, m in modules.items():
        mode = getattr(m, "placement", "resident")
        runtime = getattr(m, "runtime", None)
        if isinstance(runtime, BlockOffloader):
            out.append(ModuleMemory(name, mode, runtime.device_bytes(), runtime.host_bytes))
        elif mode == "sharded":
            out.append(ModuleMemory(name, mode, int(getattr(m, "shard_bytes", 0)), 0))
        else:
            out.append(ModuleMemory(name, mode, m.footprint_bytes(), 0))
    return out
