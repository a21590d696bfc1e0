"""The mixture-of-experts MLP's pieces (services/engine/moe.py); whole models against transformers are in
test_architectures.py."""

from __future__ import annotations

import pytest
import torch

from services.engine.grouped_mm import grouped_mm, looped_mm
from services.engine.moe import copy_expert, missing_experts


def test_grouped_and_looped_matmuls_agree_with_empty_groups_anywhere():
    """Older torch (or an older GPU) runs one matmul per expert; both give each group its own weights."""
    g = torch.Generator().manual_seed(0)
    rows, weights = torch.randn(11, 16, generator=g), torch.randn(5, 16, 8, generator=g)
    offsets = torch.tensor([0, 4, 4, 9, 11], dtype=torch.int32)  # experts 0 and 2 get no rows
    want = torch.cat([rows[0:4] @ weights[1], rows[4:9] @ weights[3], rows[9:11] @ weights[4]])
    assert torch.allclose(grouped_mm(rows, weights, offsets), want, atol=1e-6)
    assert torch.allclose(looped_mm(rows, weights, offsets), want, atol=1e-6)


def test_expert_weights_land_in_their_slices_and_misfits_are_named():
    stacked = torch.zeros(3, 8, 5)  # 3 experts, gate and up 4 rows each
    copy_expert(stacked, 1, "up", torch.ones(4, 5))
    copy_expert(stacked, 2, "gate", torch.full((4, 5), 2.0))
    assert stacked[1, 4:].eq(1).all() and stacked[1, :4].eq(0).all() and stacked[2, :4].eq(2).all()
    assert missing_experts("l.mlp.experts.gate_up_proj", {(1, "up"), (2, "gate")}, 3) == \
        "l.mlp.experts.gate_up_proj: missing expert 0 gate, expert 0 up, expert 1 gate ... weights"
    with pytest.raises(KeyError, match=r"expert 0 gate weight has shape \(4, 6\); the config implies \(4, 5\)"):
        copy_expert(stacked, 0, "gate", torch.ones(4, 6))
    with pytest.raises(KeyError, match="expert 3 down weight: the config has 3 experts"):
        copy_expert(stacked, 3, "down", torch.ones(8, 5))
