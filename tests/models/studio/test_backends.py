"""Inference backends: the --backend flag and config, availability errors, the auto choice and its
cache, atomic cache writes, and exported graphs against torch on tiny networks (any frame count
through one graph). The real weights' numerics are in test_backend_numerics.py."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from talkloop.pipeline.backends import cache as cache_mod
from talkloop.pipeline.backends.graph import GraphForward
from talkloop.pipeline.backends.runtime import available_backends, check_available
from talkloop.pipeline.backends.select import resolve_backend
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.studio.family import StudioConfig, build_networks

pytestmark = pytest.mark.unit

EXPORTED = [b for b in ("onnxruntime", "openvino") if b in available_backends()]


def test_backend_flag_parses_into_the_config() -> None:
    from talkloop.pipeline.args import config_from_args
    from talkloop.pipeline.cli import build_parser

    parser = build_parser()
    for name in ("auto", "torch", "onnxruntime", "openvino"):
        args = parser.parse_args(["bench", "--family", "studio", "--backend", name])
        assert config_from_args(args).model.backend == name
    args = parser.parse_args(["render", "--audio", "a.wav", "--out", "o.mp4"])
    assert config_from_args(args).model.backend == "auto"  # the CLI's default
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--backend", "tensorrt"])


def test_config_rejects_a_backend_with_offloaded_networks() -> None:
    with pytest.raises(ConfigError, match="resident"):
        build_config(
            model={"family": "studio", "backend": "openvino", "placement": {"a2v": "offloaded"}}
        )
    assert build_config(model={"family": "studio"}).model.backend == "torch"


def test_unavailable_backend_is_a_clear_error(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a)
    )
    assert "openvino" not in available_backends()
    with pytest.raises(ConfigError, match=r"'openvino' is not available.*pip install openvino"):
        check_available("openvino")
    with pytest.raises(ConfigError, match="unknown backend"):
        check_available("tensorrt")
    with pytest.raises(ConfigError, match="not available"):
        resolve_backend("openvino", "cpu", "x", lambda c: {})


def test_auto_times_the_candidates_once_and_caches_the_fastest(backend_cache, monkeypatch) -> None:

    monkeypatch.setattr(
        "talkloop.pipeline.backends.select.available_backends",
        lambda: ("torch", "onnxruntime", "openvino"),
    )
    # Probes are timed by what they return (their own timing), not by a clock.
    calls: list[tuple[str, ...]] = []
    seconds = {"torch": 0.004, "onnxruntime": 0.001, "openvino": 0.008}

    def make_probes(candidates):
        calls.append(candidates)
        return {name: (lambda s=seconds[name]: s) for name in candidates}

    assert resolve_backend("auto", "cpu", "weights-a", make_probes) == "onnxruntime"
    assert resolve_backend("auto", "cpu", "weights-a", make_probes) == "onnxruntime"
    assert len(calls) == 1  # the second process-level call read the cache
    (saved,) = backend_cache.glob("auto-*.json")
    assert json.loads(saved.read_text()) == {"backend": "onnxruntime", "probe_s": seconds}
    resolve_backend("auto", "cpu", "weights-b", make_probes)  # other weights: timed again
    assert len(calls) == 2
    assert resolve_backend("auto", "cuda", "weights-a", make_probes) == "torch"
    assert resolve_backend("torch", "cpu", "weights-a", make_probes) == "torch"


def test_a_probe_is_the_fastest_of_its_runs_after_a_warm_up(monkeypatch) -> None:
    from talkloop.pipeline.backends import select

    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 23.0])  # runs of 5, 2 and 3 "seconds"
    monkeypatch.setattr(select.time, "perf_counter", lambda: next(ticks))
    ran: list[int] = []
    assert select.time_probes({"torch": lambda: ran.append(1)}, runs=3) == {"torch": 2.0}
    assert len(ran) == 4  # one warm-up call, then the three timed ones


def test_load_that_comes_and_goes_falls_on_every_candidate_alike() -> None:
    from talkloop.pipeline.backends import select

    # ONNX Runtime is the faster (50 against 60 ms), but the machine is three times slower for
    # the 7th to 12th probe calls: where ONNX Runtime's warm-up and five runs fall when torch is
    # timed first and the candidates one after the other (it would lose, 150 against 60 ms).
    order: list[str] = []

    def probe(name: str, seconds: float):
        def run() -> float:
            order.append(name)
            return seconds * (3 if 7 <= len(order) <= 12 else 1)

        return run

    probes = {"torch": probe("torch", 0.060), "onnxruntime": probe("onnxruntime", 0.050)}
    best = select.time_probes(probes, runs=5)
    assert order[:4] == ["torch", "onnxruntime", "torch", "onnxruntime"]  # they take turns
    assert best == {"torch": pytest.approx(0.060), "onnxruntime": pytest.approx(0.050)}


def test_cache_writes_are_all_or_nothing(backend_cache) -> None:
    target = cache_mod.cache_dir() / "graph.onnx"

    def fail(tmp):
        tmp.write_bytes(b"half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError):
        cache_mod.cached_file(target, fail)
    assert list(backend_cache.iterdir()) == []  # neither the target nor a temporary file is left
    cache_mod.cached_file(target, lambda tmp: tmp.write_bytes(b"whole"))
    cache_mod.cached_file(target, fail)  # present: not made again
    assert target.read_bytes() == b"whole"


def test_weights_hash_follows_the_weights() -> None:
    torch.manual_seed(0)
    a = build_networks(StudioConfig.tiny())["sr"]
    h = cache_mod.weights_hash(a)
    assert cache_mod.weights_hash(a) == h
    with torch.no_grad():
        a.out.bias += 1e-3
    assert cache_mod.weights_hash(a) != h


@pytest.mark.parametrize("backend", EXPORTED)
def test_exported_graphs_match_torch_at_any_frame_count(backend, backend_cache, randomise) -> None:
    from talkloop.pipeline.models.shared.a2v_graph import A2VGraph
    from talkloop.pipeline.models.studio.backend import _ClassForward

    torch.manual_seed(0)
    nets = build_networks(StudioConfig.tiny())
    a2v, sr, mouth = (randomise(nets[n], std=0.05) for n in ("a2v", "sr", "mouth"))
    a2v_graph = A2VGraph(a2v, backend, "test")
    sr_graph = GraphForward(
        backend, "sr", _ClassForward(sr), ("z_lr", "ref_hr"), dynamic={"z_lr": (0,)}
    )
    mouth_graph = GraphForward(
        backend, "mouth", _ClassForward(mouth), ("z", "audio"), dynamic={"z": (0,), "audio": (0,)}
    )
    g = torch.Generator().manual_seed(1)
    c, ad, td = a2v.cfg.latent_channels, a2v.cfg.audio_dim, a2v.cfg.text_dim
    with torch.inference_mode():
        for f in (7, 4, 11):  # the graph is exported at the first; the others reuse it
            x = torch.randn(1, f, c, 8, 8, generator=g)
            t, pos = torch.rand(1, f, generator=g), torch.arange(f, dtype=torch.float32)[None] - 2
            ref, audio = torch.randn(1, c, 8, 8, generator=g), torch.randn(1, f, ad, generator=g)
            text = torch.randn(1, td, generator=g)
            for txt in (text, None):
                want = type(a2v).forward(a2v, x, t, pos, ref, audio, txt)
                got = a2v_graph(x, t, pos, ref, audio, txt)
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            z_lr, ref_hr = (
                torch.randn(f, c, 8, 8, generator=g),
                torch.randn(1, c, 16, 16, generator=g),
            )
            torch.testing.assert_close(
                sr_graph(z_lr, ref_hr), type(sr).forward(sr, z_lr, ref_hr), atol=1e-4, rtol=1e-4
            )
            z, au = torch.randn(f, c, 16, 16, generator=g), torch.randn(f, ad, generator=g)
            torch.testing.assert_close(
                mouth_graph(z, au), type(mouth).forward(mouth, z, au), atol=1e-4, rtol=1e-4
            )
    assert len(a2v_graph.text.runners) == len(sr_graph.runners) == len(mouth_graph.runners) == 1
    assert len(list(backend_cache.glob("sr-fp32-*.onnx"))) == 1


def test_tanh_gelu_exports_as_one_node(backend_cache) -> None:
    """The DiTs' MLP GELU (tanh form) is one FastGelu node in the graph, run alike by both
    runtimes; the exact (erf) GELU keeps the standard export."""
    import onnx
    from torch import nn

    from talkloop.pipeline.backends.export import export_onnx
    from talkloop.pipeline.models.shared.layers import Mlp

    torch.manual_seed(0)
    mlp = Mlp(16, 64).eval()
    x = torch.randn(2, 5, 16) * 3

    class ExactGelu(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.gelu(x)

    for net, fused in ((mlp, True), (ExactGelu(), False)):
        path = backend_cache / f"{type(net).__name__}.onnx"
        backend_cache.mkdir(parents=True, exist_ok=True)
        export_onnx(net, (x,), ("x",), path)
        ops = [n.op_type for n in onnx.load(str(path)).graph.node]
        assert ("FastGelu" in ops) is fused and ("Tanh" in ops) is False
        for backend in EXPORTED:
            got = GraphForward(backend, type(net).__name__, net, ("x",))(x)
            torch.testing.assert_close(got, net(x).detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", ["tiny", "default"])
def test_decoder_graph_computes_the_decoder(preset, backend_cache, randomise) -> None:
    """The decoder as exported (a transposed conv for the 2x shuffle, the 4x4 cells channels-
    last) gives the decoder's frames, in torch and through each backend's float32 graph."""
    from talkloop.pipeline.models.studio.backend import DecoderGraph, cells_to_frames

    torch.manual_seed(0)
    decoder = randomise(build_networks(getattr(StudioConfig, preset)())["vae"].decoder, std=0.05)
    graph = DecoderGraph(decoder)
    x = torch.randn(3, decoder.stem.in_channels, 8, 12)  # not square: rows and columns apart
    with torch.inference_mode():
        want = decoder(x)
        frames = cells_to_frames(graph(x))
        assert frames.shape == want.shape == (3, 3, 64, 96)
        assert frames.permute(0, 2, 3, 1).is_contiguous()  # (T, H, W, 3) in memory
        torch.testing.assert_close(frames, want, atol=1e-5, rtol=1e-5)
        for backend in EXPORTED:
            exported = GraphForward(backend, f"decoder-{preset}", graph, ("x",))
            torch.testing.assert_close(cells_to_frames(exported(x)), want, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not EXPORTED, reason="needs onnxruntime or openvino")
def test_studio_auto_is_decided_per_chunk_shape(backend_cache) -> None:
    """A live server (short chunks) and an offline render of the same weights each rank the
    backends on their own chunk's work, once: the ranking differs between the two."""
    from talkloop.pipeline.backends.select import schedule_key
    from talkloop.pipeline.models.registry import load_modules

    from support import tiny_config

    offline = tiny_config(model={"backend": "auto"})
    live = tiny_config(model={"backend": "auto"}, schedule={"n_len": 4}, sampler={"steps": 1})
    assert schedule_key(offline) != schedule_key(live)
    load_modules(offline)
    assert len(list(backend_cache.glob("auto-*.json"))) == 1
    load_modules(live)
    load_modules(offline)
    saved = sorted(backend_cache.glob("auto-*.json"))
    assert len(saved) == 2
    for path in saved:
        probe_s = json.loads(path.read_text())["probe_s"]
        assert set(probe_s) == set(available_backends()) and all(t > 0 for t in probe_s.values())


