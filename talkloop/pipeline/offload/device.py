"""Device ops: streams, events, pinned memory and memory stats behind one interface.

Nothing else in talkloop calls ``torch.cuda`` directly (docs/offload.md). ``CudaOps`` is the
real thing; ``CpuOps`` runs the same offload logic on the host, where "device" memory is ordinary
CPU memory it counts itself, copies are synchronous, streams are tokens and events are flags. An
event that is waited on before it was ever recorded is a schedule bug on a GPU (the wait would be a
no-op and compute would read half-copied weights), so ``CpuOps`` raises on it: CPU tests catch
ordering mistakes that would otherwise need a GPU to show up.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("talkloop.offload")


def driver_available() -> bool:
    """True when a CUDA driver and at least one device are present."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - a broken driver install counts as no driver
        return False


@dataclass(frozen=True)
class ScheduleEntry:
    """One step of the copy/compute schedule (recorded on every device, asserted in tests).

    ``op`` is ``copy`` (weights of ``block`` issued into ``slot``), ``compute`` (the block's
    forward is about to run, after its copy-done wait), ``done`` (its forward returned),
    ``evict`` (the block left ``slot``) or ``stage_prefetch`` (a stage switch asked for it).
    """

    op: str
    module: str
    block: int
    slot: int | None = None
    ms: float | None = None  # CPU only: wall time of a host-to-host copy


class ScheduleLog:
    """A bounded record of schedule entries (bounded: a long session must not grow memory)."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.entries: deque[ScheduleEntry] = deque(maxlen=maxlen)

    def add(self, entry: ScheduleEntry) -> None:
        self.entries.append(entry)

    def ops(self, module: str | None = None) -> list[str]:
        """Entries as short strings, e.g. ``copy1@0``, ``compute0``; optionally one module's."""
        out = []
        for e in self.entries:
            if module is None or e.module == module:
                out.append(f"{e.op}{e.block}" + (f"@{e.slot}" if e.op == "copy" else ""))
        return out

    def clear(self) -> None:
        self.entries.clear()


