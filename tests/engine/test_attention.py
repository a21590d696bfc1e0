"""The written-out attention (soft-capped scores, attention sinks) against its one-shot form: queries in tiles
give the same outputs, whatever the mask."""

from __future__ import annotations

import pytest
import torch

from services.engine import attention


@pytest.mark.parametrize("case", ["causal", "mask", "decode"])
def test_eager_attention_in_query_tiles_matches_one_tile(monkeypatch, case):
    g = torch.Generator().manual_seed(5)
    rows, keys = (24, 24) if case == "causal" else (1, 40) if case == "decode" else (24, 40)
    q = torch.randn(2, 4, rows, 16, generator=g)
    k, v = (torch.randn(2, 2, keys, 16, generator=g) for _ in range(2))
    mask = None
    if case == "mask":  # a chunk after 16 cached keys, in a window of 10
        pos, key = 16 + torch.arange(rows)[:, None], torch.arange(keys)[None, :]
        mask = (key <= pos) & (key > pos - 10)
    elif case == "decode":
        mask = (torch.arange(keys) < 33)[None, None, None, :].expand(2, 1, 1, keys)
    sinks = torch.tensor([0.5, 3.0, -2.0, 1.0])
    whole = attention._sdpa(q, k, v, mask, 3.0, sinks, causal=case == "causal")
    monkeypatch.setattr(attention, "EAGER_SCORES", 2 * 4 * keys * 5)  # tiles of 5 query rows
    tiled = attention._sdpa(q, k, v, mask, 3.0, sinks, causal=case == "causal")
    torch.testing.assert_close(tiled, whole, atol=0, rtol=0)
    # The sinks only lower each head's weights: without them, the same scores give other outputs.
    assert not torch.allclose(attention._sdpa(q, k, v, mask, 3.0, None, causal=case == "causal"), whole)
