"""The A2V as exported graphs (models/shared/a2v_graph.py): one graph per prompt or none serves
every batch size, frame count and audio keep pattern, and samples what torch samples."""

from __future__ import annotations

import pytest
import torch

from talkloop.pipeline.backends import available_backends
from talkloop.pipeline.models.shared.a2v import A2VDiT
from talkloop.pipeline.models.shared.a2v_graph import A2VGraph, attach_a2v_graph
from talkloop.pipeline.models.shared.sampling import euler_sample

pytestmark = pytest.mark.unit

EXPORTED = [b for b in ("onnxruntime", "openvino") if b in available_backends()]
TOL = {"atol": 1e-4, "rtol": 1e-4}


def _net(tiny, randomise) -> A2VDiT:
    torch.manual_seed(0)
    return randomise(A2VDiT(tiny.a2v), std=0.05).eval()


def _inputs(tiny, b: int, f: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    c = tiny.a2v.latent_channels
    return (
        torch.randn(b, f, c, 8, 8, generator=g),
        torch.rand(b, f, generator=g),
        (torch.arange(f, dtype=torch.float32) - 2).repeat(b, 1),
        torch.randn(b, c, 8, 8, generator=g),
        torch.randn(b, f, tiny.a2v.audio_dim, generator=g),
        torch.randn(b, tiny.a2v.text_dim, generator=g),
    )


@pytest.mark.parametrize("backend", EXPORTED)
def test_one_graph_serves_any_batch_frames_and_audio_keep(
    backend, tiny, randomise, backend_cache
) -> None:
    net = _net(tiny, randomise)
    graph = A2VGraph(net, backend, "test")
    with torch.inference_mode():
        for seed, (b, f) in enumerate([(1, 4), (3, 7), (2, 4), (4, 11)]):
            x, t, pos, ref, audio, text = _inputs(tiny, b, f, seed)
            keep = torch.arange(b) % 2 == 0  # guidance's pattern: kept and dropped samples
            for txt in (text, None):
                want = A2VDiT.forward(net, x, t, pos, ref, audio, txt, audio_keep=keep)
                got = graph(x, t, pos, ref, audio, txt, audio_keep=keep)
                torch.testing.assert_close(got, want, **TOL)
                plain = A2VDiT.forward(net, x, t, pos, ref, audio, txt)
                torch.testing.assert_close(graph(x, t, pos, ref, audio, txt), plain, **TOL)
            # a dropped sample hears nothing (its output ignores its audio), a kept one does
            louder = graph(x, t, pos, ref, audio * 3, None, audio_keep=keep)
            torch.testing.assert_close(louder[~keep], got[~keep], **TOL)
            assert not torch.allclose(louder[keep], got[keep], **TOL)
    assert len(graph.text.runners) == len(graph.no_text.runners) == 1
    assert len(list(backend_cache.glob("test-a2v-fp32-*.onnx"))) == 1


@pytest.mark.parametrize("backend", EXPORTED)
def test_guided_sampling_runs_as_one_graph_and_samples_what_torch_samples(
    backend, tiny, randomise, backend_cache
) -> None:
    net = _net(tiny, randomise)
    x, _, pos, ref, audio, text = _inputs(tiny, 2, 6, seed=5)
    given = torch.zeros(2, 6, dtype=torch.bool)
    given[:, :2] = True  # a motion context, as an N chunk has
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))

    def sample(txt) -> torch.Tensor:
        return euler_sample(
            net, x, given, pos, ref, audio, txt, noise, steps=3, shift=3.0, audio_guidance=2.0
        )

    want = {txt is None: sample(txt) for txt in (text, None)}
    graph = attach_a2v_graph(net, backend, "test")
    assert isinstance(net.forward, A2VGraph) and net.forward is graph
    for txt in (text, None):
        got = sample(txt)
        torch.testing.assert_close(got, want[txt is None], **TOL)
        assert torch.equal(got[given], x[given])  # given frames stay exact
    # The whole loop ran as one graph per prompt or none, its settings in the file names.
    assert sorted(graph.samplers) == [(3, 3.0, 2.0, False), (3, 3.0, 2.0, True)]
    assert all(len(g.runners) == 1 for g in graph.samplers.values())
    assert not graph.text.runners and not graph.no_text.runners
    assert len(list(backend_cache.glob("test-sampler-s3-sh3-g2-*.onnx"))) == 2
    # other settings: another graph, not the first one's
    other = euler_sample(net, x, given, pos, ref, audio, text, noise, steps=2, shift=3.0)
    assert (2, 3.0, 1.0, True) in graph.samplers
    assert not torch.allclose(other, want[False])


@pytest.mark.parametrize("backend", EXPORTED)
def test_a_chunk_without_audio_or_with_text_dropout_runs_in_torch(
    backend, tiny, randomise, backend_cache
) -> None:
    net = _net(tiny, randomise)
    graph = A2VGraph(net, backend, "test")
    x, t, pos, ref, audio, text = _inputs(tiny, 2, 4, seed=1)
    keep = torch.tensor([True, False])
    with torch.inference_mode():
        torch.testing.assert_close(
            graph(x, t, pos, ref, None, text), A2VDiT.forward(net, x, t, pos, ref, None, text)
        )
        torch.testing.assert_close(
            graph(x, t, pos, ref, audio, text, text_keep=keep),
            A2VDiT.forward(net, x, t, pos, ref, audio, text, text_keep=keep),
        )
    assert not graph.text.runners and not graph.no_text.runners


@pytest.mark.parametrize("backend", EXPORTED)
def test_a_batch_on_the_sampler_graph_samples_what_each_samples_alone(
    backend, tiny, randomise, backend_cache
) -> None:
    """What the live engine relies on when it batches several calls' chunks."""
    net = _net(tiny, randomise)
    attach_a2v_graph(net, backend, "test")
    x, _, pos, ref, audio, _ = _inputs(tiny, 3, 5, seed=2)
    given = torch.zeros(3, 5, dtype=torch.bool)
    given[:, :2] = True
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))

    def sample(rows: slice) -> torch.Tensor:
        return euler_sample(
            net,
            x[rows],
            given[rows],
            pos[rows],
            ref[rows],
            audio[rows],
            None,
            noise[rows],
            steps=3,
            shift=3.0,
            audio_guidance=2.0,
        )

    together = sample(slice(0, 3))
    alone = torch.cat([sample(slice(i, i + 1)) for i in range(3)])
    assert torch.equal(together, alone)
