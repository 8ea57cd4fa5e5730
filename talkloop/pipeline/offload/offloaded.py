"""Per-block offload: pinned host masters, a fixed ring of device slots, a side copy stream.

Each transformer block's weights live in one pinned host slab (parameters are views into it), so a
block is one copy. The device holds ``slots`` byte buffers the size of the largest block. Before
block ``i`` computes, the compute stream waits on ``copy_done[i]`` and the copy of block ``i+1`` is
issued on the copy stream; after block ``i`` computes, ``compute_done[i]`` is recorded, and the
copy stream waits on it before it overwrites that slot. In steady state the host never waits.
Offloading is a rebind to the master, never a device-to-host copy: inference weights do not change.

Everything attaches through forward pre/post hooks on the blocks: the model code never changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.offload.device import DeviceOps, ScheduleEntry

ALIGN = 64  # bytes: every tensor view in a slab starts aligned for any dtype and vector loads


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class _Tensor:
    owner: nn.Module
    name: str
    is_param: bool
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: torch.Size


@dataclass
class _Block:
    tensors: list[_Tensor]
    nbytes: int
    master: torch.Tensor  # (nbytes,) uint8, pinned where a driver exists
    master_views: list[torch.Tensor] = field(default_factory=list)
    slot_views: dict[int, list[torch.Tensor]] = field(default_factory=dict)


@dataclass
class _Slot:
    buf: torch.Tensor
    occupant: int | None = None
    free_event: Any = None  # compute_done of the last block that ran from this slot
    last_use: int = 0


@dataclass
class StallRecord:
    """CUDA timing events around one copy-done wait; read with :meth:`BlockOffloader.stalls`."""

    block: int
    stage_entry: bool
    before: Any
    after: Any


def blocks_of(net: nn.Module, name: str) -> nn.ModuleList:
    """The ``.blocks`` ModuleList of ``net``, or a ConfigError saying what to change."""
    blocks = getattr(net, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        raise ConfigError(
            f"module {name!r} has no transformer blocks (.blocks ModuleList), so it cannot be "
            f"offloaded or sharded per block; set model.placement.{name}='resident'"
        )
    return blocks


def _view(buf: torch.Tensor, t: _Tensor) -> torch.Tensor:
    return buf[t.offset : t.offset + t.nbytes].view(t.dtype).view(t.shape)


def _bind(t: _Tensor, value: torch.Tensor) -> None:
    if t.is_param:
        t.owner._parameters[t.name].data = value  # keeps the Parameter object (and hooks) alive
    else:
        t.owner._buffers[t.name] = value


class BlockOffloader:
    """Offload the blocks of one network. Created by :func:`talkloop.pipeline.offload.placement`.

    Args:
        name: the module's name (schedule log, errors).
        net: the network; its ``.blocks`` are offloaded, everything else moves to the device.
        ops: device ops.
        slots: device slots in the ring (prefetch depth is ``slots - 1``).
    """

    def __init__(self, name: str, net: nn.Module, ops: DeviceOps, slots: int = 2) -> None:
        if slots < 2:
            raise ConfigError(
                f"offload needs at least 2 slots (got {slots}): one computes, one loads"
            )
        self.name, self.ops = name, ops
        blocks = blocks_of(net, name)
        self.n = len(blocks)
        self.slots_n = min(slots, self.n)
        self.measure = False  # CUDA: record timing events around waits (read by stalls())
        # While active (its stage runs), the last block prefetches block 0 for the next call
        # (the sampler calls the network again at once). An idle module stops there; the stage
        # hook prefetches its first blocks while the stage before it runs.
        self.active = True
        self._stalls: list[StallRecord] = []
        self._stage_entry = False
        self._tick = 0
        self.resident_bytes = self._move_rest(net)
        self.blocks = [self._make_master(blk) for blk in blocks]
        self.host_bytes = sum(b.nbytes for b in self.blocks)
        slot_bytes = max(b.nbytes for b in self.blocks)
        self.ring = [_Slot(ops.empty(slot_bytes)) for _ in range(self.slots_n)]
        self.ring_bytes = slot_bytes * self.slots_n
        for b in self.blocks:
            b.slot_views = {
                s: [_view(sl.buf, t) for t in b.tensors] for s, sl in enumerate(self.ring)
            }
        self.where: list[int | None] = [None] * self.n  # slot of each block, None = host only
        self.copy_stream = ops.new_stream(high_priority=True)
        self.compute_stream = ops.current_stream()
        self.copy_done = [ops.new_event() for _ in range(self.n)]
        self.compute_done = [ops.new_event() for _ in range(self.n)]
        self._handles = []
        for i, blk in enumerate(blocks):
            self._handles.append(blk.register_forward_pre_hook(self._pre_hook(i)))
            self._handles.append(blk.register_forward_hook(self._post_hook(i)))

    # -- construction ------------------------------------------------------------------------------

    def _move_rest(self, net: nn.Module) -> int:
        """Move everything outside ``.blocks`` to the device once (small: embeddings, heads)."""
        moved = 0
        for mod_name, mod in net.named_modules():
            if mod_name == "blocks" or mod_name.startswith("blocks."):
                continue
            for store in (mod._parameters, mod._buffers):
                for key, t in store.items():
                    if t is None:
                        continue
                    moved += t.numel() * t.element_size()
                    if isinstance(t, nn.Parameter):
                        t.data = self.ops.move(t.data)
                    else:
                        store[key] = self.ops.move(t)
        return moved

    def _make_master(self, blk: nn.Module) -> _Block:
        tensors: list[_Tensor] = []
        offset = 0
        for mod in blk.modules():
            for is_param, store in ((True, mod._parameters), (False, mod._buffers)):
                for key, t in store.items():
                    if t is None:
                        continue
                    nbytes = t.numel() * t.element_size()
                    tensors.append(_Tensor(mod, key, is_param, offset, nbytes, t.dtype, t.shape))
                    offset = _align(offset + nbytes)
        # One slab per block: one copy per block instead of one per tensor. Pinned once, here:
        # pinning on the fly is slower than a plain copy (PyTorch pin_memory tutorial).
        master = self.ops.pin(torch.empty(max(offset, ALIGN), dtype=torch.uint8))
        block = _Block(tensors, max(offset, ALIGN), master)
        for t in tensors:
            src = t.owner._parameters[t.name] if t.is_param else t.owner._buffers[t.name]
            view = _view(master, t)
            view.copy_(src.detach().reshape(t.shape))
            block.master_views.append(view)
            _bind(t, view)
        return block

    # -- schedule ----------------------------------------------------------------------------------

    def _log(self, op: str, block: int, slot: int | None = None, ms: float | None = None) -> None:
        self.ops.schedule.add(ScheduleEntry(op, self.name, block, slot, ms))

    def _pick_slot(self, keep: set[int]) -> int:
        """The least recently used slot whose occupant is not in ``keep``."""
        free = [
            s for s, sl in enumerate(self.ring) if sl.occupant is None or sl.occupant not in keep
        ]
        return min(free, key=lambda s: (self.ring[s].occupant is not None, self.ring[s].last_use))

    def _issue(self, j: int, keep: set[int]) -> None:
        """Start copying block ``j`` into a slot, unless it is already there or on its way."""
        if self.where[j] is not None:
            return
        s = self._pick_slot(keep)
        slot = self.ring[s]
        if slot.occupant is not None:
            old = self.blocks[slot.occupant]
            for t, v in zip(old.tensors, old.master_views, strict=True):
                _bind(t, v)  # the evicted block reads its host master again (never stale memory)
            self.where[slot.occupant] = None
            self._log("evict", slot.occupant, s)
        if slot.free_event is not None:
            # Hazard: overwriting weights that kernels of the previous occupant may still be
            # reading. A GPU-side wait on the copy stream; the host does not block.
            self.ops.wait(self.copy_stream, slot.free_event)
        b = self.blocks[j]
        ms = self.ops.copy(slot.buf[: b.nbytes], b.master, self.copy_stream)
        self.ops.record(self.copy_done[j], self.copy_stream)
        for t, v in zip(b.tensors, b.slot_views[s], strict=True):
            _bind(t, v)
        slot.occupant, self.where[j] = j, s
        self._tick += 1
        slot.last_use = self._tick
        self._log("copy", j, s, ms)

    def _pre_hook(self, i: int):
        def hook(module: nn.Module, args: Any) -> None:
            window = {(i + k) % self.n for k in range(self.slots_n)}
            self._issue(i, window)  # cold path: not prefetched (first call, or evicted)
            measure = self.measure and self.ops.kind == "cuda"
            before = after = None
            if measure:
                before = self.ops.new_event(timing=True)
                self.ops.record(before, self.compute_stream)
            # Hazard: computing with weights whose copy has not landed. The compute stream waits
            # on the copy stream's event; the host does not block.
            self.ops.wait(self.compute_stream, self.copy_done[i])
            if measure:
                after = self.ops.new_event(timing=True)
                self.ops.record(after, self.compute_stream)
                self._stalls.append(StallRecord(i, self._stage_entry and i == 0, before, after))
            if i == 0:
                self._stage_entry = False
            # Prefetch the next blocks (cyclic: the sampler calls the network again right away)
            # before this block computes, so their copies overlap its compute.
            for k in range(1, self.slots_n):
                if i + k >= self.n and not self.active:
                    break
                self._issue((i + k) % self.n, window)
            self._tick += 1
            self.ring[self.where[i]].last_use = self._tick  # type: ignore[index]
            self._log("compute", i, self.where[i])

        return hook

    def _post_hook(self, i: int):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            slot = self.ring[self.where[i]]  # type: ignore[index]
            self.ops.record(self.compute_done[i], self.compute_stream)
            slot.free_event = self.compute_done[i]
            self._log("done", i, self.where[i])

        return hook

    # -- stage switches and measurement -----------------------------------------------------------

    def prefetch_first(self, count: int) -> None:
        """Issue the copies of the first ``count`` blocks (called when the previous stage starts)."""
        count = min(count, self.slots_n)
        keep = set(range(count))
        for j in range(count):
            if self.where[j] is None:
                self._log("stage_prefetch", j)
            self._issue(j, keep)
        self._stage_entry = True

    def stalls(self) -> dict[str, list[float]]:
        """Exposed waits in ms (CUDA, ``measure=True``): ``per_block`` and ``swap_stall_ms``
        (block 0 right after a stage switch). Synchronises the host: call at the end only."""
        per_block, swap = [], []
        for r in self._stalls:
            ms = self.ops.elapsed_ms(r.before, r.after)
            if ms is None:
                continue
            (swap if r.stage_entry else per_block).append(ms)
        self._stalls.clear()
        return {"per_block": per_block, "swap_stall_ms": swap}

    def device_bytes(self) -> int:
        """Bytes this module holds on the device: the non-block part plus the ring."""
        return self.resident_bytes + self.ring_bytes

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
