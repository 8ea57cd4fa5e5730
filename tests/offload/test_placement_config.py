"""Invalid placements fail when the config is built, with a message that says what to change."""

from __future__ import annotations

import pytest
import torch

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.offload.device import CpuOps
from talkloop.pipeline.offload.distributed import bind_numa, numa_cpus, parse_cpulist
from talkloop.pipeline.offload.offloaded import BlockOffloader

from support import tiny_config

pytestmark = pytest.mark.unit


def test_default_placement_is_resident():
    placement = tiny_config().model.placement.model_dump()
    assert set(placement.values()) == {"resident"}


def test_offloading_a_module_without_blocks_fails_and_says_what_to_set():
    with pytest.raises(ConfigError, match=r"placement.vae='resident'") as err:
        tiny_config(model={"placement": {"vae": "offloaded"}})
    assert "no transformer blocks" in str(err.value)


def test_sharding_in_one_process_fails_and_says_how_to_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="torchrun --nproc-per-node 2") as err:
        tiny_config(model={"placement": {"a2v": "sharded"}})
    assert "world size is 1" in str(err.value) and "'offloaded'" in str(err.value)


def test_sharding_is_accepted_when_torchrun_says_two_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = tiny_config(model={"placement": {"a2v": "sharded"}})
    assert config.model.placement.a2v == "sharded"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-driver message")
def test_pinned_memory_without_a_driver_fails():
    with pytest.raises(ConfigError, match="pin_memory=null"):
        tiny_config(model={"pin_memory": True})
    with pytest.raises(ConfigError, match="device='cpu'"):
        tiny_config(model={"device": "cuda"})


def test_one_slot_is_rejected():
    with pytest.raises(ConfigError, match="offload_slots"):
        tiny_config(model={"offload_slots": 1})


def test_a_network_without_blocks_is_rejected_when_placed(tiny_modules):
    vae: Module = tiny_modules["vae"]
    with pytest.raises(ConfigError, match="placement.vae='resident'"):
        BlockOffloader("vae", vae.net, CpuOps())


def test_cpulist_parsing_and_numa_node_lookup(tmp_path):
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    pci, node = tmp_path / "pci", tmp_path / "node"
    (pci / "0000:17:00.0").mkdir(parents=True)
    (pci / "0000:17:00.0" / "numa_node").write_text("1\n")
    (node / "node1").mkdir(parents=True)
    (node / "node1" / "cpulist").write_text("4-7\n")
    assert numa_cpus("0000:17:00.0", pci, node) == {4, 5, 6, 7}
    assert numa_cpus("0000:99:00.0", pci, node) == set()


def test_numa_binding_on_cpu_logs_why_it_is_skipped(caplog):
    with caplog.at_level("INFO", logger="talkloop.offload"):
        assert bind_numa(CpuOps(), 0) is None
    assert len(caplog.records) == 1 and "NUMA binding skipped: no GPU" in caplog.text
