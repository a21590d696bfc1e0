"""Beam's depth-scaled residual adds (services/engine/beam.py). Its model against transformers is in
test_architectures.py ("beam"); there, in fp32, the adds cannot be told from plain ones: after n adds the stream is
the plain sum over sqrt(n), which every norm reads alike. They are kept for transformers' rounding in low precision,
and their factors are checked here against transformers' own function."""

from __future__ import annotations

import pytest
import torch

from services.engine.model import DecoderLayer
from services.engine.model_config import ModelConfig
from tests.engine.test_architectures import CASES

transformers = pytest.importorskip("transformers")
from transformers.models.beam.modeling_beam import depth_scaled_residual_add  # noqa: E402


@pytest.mark.parametrize("layer", [0, 2])
def test_each_sublayer_joins_the_stream_as_transformers_joins_it(layer):
    config = ModelConfig.from_dict(CASES["beam"]().to_dict() | {"architectures": ["BeamForCausalLM"]})
    (attn_out, attn_stream), (mlp_out, mlp_stream) = DecoderLayer(config, layer).depth_scales
    g = torch.Generator().manual_seed(layer)
    out, stream = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)
    assert torch.equal(out * attn_out + stream * attn_stream, depth_scaled_residual_add(out, stream, 2 * (layer + 1)))
    assert torch.equal(out * mlp_out + stream * mlp_stream, depth_scaled_residual_add(out, stream, 2 * (layer + 1) + 1))


def test_after_n_adds_the_stream_is_the_plain_sum_over_sqrt_n():
    """Why an fp32 oracle cannot tell them apart (the norms are scale-free up to their epsilon)."""
    g = torch.Generator().manual_seed(3)
    x, outs = torch.randn(8, dtype=torch.float64, generator=g), torch.randn(6, 8, dtype=torch.float64, generator=g)
    stream = x
    for n, out in enumerate(outs, start=2):
        stream = depth_scaled_residual_add(out, stream, n)
    assert torch.allclose(stream, (x + outs.sum(0)) / (len(outs) + 1) ** 0.5)
