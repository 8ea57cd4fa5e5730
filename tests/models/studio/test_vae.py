"""StudioVAE: shapes, causal streaming decode, bounded cache."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest
import torch

from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.models.studio.stages import micro_batch
from talkloop.pipeline.models.studio.vae import StudioVAE, VAEConfig

from support import CollectSink, make_reference, tiny_config

pytestmark = pytest.mark.unit


def _vae(tiny, **kw) -> StudioVAE:
    torch.manual_seed(0)
    cfg = tiny.vae.model_copy(update=kw)
    return StudioVAE(cfg).eval().to(memory_format=torch.channels_last)


def test_encode_decode_shapes(tiny) -> None:
    vae = _vae(tiny)
    img = torch.rand(2, 3, 64, 96) * 2 - 1
    with torch.no_grad():
        z = vae.encode(img)
        mean, logvar = vae.encode_dist(img)
        frames, cache = vae.decode(z)
    assert z.shape == (2, 8, 8, 12)
    assert mean.shape == logvar.shape == z.shape
    assert frames.shape == (2, 3, 64, 96)
    assert frames.dtype == torch.float32
    assert frames.abs().max() <= 1.0
    assert cache.shape == (tiny.vae.cache_frames, 8, 8, 12)


@pytest.mark.parametrize("decode_batch", [1, 3])
@pytest.mark.parametrize("bf16", [False, True])
def test_decode_in_pieces_equals_whole(tiny, decode_batch: int, bf16: bool) -> None:
    vae = _vae(tiny, decode_batch=decode_batch)
    z = torch.randn(11, 8, 16, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        whole, whole_cache = vae.decode(z)
        for splits in ([1, 10], [4, 7], [3, 3, 3, 2], [1] * 11):
            parts, cache, s = [], None, 0
            for n in splits:
                out, cache = vae.decode(z[s : s + n], cache)
                parts.append(out)
                s += n
            assert torch.equal(torch.cat(parts), whole), splits
            assert torch.equal(cache, whole_cache)


def test_decode_is_causal(tiny) -> None:
    vae = _vae(tiny)
    z = torch.randn(8, 8, 16, 16)
    z2 = z.clone()
    z2[5] += 1.0
    with torch.no_grad():
        a, _ = vae.decode(z)
        b, _ = vae.decode(z2)
    assert torch.equal(a[:5], b[:5])
    assert not torch.equal(a[5], b[5])


def test_decode_sees_only_cache_frames_of_history(tiny) -> None:
    k = tiny.vae.cache_frames
    vae = _vae(tiny)
    z = torch.randn(8, 8, 16, 16)
    z2 = z.clone()
    z2[1] += 1.0  # frame 1 is visible to frames 1..1+k only
    with torch.no_grad():
        a, _ = vae.decode(z)
        b, _ = vae.decode(z2)
    assert not torch.equal(a[1 + k], b[1 + k])
    assert torch.equal(a[2 + k :], b[2 + k :])


def test_cache_is_bounded(tiny) -> None:
    vae = _vae(tiny)
    cache = None
    with torch.no_grad():
        for n in (1, 5, 12):
            _, cache = vae.decode(torch.randn(n, 8, 8, 8), cache)
            assert cache.shape == (tiny.vae.cache_frames, 8, 8, 8)


def test_latent_scale_round_trip(tiny) -> None:
    a, b = _vae(tiny), _vae(tiny, latent_scale=0.5)
    img = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(b.encode(img), a.encode(img) * 0.5)
        assert torch.equal(b.decode(a.encode(img) * 0.5)[0], a.decode(a.encode(img))[0])


@pytest.mark.parametrize("bad", [{"latent_channels": 0}, {"cache_frames": -1}, {"nope": 1}])
def test_config_rejects_bad_values(bad) -> None:
    with pytest.raises(pydantic.ValidationError):
        VAEConfig(**bad)


@pytest.mark.parametrize(
    ("chunk", "preferred", "expected"),
    [(24, 3, 3), (5, 3, 5), (6, 3, 3), (7, 3, 1), (8, 3, 4), (1, 3, 1), (5, 1, 1)],
)
def test_micro_batch_is_the_divisor_of_the_chunk_nearest_the_preferred_size(
    chunk: int, preferred: int, expected: int
) -> None:
    assert micro_batch(chunk, preferred) == expected


def test_live_chunks_decode_without_padding_frames(tiny_modules, monkeypatch) -> None:
    """5-frame chunks with a preferred micro-batch of 3: every decoder call takes 5 frames, and
    only the first chunk (2 frames) and the last one are padded."""
    vae = tiny_modules["vae"].net
    monkeypatch.setattr(vae, "cfg", vae.cfg.model_copy(update={"decode_batch": 3}))
    calls: list[int] = []
    forward = vae.decoder.forward

    def spy(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return forward(x)

    monkeypatch.setattr(vae.decoder, "forward", spy)
    config = tiny_config(schedule={"first_len": 2, "n_len": 5, "i_len": 2, "ctx_len": 2})
    sink = CollectSink()
    session = build_pipeline(config, tiny_modules).open_session(make_reference(), "", [sink])
    session.render([np.zeros(16000 * 2, np.float32)])  # 50 frames: 2 + 9 x 5 + 3
    published = sink.all_frames().shape[0]
    assert published == 50
    assert set(calls) == {5}
    assert sum(calls) == published + 3 + 2  # first chunk 2 -> 5, last chunk 3 -> 5
