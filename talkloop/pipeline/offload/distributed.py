"""Process group and NUMA binding for multi-process runs under ``torchrun``.

``torchrun --nproc-per-node N -m talkloop render ...`` starts N ranks; each binds itself to the
NUMA node of its GPU (before it pins or allocates anything large), joins the process group (NCCL on
GPUs, gloo on CPUs) and builds the pipeline with its shard of every sharded module. Only rank 0
publishes: it alone opens sinks.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from talkloop.pipeline.offload.device import DeviceOps, log

SYS_PCI = Path("/sys/bus/pci/devices")
SYS_NODE = Path("/sys/devices/system/node")


def env_world_size() -> int:
    """World size of this process: the process group's, else torchrun's WORLD_SIZE, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def is_publisher() -> bool:
    """True on the rank that opens sinks (rank 0; every process when not distributed)."""
    return rank() == 0


def parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def numa_cpus(pci_bus_id: str, sys_pci: Path = SYS_PCI, sys_node: Path = SYS_NODE) -> set[int]:
    """CPUs of the NUMA node a PCI device hangs off (empty when unknown)."""
    node_file = sys_pci / pci_bus_id.lower() / "numa_node"
    if not node_file.is_file():
        return set()
    node = int(node_file.read_text().strip())
    node = max(node, 0)  # -1: a single-node machine
    cpulist = sys_node / f"node{node}" / "cpulist"
    return parse_cpulist(cpulist.read_text()) if cpulist.is_file() else set()


def bind_numa(ops: DeviceOps, local_rank: int) -> set[int] | None:
    """Bind this process to the CPUs of its GPU's NUMA node; log one line saying what happened.

    Must run before pinned masters are allocated: ``sched_setaffinity`` does not move pages that
    were already touched, and threads created earlier keep their old mask.

    Returns:
        the CPUs bound to, or None when binding was skipped.
    """
    if ops.kind != "cuda":
        log.warning("NUMA binding skipped: no GPU (the device is the CPU, nothing to be near)")
        return None
    bus = ops.pci_bus_id(local_rank)  # type: ignore[attr-defined]
    node_cpus = numa_cpus(bus)
    if not node_cpus:
        log.warning("NUMA binding skipped: %s has no numa_node in %s", bus, SYS_PCI)
        return None
    allowed = os.sched_getaffinity(0)
    cpus = node_cpus & allowed
    if not cpus:  # an empty set raises EINVAL; containers may exclude the whole node
        log.warning("NUMA binding skipped: node CPUs of %s are outside this process's cgroup", bus)
        return None
    os.sched_setaffinity(0, cpus)

    torch.set_num_threads(len(cpus))  # no intra-op oversubscription after narrowing the mask
    log.info("rank %d bound to %d CPUs of the NUMA node of GPU %s", local_rank, len(cpus), bus)
    return cpus


def ensure_process_group(ops: DeviceOps) -> int:
    """Join the process group torchrun describes (once); returns the world size."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_world_size()
    world = env_world_size()
    if world < 2:
        return 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if ops.kind == "cuda":
        ops.set_device(local_rank)
    bind_numa(ops, local_rank)
    dist.init_process_group("nccl" if ops.kind == "cuda" else "gloo")
    return dist.get_world_size()
