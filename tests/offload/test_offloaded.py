"""Per-block offload on the CPU device: same frames as resident, the copy/compute schedule, memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.registry import build_pipeline, load_modules
from talkloop.pipeline.models.shared.a2v import A2VConfig
from talkloop.pipeline.models.studio.family import STUDIO_MODULES, StudioConfig, build_networks
from talkloop.pipeline.models.studio.sr import SRConfig
from talkloop.pipeline.offload.device import CpuOps
from talkloop.pipeline.offload.offloaded import BlockOffloader
from talkloop.pipeline.offload.placement import apply_placement, memory_report

from support import CollectSink, liven, make_reference, tiny_config

pytestmark = pytest.mark.unit

OFFLOAD = {"placement": {"a2v": "offloaded", "sr": "offloaded"}}


def render(modules: dict[str, Module], config, speech: np.ndarray) -> np.ndarray:
    sink = CollectSink()
    pipeline = build_pipeline(config, modules)
    pipeline.open_session(make_reference(), sinks=[sink]).render([speech[:8000]])
    return sink.all_frames()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_offloaded_frames_equal_resident_frames(speech, dtype):
    resident_cfg = tiny_config(model={"dtype": dtype})
    offload_cfg = tiny_config(model={"dtype": dtype, **OFFLOAD})
    resident = load_modules(resident_cfg)
    offloaded = load_modules(offload_cfg)
    liven(resident)
    liven(offloaded)
    assert isinstance(offloaded["a2v"].runtime, BlockOffloader)
    want = render(resident, resident_cfg, speech)
    got = render(offloaded, offload_cfg, speech)
    assert want.shape[0] > 10 and want.std() > 0
    # Offload only changes where weights are read from, never the arithmetic: bitwise equal.
    np.testing.assert_array_equal(got, want)


def deep_modules(a2v_depth: int = 6, sr_depth: int = 4) -> dict[str, Module]:
    """Tiny widths, more blocks than ring slots (so offload has something to leave on the host)."""
    tiny = StudioConfig.tiny()
    family = StudioConfig(
        **{
            **dict(tiny),
            "a2v": A2VConfig(
                patch=2, dim=32, depth=a2v_depth, heads=2, audio_dim=16, max_frames=32
            ),
            "sr": SRConfig(dim=32, depth=sr_depth, heads=2),
        }
    )
    torch.manual_seed(0)
    nets = build_networks(family)
    modules = {n: Module(n, getattr(family, f), nets[n]) for n, f in STUDIO_MODULES.items()}
    liven(modules)
    return modules


def run_deep(placement: dict, speech: np.ndarray) -> tuple[np.ndarray, CpuOps, dict]:
    config = tiny_config(model={"placement": placement})
    modules = deep_modules()
    ops = CpuOps()
    apply_placement(modules, config.model, ops)
    frames = render(modules, config, speech)
    return frames, ops, modules


def test_schedule_copies_the_next_block_before_computing_this_one(speech):
    frames, ops, _ = run_deep(OFFLOAD["placement"], speech)
    for name, depth in (("a2v", 6), ("sr", 4)):
        seq = [e for e in ops.schedule.entries if e.module == name]
        computes = [k for k, e in enumerate(seq) if e.op == "compute"]
        assert len(computes) >= 2 * depth
        for k in computes:
            block = seq[k].block
            # The block's own copy is on its way: its slot holds it (last copy into that slot).
            last_copy = max(j for j in range(k) if seq[j].op == "copy" and seq[j].block == block)
            assert not any(e.op == "evict" and e.block == block for e in seq[last_copy:k]), (
                f"{name} block {block} evicted before it computed"
            )
            if block + 1 < depth:
                nxt = block + 1
                copied = [j for j in range(k) if seq[j].op == "copy" and seq[j].block == nxt]
                evicted = [j for j in range(k) if seq[j].op == "evict" and seq[j].block == nxt]
                # Copy of block n+1 issued before compute of block n, and still in its slot.
                assert copied and (not evicted or copied[-1] > evicted[-1]), (
                    f"{name}: copy of block {nxt} not issued before compute of block {block}"
                )
    # Block 0 arrives by the stage-switch prefetch, then each compute follows the next copy.
    assert ops.schedule.ops("a2v")[:9] == [
        "stage_prefetch0",
        "copy0@0",
        "copy1@1",
        "compute0",
        "done0",
        "evict0",
        "copy2@0",
        "compute1",
        "done1",
    ]


def test_stage_switch_prefetches_the_next_model_during_the_current_stage(speech):
    _, ops, _ = run_deep(OFFLOAD["placement"], speech)
    seq = list(ops.schedule.entries)
    # The first SR forward must find block 0 already copied, issued while the A2V was running.
    first_sr_compute = next(k for k, e in enumerate(seq) if e.module == "sr" and e.op == "compute")
    sr_copy0 = [k for k in range(first_sr_compute) if seq[k].module == "sr" and seq[k].op == "copy"]
    assert sr_copy0, "no SR copy before its first compute"
    assert seq[sr_copy0[0] - 1].op == "stage_prefetch" and seq[sr_copy0[0] - 1].module == "sr"
    a2v_after = [
        k
        for k in range(sr_copy0[0], first_sr_compute)
        if seq[k].module == "a2v" and seq[k].op == "compute"
    ]
    assert a2v_after, "the SR prefetch was not issued while the A2V stage still had work"


def test_offload_holds_less_device_memory_by_the_idle_blocks(speech, capsys):
    frames_r, ops_r, mods_r = run_deep({}, speech)
    frames_o, ops_o, mods_o = run_deep(OFFLOAD["placement"], speech)
    np.testing.assert_array_equal(frames_o, frames_r)
    resident = ops_r.peak_device_bytes
    offloaded = ops_o.peak_device_bytes
    report = {m.name: m for m in memory_report(mods_o)}
    idle = 0  # blocks that live only in host masters: all blocks minus the ring
    for name in ("a2v", "sr"):
        off: BlockOffloader = mods_o[name].runtime
        idle += off.host_bytes - off.ring_bytes
        assert report[name].host_bytes == off.host_bytes
        assert report[name].device_bytes == off.resident_bytes + off.ring_bytes
    with capsys.disabled():
        print(
            f"\n[offload memory] device pool peak: resident {resident / 1024:.1f} KiB, offloaded "
            f"{offloaded / 1024:.1f} KiB, saved {(resident - offloaded) / 1024:.1f} KiB; host "
            f"masters {sum(m.host_bytes for m in report.values()) / 1024:.1f} KiB; idle blocks "
            f"{idle / 1024:.1f} KiB"
        )
    # Saving = bytes of the blocks not in a slot, within slab alignment padding (64 B a tensor).
    assert resident - offloaded == pytest.approx(idle, abs=64 * 40 * 10)
    assert resident - offloaded > 0.5 * idle > 0


def test_event_waited_before_it_was_recorded_is_a_schedule_bug():
    ops = CpuOps()
    with pytest.raises(RuntimeError, match="never recorded"):
        ops.wait(ops.current_stream(), ops.new_event())


def test_network_without_a_pipeline_still_prefetches_cyclically():
    """Called directly (the sampler's repeated calls), block 0 is reloaded during the last block."""
    modules = deep_modules(a2v_depth=3, sr_depth=1)
    ops = CpuOps()
    off = BlockOffloader("sr_like", modules["a2v"].net, ops, slots=2)
    net = modules["a2v"].net
    x = torch.randn(1, 2, 8, 4, 4)
    args = (x, torch.rand(1, 2), torch.arange(2.0)[None], torch.randn(1, 8, 4, 4), None, None)
    with torch.inference_mode():
        net(*args)
        net(*args)
    log = ops.schedule.ops()
    second = log.index("compute0", log.index("compute2"))
    assert "copy0@" in "".join(log[log.index("compute2") - 2 : second])
    assert off.where.count(None) == 1  # three blocks, two slots
