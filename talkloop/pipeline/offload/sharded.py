"""FSDP2 sharding of one network across the ranks of the process group.

Each block is its own FSDP unit (one all-gather per block), then the root takes the rest. Every
unit reshards after forward (inference: peak is about two unsharded blocks plus the shards), and
block ``i`` prefetches block ``i+1``'s all-gather explicitly. FSDP2 needs one parameter dtype per
unit, so the network is stored in the compute dtype and the mixed-precision policy gathers and
computes in it; with ``model.dtype=bfloat16`` norms therefore run with bf16 weights too (the
tolerance the tests document).
"""

from __future__ import annotations

import torch
from torch import nn

from talkloop.pipeline.offload.device import DeviceOps
from talkloop.pipeline.offload.offloaded import blocks_of


def shard(name: str, net: nn.Module, ops: DeviceOps, dtype: torch.dtype, world_size: int) -> int:
    """Shard ``net`` in place with ``fully_shard`` over a 1-D mesh of ``world_size`` ranks.

    Returns:
        bytes of this rank's shards.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    blocks = blocks_of(net, name)
    net.to(device=ops.device, dtype=dtype)
    # Always an explicit mesh of the ops' device type: without one FSDP2 picks a CUDA mesh on a
    # machine with GPUs even under gloo, which crashed (pytorch#132471).
    mesh = init_device_mesh(ops.kind, (world_size,))
    # Inputs keep their dtype (timesteps, positions): casting them to bf16 would change results
    # more than the weights do.
    policy = MixedPrecisionPolicy(param_dtype=dtype, cast_forward_inputs=False)
    for blk in blocks:
        fully_shard(blk, mesh=mesh, reshard_after_forward=True, mp_policy=policy)
    fully_shard(net, mesh=mesh, reshard_after_forward=True, mp_policy=policy)
    for cur, nxt in zip(blocks[:-1], blocks[1:], strict=True):
        cur.set_modules_to_forward_prefetch([nxt])  # type: ignore[operator]
    return sum(p.to_local().numel() * p.element_size() for p in net.parameters())  # type: ignore[attr-defined]
