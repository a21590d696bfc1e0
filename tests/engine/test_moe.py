"""The mixture-of-experts MLP's pieces (services/engine/moe.py); whole models against transformers are in
test_architectures.py."""

from __future__ import annotations

import torch

from services.engine.moe import grouped_mm, looped_mm


def test_grouped_and_looped_matmuls_agree_with_empty_groups_anywhere():
    """Older torch (or an older GPU) runs one matmul per expert; both give each group its own weights."""
    g = torch.Generator().manual_seed(0)
    rows, weights = torch.randn(11, 16, generator=g), torch.randn(5, 16, 8, generator=g)
    offsets = torch.tensor([0, 4, 4, 9, 11], dtype=torch.int32)  # experts 0 and 2 get no rows
    want = torch.cat([rows[0:4] @ weights[1], rows[4:9] @ weights[3], rows[9:11] @ weights[4]])
    assert torch.allclose(grouped_mm(rows, weights, offsets), want, atol=1e-6)
    assert torch.allclose(looped_mm(rows, weights, offsets), want, atol=1e-6)