class DeviceOps:
    """The interface the offload layer talks to. Use :func:`make_ops` to get one.

    Attributes:
        kind: ``"cuda"`` or ``"cpu"`` (also the ``device_type`` of meshes and autocast).
        device: where compute runs.
        pins: whether host masters are page-locked.
        schedule: the copy/compute schedule log.
    """

    kind: str = "cpu"
    device: torch.device = torch.device("cpu")
    pins: bool = False

    def __init__(self) -> None:
        self.schedule = ScheduleLog()

    # streams and events
    def new_stream(self, high_priority: bool = True) -> Any:
        raise NotImplementedError

    def current_stream(self) -> Any:
        raise NotImplementedError

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def new_event(self, timing: bool = False) -> Any:
        raise NotImplementedError

    def record(self, event: Any, stream: Any) -> None:
        raise NotImplementedError

    def wait(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait for ``event`` without blocking the host."""
        raise NotImplementedError

    def elapsed_ms(self, start: Any, end: Any) -> float | None:
        """Milliseconds between two timing events (host-synchronising: read at the end only)."""
        return None

    # memory
    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def empty(self, nbytes: int) -> torch.Tensor:
        """A device byte buffer (counted in the device pool)."""
        raise NotImplementedError

    def move(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the device (counted in the device pool)."""
        raise NotImplementedError

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> float | None:
        """Issue ``dst.copy_(src)`` on ``stream``; returns CPU wall ms where copies are synchronous."""
        raise NotImplementedError

    def release(self, nbytes: int) -> None:
        """Tell the pool that ``nbytes`` it counted were freed (CPU bookkeeping)."""

    def memory_stats(self) -> dict[str, float]:
        """``device_mb`` now, ``peak_device_mb`` and (CUDA) ``reserved_mb``."""
        raise NotImplementedError

    def reset_peak(self) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Block the host until the device is idle (measurement and shutdown only)."""

    def set_device(self, index: int) -> None:
        """Select the device of this process (one GPU per rank)."""

    def autocast(self, dtype: torch.dtype) -> contextlib.AbstractContextManager:
        return torch.autocast(self.kind, dtype=dtype)


class _CpuStream:
    """A stream token: CPU work is ordered by the host thread itself."""

    def __repr__(self) -> str:
        return "CpuStream()"


class _CpuEvent:
    """A flag: on CPU a copy has landed when ``copy`` returns, so recording completes it."""

    def __init__(self) -> None:
        self.recorded = False


class CpuOps(DeviceOps):
    """Host implementation: the device pool is CPU memory counted by this object."""

    kind = "cpu"
    device = torch.device("cpu")
    pins = False

    def __init__(self) -> None:
        super().__init__()
        self.device_bytes = 0
        self.peak_device_bytes = 0

    def new_stream(self, high_priority: bool = True) -> _CpuStream:
        return _CpuStream()

    def current_stream(self) -> _CpuStream:
        return _CpuStream()

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def new_event(self, timing: bool = False) -> _CpuEvent:
        return _CpuEvent()

    def record(self, event: _CpuEvent, stream: Any) -> None:
        event.recorded = True

    def wait(self, stream: Any, event: _CpuEvent) -> None:
        if not event.recorded:
            raise RuntimeError(
                "offload schedule bug: waiting on an event that was never recorded (on a GPU "
                "compute would read weights whose copy was never issued)"
            )

    def _count(self, nbytes: int) -> None:
        self.device_bytes += nbytes
        self.peak_device_bytes = max(self.peak_device_bytes, self.device_bytes)

    def empty(self, nbytes: int) -> torch.Tensor:
        self._count(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    def move(self, t: torch.Tensor) -> torch.Tensor:
        self._count(t.numel() * t.element_size())
        return t

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> float:
        t0 = time.perf_counter()
        dst.copy_(src)
        return (time.perf_counter() - t0) * 1000.0

    def release(self, nbytes: int) -> None:
        self.device_bytes -= nbytes

    def memory_stats(self) -> dict[str, float]:
        return {
            "device_mb": self.device_bytes / 2**20,
            "peak_device_mb": self.peak_device_bytes / 2**20,
        }

    def reset_peak(self) -> None:
        self.peak_device_bytes = self.device_bytes


class CudaOps(DeviceOps):  # pragma: no cover - needs a GPU (scripts/gpu_check.py, tests marked gpu)
    """CUDA implementation: pinned masters, a high-priority copy stream, real events."""

    kind = "cuda"

    def __init__(self, index: int | None = None) -> None:
        super().__init__()
        if not driver_available():
            raise RuntimeError("CudaOps needs a CUDA driver and device")
        self.device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        self.pins = True

    def new_stream(self, high_priority: bool = True) -> torch.cuda.Stream:
        # Priority -1 (high), as FSDP2 does for its copy-in streams: a weight copy that compute
        # will wait on should not queue behind low-priority work.
        return torch.cuda.Stream(self.device, priority=-1 if high_priority else 0)

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def stream(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def new_event(self, timing: bool = False) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=timing)

    def record(self, event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
        # Record on the stream that did the work, never the ambient one (TensorRT-LLM#6906).
        event.record(stream)

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        # elapsed_time on an event still pending raises "device not ready" (pytorch#85796).
        end.synchronize()
        return float(start.elapsed_time(end))

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if self.pins else t

    def empty(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def move(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            # Pinned source + side stream + non_blocking: the only combination that overlaps.
            dst.copy_(src, non_blocking=True)
        return None

    def memory_stats(self) -> dict[str, float]:
        return {
            "device_mb": torch.cuda.memory_allocated(self.device) / 2**20,
            "peak_device_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
            "reserved_mb": torch.cuda.max_memory_reserved(self.device) / 2**20,
        }

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)
        self.device = torch.device("cuda", index)

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def pci_bus_id(self, index: int) -> str:
        """``dddd:bb:dd.f`` of CUDA ordinal ``index`` (respects CUDA_VISIBLE_DEVICES)."""
        p = torch.cuda.get_device_properties(index)
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"


def make_ops(device: str = "cpu") -> DeviceOps:
    """Device ops for ``device`` (``"cpu"`` or ``"cuda"``)."""
    if device == "cuda":
        return CudaOps()
    return CpuOps()