@pytest.mark.skipif(not EXPORTED, reason="needs onnxruntime or openvino")
def test_studio_auto_probes_networks_that_compute_in_bf16(backend_cache) -> None:
    """Where the networks compute in bf16, the exported probes run float32 copies (exporting the
    bf16 SR and mouth nets themselves failed with a dtype mismatch)."""
    from talkloop.pipeline.backends.report import describe
    from talkloop.pipeline.models.registry import load_modules

    from support import tiny_config

    modules = load_modules(tiny_config(model={"backend": "auto", "dtype": "bfloat16"}))
    runtime = describe(modules, "bfloat16")
    assert runtime["backend"] in available_backends()
    (saved,) = backend_cache.glob("auto-*.json")
    assert set(json.loads(saved.read_text())["probe_s"]) == set(available_backends())


@pytest.mark.skipif(not EXPORTED, reason="needs onnxruntime or openvino")
def test_graphs_are_exported_from_the_float32_weights_when_torch_computes_in_bf16(
    backend_cache,
) -> None:
    """In bf16 the torch side's weights are cast down; the graphs still get the exact float32
    weights (cast down and back up they would have lost their low bits)."""
    import torch

    from talkloop.pipeline.models.registry import load_modules
    from talkloop.pipeline.models.studio.backend import exported_nets

    from support import tiny_config

    reference = load_modules(tiny_config(model={"dtype": "float32"}))
    nets = {n: m.net for n, m in reference.items()}
    modules = load_modules(tiny_config(model={"dtype": "bfloat16", "backend": EXPORTED[0]}))
    assert modules["audio_encoder"].compute_dtype == "bfloat16"
    exported = exported_nets({n: m.net for n, m in modules.items()})
    for name, net in exported_nets(nets).items():
        want, got = net.state_dict(), exported[name].state_dict()
        assert want.keys() == got.keys()
        for key, value in want.items():
            assert got[key].dtype == torch.float32 and torch.equal(got[key], value), (name, key)
