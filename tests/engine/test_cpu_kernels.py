"""The fused C kernels against the torch ops they replace, on random data, and how the library is built."""

from __future__ import annotations

import logging
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from services.engine import cpu_kernels
from services.engine.attention import falcon_alibi_slopes, gather
from services.engine.config import EngineConfig
from services.engine.rope import RotaryEmbedding
from services.engine.runner import ModelRunner

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture(scope="module")
def kernels():
    k = cpu_kernels.load()
    assert k is not None, "cc is on PATH, so the kernels must build"
    return k


def _pool(num_blocks, block_size, kv_heads, head_dim, layers=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn((num_blocks, layers, 2, block_size, kv_heads, head_dim), generator=g)
    return pool[:, 1, 0], pool[:, 1, 1]  # a middle layer: strided views, as the engine's pool hands out


def _reference_decode(q, k_cache, v_cache, tables, lens, window=None, chunk=None):
    block_size = k_cache.shape[1]
    keys = torch.arange(tables.shape[1] * block_size)[None, :]
    mask = (keys < lens[:, None]) & (keys >= lens[:, None] - (window or 1 << 30))
    if chunk is not None:  # the query (at lens - 1) sees its own chunk only
        mask &= keys >= (lens[:, None] - 1) // chunk * chunk
    mask = mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q.unsqueeze(2), gather(k_cache, tables), gather(v_cache, tables),
                                         attn_mask=mask, enable_gqa=True)
    return out.squeeze(2)


# (rows, kv heads, group, head_dim, block size): few rows split by head, many rows one job per row; the
# specialised head sizes (32, 64, 128) and other ones (16, 48).
SHAPES = [(1, 2, 2, 32, 16), (3, 4, 2, 64, 16), (64, 2, 2, 32, 16), (20, 2, 3, 16, 32), (9, 1, 4, 128, 16),
          (12, 8, 1, 48, 32), (16, 8, 8, 128, 16)]


@pytest.mark.parametrize(("window", "chunk"), [(None, None), (1, None), (17, None), (40, None), (None, 1),
                                               (None, 24), (None, 64)])
@pytest.mark.parametrize(("rows", "kv_heads", "group", "head_dim", "block_size"), SHAPES)
def test_paged_decode_matches_gather_and_sdpa(kernels, rows, kv_heads, group, head_dim, block_size, window, chunk):
    """Also with a sliding window: of one token, ending mid-block, spanning block boundaries; and in chunks
    (Llama 4's): of one token, starting mid-block, a block multiple."""
    g = torch.Generator().manual_seed(rows * 7 + head_dim)
    k_cache, v_cache = _pool(256, block_size, kv_heads, head_dim)
    # Contexts from one token to a few blocks, with block boundaries; tables are random blocks of the pool.
    lens = torch.tensor([1, block_size, block_size + 1, 5 * block_size - 1, 300][: rows]
                        + torch.randint(1, 400, (max(0, rows - 5),), generator=g).tolist())
    max_blocks = int(-(-lens.max() // block_size))
    tables = torch.stack([torch.randperm(256, generator=g)[:max_blocks] for _ in range(rows)])
    # q rows strided as in the engine (a slice of the fused q|k|v projection).
    qkv = torch.randn((rows, (kv_heads * group + 2 * kv_heads) * head_dim), generator=g)
    q = qkv[:, : kv_heads * group * head_dim].view(rows, kv_heads * group, head_dim)
    out = torch.full_like(q, float("nan"))
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens, window, chunk=chunk)
    torch.testing.assert_close(out, _reference_decode(q, k_cache, v_cache, tables, lens, window, chunk), atol=2e-6,
                               rtol=1e-5)


def test_a_window_never_reads_the_blocks_before_it(kernels):
    """Blocks wholly before every query's window may be freed and reused: their table entries point at NaNs
    here, and no output sees them (decodes and chunks, the first block of the window entered part way)."""
    g = torch.Generator().manual_seed(5)
    k_cache, v_cache = _pool(16, 16, 2, 32)
    clean_k, clean_v = k_cache.clone(), v_cache.clone()
    k_cache[15] = float("nan")
    v_cache[15] = float("nan")
    tables = torch.tensor([[15, 15, 3, 4, 5], [15, 6, 7, 8, 9]])
    lens, window = torch.tensor([75, 50]), 40  # keys [35, 75) and [10, 50): blocks 2-4 and 0-3
    tables[1, 0] = 0  # the second row's window starts in its first block: a real one
    q = torch.randn(2, 4, 32, generator=g)
    out = torch.empty_like(q)
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens, window)
    torch.testing.assert_close(out, _reference_decode(q, clean_k, clean_v, tables, lens, window), atol=2e-6,
                               rtol=1e-5)
    # Rows see keys from [33, 35) on and [5, 10) on.
    starts, chunk_lens, prefix = torch.tensor([0, 3]), torch.tensor([3, 6]), torch.tensor([72, 44])
    q = torch.randn(9, 4, 32, generator=g)
    out = torch.empty_like(q)
    kernels.paged_prefill(out, q, k_cache, v_cache, starts, chunk_lens, prefix, tables, window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, _reference_chunks(q, clean_k, clean_v, starts, chunk_lens, prefix, tables,
                                                      window), atol=3e-6, rtol=1e-5)


def test_one_long_decode_split_across_heads(kernels):
    """A lone decode of a 5,000-token context: one job per KV head, over 313 scattered blocks."""
    g = torch.Generator().manual_seed(3)
    k_cache, v_cache = _pool(512, 16, 4, 64)
    tables = torch.randperm(512, generator=g)[:313][None]
    lens = torch.tensor([5000])
    q = torch.randn(1, 8, 64, generator=g)
    out = torch.empty_like(q)
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens)
    torch.testing.assert_close(out, _reference_decode(q, k_cache, v_cache, tables, lens), atol=2e-6, rtol=1e-5)


def test_paged_decode_ignores_padding_blocks_and_large_scores(kernels):
    """Rows shorter than the table never read past their context (the padding points at a block of huge
    values), and large logits stay finite (the running max keeps exp in range)."""
    torch.manual_seed(0)  # scores in the hundreds: a rare draw put the 1e-5 tolerance out of reach in CI
    k_cache, v_cache = _pool(8, 16, 2, 32)
    clean_k, clean_v = k_cache.clone(), v_cache.clone()
    k_cache[7] = 1e4
    v_cache[7] = float("nan")
    tables = torch.tensor([[0, 1, 7], [2, 7, 7]])
    lens = torch.tensor([20, 3])
    q = torch.randn(2, 4, 32) * 30  # scores in the hundreds
    out = torch.empty_like(q)
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens)
    assert torch.isfinite(out).all()
    # SDPA multiplies masked NaNs by zero weights, so the reference reads the pool without them.
    torch.testing.assert_close(out, _reference_decode(q, clean_k, clean_v, tables, lens), atol=1e-5, rtol=1e-5)


def _reference_chunks(q, k_cache, v_cache, starts, lens, prefix, tables, window=None, chunk=None):
    block_size, heads, dim = k_cache.shape[1:]
    out = torch.empty_like(q)
    for c in range(len(lens)):
        start, n, p = int(starts[c]), int(lens[c]), int(prefix[c])
        ctx = p + n
        keys = k_cache[tables[c]].reshape(-1, heads, dim)[:ctx].transpose(0, 1)[None]
        values = v_cache[tables[c]].reshape(-1, heads, dim)[:ctx].transpose(0, 1)[None]
        key, query = torch.arange(ctx)[None, :], (p + torch.arange(n))[:, None]
        mask = (key <= query) & (key > query - (window or 1 << 30))
        if chunk is not None:
            mask &= key >= query // chunk * chunk
        rows = q[start : start + n].transpose(0, 1)[None]
        out[start : start + n] = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask,
                                                                enable_gqa=True)[0].transpose(0, 1)
    return out


# (kv heads, group, head_dim, block size; chunks as (cached prefix, chunk tokens)): fresh prompts, chunks after
# prefixes that end mid-block, one token, a chunk over several row tiles (> 64 rows) and key tiles, and head
# sizes that are not a multiple of 16 (the kernel's scalar tail).
CHUNK_CASES = [
    (2, 2, 32, 16, [(0, 128), (0, 128), (0, 1)]),
    (4, 2, 64, 16, [(0, 7), (100, 37), (5, 200), (0, 3)]),
    (2, 3, 16, 32, [(300, 64), (17, 1)]),
    (1, 4, 72, 16, [(64, 65), (0, 150)]),
    (8, 1, 128, 16, [(1000, 70)]),
]


@pytest.mark.parametrize(("window", "chunk"), [(None, None), (1, None), (30, None), (100, None), (None, 1),
                                               (None, 40), (None, 64), (None, 100)])
@pytest.mark.parametrize(("kv_heads", "group", "head_dim", "block_size", "chunks"), CHUNK_CASES)
def test_paged_prefill_matches_gather_and_sdpa(kernels, kv_heads, group, head_dim, block_size, chunks, window,
                                               chunk):
    """Also with sliding windows shorter than a key tile, than a chunk, and starting inside a tile; and with
    attention chunks (Llama 4's) of one token, inside a tile, a tile's size, and across tiles."""
    g = torch.Generator().manual_seed(head_dim + len(chunks))
    k_cache, v_cache = _pool(512, block_size, kv_heads, head_dim)
    prefix = torch.tensor([p for p, _ in chunks])
    lens = torch.tensor([n for _, n in chunks])
    starts = torch.cumsum(lens, 0) - lens + 5  # 5 decode tokens come first in the flat batch
    max_blocks = int(max(-(-(p + n) // block_size) for p, n in chunks))
    tables = torch.stack([torch.randperm(512, generator=g)[:max_blocks] for _ in chunks])
    total = int(starts[-1] + lens[-1])
    qkv = torch.randn((total, (kv_heads * group + 2 * kv_heads) * head_dim), generator=g)
    q = qkv[:, : kv_heads * group * head_dim].view(total, kv_heads * group, head_dim)
    out = torch.full_like(q, float("nan"))
    kernels.paged_prefill(out, q, k_cache, v_cache, starts, lens, prefix, tables, window, chunk=chunk)
    assert torch.isnan(out[:5]).all()  # rows outside the chunks are left alone
    reference = _reference_chunks(q, k_cache, v_cache, starts, lens, prefix, tables, window, chunk)
    torch.testing.assert_close(out[5:], reference[5:], atol=3e-6, rtol=1e-5)


def test_kv_write_matches_index_put(kernels):
    k_cache, v_cache = _pool(16, 16, 2, 32)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(5, 8 * 32)
    k = qkv[:, 4 * 32 : 6 * 32].view(5, 2, 32)
    v = qkv[:, 6 * 32 :].view(5, 2, 32)
    blocks, offsets = torch.tensor([3, 3, 9, 0, 15]), torch.tensor([0, 1, 15, 7, 2])
    ref_k[blocks, offsets] = k
    ref_v[blocks, offsets] = v
    kernels.kv_write(k_cache, v_cache, k, v, blocks, offsets)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_gather_e4m3_widens_every_byte_exactly_from_strided_blocks(kernels):
    """All 256 e4m3 bytes (the two NaNs too) in blocks of a middle layer's strided view, gathered in any order
    and repeated: the floats torch converts them to, as gather()'s torch path gives them."""
    pool = torch.arange(256, dtype=torch.uint8).repeat(6 * 3 * 2).view(6, 3, 2, 16, 2, 8).view(torch.float8_e4m3fn)
    layer = pool[:, 1, 0]
    ids = torch.tensor([4, 0, 5, 4, 2])
    got = kernels.gather_e4m3(layer, ids)
    want = layer[ids].float()
    assert got.dtype == torch.float32 and got.shape == (5, 16, 2, 8)
    assert torch.equal(got.isnan(), want.isnan()) and int(got.isnan().sum()) == 5 * 2
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    scaled = kernels.gather_e4m3(layer, ids, 0.037)  # a checkpoint's calibrated scale: torch's cast, then product
    assert torch.equal(scaled.nan_to_num(), (want * 0.037).nan_to_num())
    tables = ids.view(1, 5)
    for scale in (None, 0.037):
        assert torch.equal(gather(layer, tables, torch.float32, kernels, scale).nan_to_num(),
                           gather(layer, tables, torch.float32, None, scale).nan_to_num())
    with pytest.raises(ValueError, match="outside the pool of 6 blocks"):
        kernels.gather_e4m3(layer, torch.tensor([6]))
    with pytest.raises(ValueError, match="expected a float8_e4m3fn CPU"):
        kernels.gather_e4m3(layer.float(), ids)

@pytest.mark.parametrize("rows", [1, 7, 300])
def test_add_rms_norm_matches_torch(kernels, rows):
    g = torch.Generator().manual_seed(rows)
    x, residual, weight = torch.randn(rows, 96, generator=g), torch.randn(rows, 96, generator=g), torch.rand(96)
    torch.testing.assert_close(kernels.add_rms_norm(x, None, weight, 1e-5), F.rms_norm(x, (96,), weight, 1e-5))
    summed = x + residual
    out = kernels.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(residual, summed)  # updated in place with the same fp32 adds
    torch.testing.assert_close(out, F.rms_norm(summed, (96,), weight, 1e-5))


@pytest.mark.parametrize(("tokens", "heads", "head_dim", "rot"),
                         [(1, 3, 16, 16), (37, 6, 64, 64), (600, 12, 32, 32), (37, 6, 64, 48), (5, 2, 32, 2)])
def test_rope_in_place_matches_rotary_embedding(kernels, tokens, heads, head_dim, rot):
    """``rot`` < head_dim: partial rotary (Phi-4-mini), the other features of each head untouched."""
    g = torch.Generator().manual_seed(tokens)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    freqs = torch.randint(0, 4000, (tokens,), generator=g).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    qkv = torch.randn(tokens, (heads + 2) * head_dim, generator=g)
    x = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    expected = RotaryEmbedding.apply(x.clone(), cos, sin)
    untouched = qkv[:, heads * head_dim :].clone()
    passed = x[..., rot:].clone()
    kernels.rope_(x, cos, sin)
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, heads * head_dim :], untouched) and torch.equal(x[..., rot:], passed)


def test_silu_mul_matches_torch(kernels):
    gate_up = torch.randn(50, 2 * 384) * 4
    gate_up[0, :6] = torch.tensor([0.0, -100.0, 100.0, -88.5, 88.5, -1e-30])
    gate, up = gate_up.split(384, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate) * up, atol=1e-6, rtol=1e-5)


def test_argmax_rows_matches_torch_on_ties_and_nans(kernels):
    x = torch.randn(70, 4096)
    x[1, 10] = x[1, 20] = 1e6  # a tie: the first wins
    x[2, 3000] = float("nan")  # torch's argmax returns a NaN's index
    x[3] = float("-inf")
    x[4, -1] = float("inf")
    strided = torch.randn(5, 2 * 4096)[:, :4096]
    for m in (x, strided, x[:1]):
        assert torch.equal(kernels.argmax_rows(m), m.argmax(dim=-1))


def test_build_is_cached_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAWALL_CACHE_DIR", str(tmp_path))
    first = cpu_kernels._build("cc")
    mtime = first.stat().st_mtime_ns
    assert first.parent == tmp_path / "kernels" and first.suffix == ".so"
    assert cpu_kernels._build("cc") == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    assert list(first.parent.iterdir()) == [first]  # no temp files left behind


def test_no_compiler_or_failed_build_falls_back_with_a_reason(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SEAWALL_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="services.engine.cpu_kernels"):
        assert cpu_kernels.load("/nonexistent/cc") is None
        assert cpu_kernels.load("false") is None  # exits 1 without output: a compiler that fails
    assert "no C compiler '/nonexistent/cc'" in caplog.text
    assert "fused CPU kernels unavailable" in caplog.text and "gather + SDPA" in caplog.text


@pytest.mark.parametrize("enabled", [True, False])
def test_runner_uses_the_kernels_only_when_enabled(tiny_model_dir, enabled):
    runner = ModelRunner(EngineConfig(model=str(tiny_model_dir), device="cpu", kv_cache_bytes=1 << 20,
                                      swap_bytes=0, cpu_kernels=enabled))
    assert (runner.kernels is not None) == enabled


def _capped_reference(q, keys, values, mask, cap):
    """Eager attention with soft-capped scores (transformers' Gemma 2): q [H, D], keys/values [S, Hkv, D]."""
    group = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(group, 1).transpose(0, 1)
    v = values.repeat_interleave(group, 1).transpose(0, 1)
    scores = torch.tanh((q[:, None, :] @ k.transpose(1, 2))[:, 0] * q.shape[-1] ** -0.5 / cap) * cap
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    return (weights[:, None, :] @ v)[:, 0]


@pytest.mark.parametrize("window", [None, 20])
def test_soft_capped_scores_match_eager_attention(kernels, window):
    """Gemma 2's attention soft-cap in the decode and chunk kernels; scores large enough that the cap bites."""
    g = torch.Generator().manual_seed(11)
    k_cache, v_cache = _pool(64, 16, 2, 32)
    tables = torch.randperm(64, generator=g)[:8][None]
    cap = 2.0
    q = torch.randn(1, 4, 32, generator=g) * 10
    out = torch.empty_like(q)
    lens = torch.tensor([100])
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens, window, cap)
    keys, values = (c[tables[0]].reshape(-1, 2, 32)[:100] for c in (k_cache, v_cache))
    seen = torch.arange(100) >= 100 - (window or 100)
    torch.testing.assert_close(out[0], _capped_reference(q[0], keys, values, seen, cap), atol=2e-6, rtol=1e-5)
    q = torch.randn(30, 4, 32, generator=g) * 10  # a 30-token chunk after 70 cached tokens
    out = torch.empty_like(q)
    kernels.paged_prefill(out, q, k_cache, v_cache, torch.tensor([0]), torch.tensor([30]), torch.tensor([70]),
                          tables, window, cap)
    for i in (0, 13, 29):
        pos = 70 + i
        seen = (torch.arange(100) <= pos) & (torch.arange(100) > pos - (window or 1000))
        torch.testing.assert_close(out[i], _capped_reference(q[i], keys, values, seen, cap), atol=3e-6, rtol=1e-5)


def _sink_reference(q, keys, values, seen, sinks):
    """transformers' GPT-OSS eager attention of one query token: the sink joins each head's softmax."""
    group = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(group, 1).transpose(0, 1)
    v = values.repeat_interleave(group, 1).transpose(0, 1)
    scores = ((q[:, None, :] @ k.transpose(1, 2))[:, 0] * q.shape[-1] ** -0.5).masked_fill(~seen, float("-inf"))
    probs = torch.softmax(torch.cat([scores, sinks[:, None]], -1), -1)[:, :-1]
    return (probs[:, None, :] @ v)[:, 0]


@pytest.mark.parametrize("rows", [1, 40])  # one job per KV head, one job per row
@pytest.mark.parametrize("window", [None, 20])
def test_attention_sinks_match_eager_attention(kernels, rows, window):
    """GPT-OSS's sinks in the decode and chunk kernels: one per query head (4 query heads per KV head here, so
    a sink read for the wrong head shows), some above the scores and some below."""
    g = torch.Generator().manual_seed(12)
    k_cache, v_cache = _pool(64, 16, 2, 32)
    tables = torch.randperm(64, generator=g)[:8][None].repeat(rows, 1)
    sinks = torch.tensor([-3.0, 0.0, 2.0, 5.0, 8.0, -1.0, 1.0, 4.0])
    q = torch.randn(rows, 8, 32, generator=g) * 2
    lens = torch.randint(1, 101, (rows,), generator=g)
    out = torch.empty_like(q)
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens, window, None, sinks)
    keys, values = (c[tables[0]].reshape(-1, 2, 32)[:100] for c in (k_cache, v_cache))
    for i in range(rows):
        n = int(lens[i])
        seen = (torch.arange(100) < n) & (torch.arange(100) >= n - (window or n))
        torch.testing.assert_close(out[i], _sink_reference(q[i], keys, values, seen, sinks), atol=2e-6, rtol=1e-5)
    q = torch.randn(30, 8, 32, generator=g) * 2  # a 30-token chunk after 70 cached tokens
    out = torch.empty_like(q)
    kernels.paged_prefill(out, q, k_cache, v_cache, torch.tensor([0]), torch.tensor([30]), torch.tensor([70]),
                          tables[:1], window, None, sinks)
    for i in (0, 13, 29):
        pos = 70 + i
        seen = (torch.arange(100) <= pos) & (torch.arange(100) > pos - (window or 1000))
        torch.testing.assert_close(out[i], _sink_reference(q[i], keys, values, seen, sinks), atol=3e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="8 contiguous fp32 CPU sinks"):
        kernels.paged_decode(out[:1], q[:1], k_cache, v_cache, tables[:1], lens[:1], None, None, sinks[:4])


def _alibi_reference(q, keys, values, seen, slopes):
    """transformers' BLOOM attention of one query token: each head's scores plus slope * the key's position (the
    kernels' slope * (key - query) differs by a constant per row, which the softmax takes out)."""
    group = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(group, 1).transpose(0, 1)
    v = values.repeat_interleave(group, 1).transpose(0, 1)
    bias = slopes[:, None] * torch.arange(keys.shape[0])[None, :]
    scores = (q[:, None, :] @ k.transpose(1, 2))[:, 0] * q.shape[-1] ** -0.5 + bias
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1)
    return (probs[:, None, :] @ v)[:, 0]


@pytest.mark.parametrize("rows", [1, 40])  # one job per KV head, one job per row
def test_alibi_matches_biased_attention(kernels, rows):
    """ALiBi's slopes in the decode and chunk kernels: one per query head (4 query heads per KV head here, so a
    slope read for the wrong head shows), steep enough that the bias decides the attention."""
    g = torch.Generator().manual_seed(13)
    k_cache, v_cache = _pool(64, 16, 2, 32)
    tables = torch.randperm(64, generator=g)[:8][None].repeat(rows, 1)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625, 1.0, 0.03125, 0.375, 0.0])
    q = torch.randn(rows, 8, 32, generator=g) * 2
    lens = torch.randint(1, 101, (rows,), generator=g)
    out = torch.empty_like(q)
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens, alibi=slopes)
    keys, values = (c[tables[0]].reshape(-1, 2, 32)[:100] for c in (k_cache, v_cache))
    for i in range(rows):
        n = int(lens[i])
        want = _alibi_reference(q[i], keys, values, torch.arange(100) < n, slopes)
        torch.testing.assert_close(out[i], want, atol=3e-6, rtol=1e-5)
    q = torch.randn(30, 8, 32, generator=g) * 2  # a 30-token chunk after 70 cached tokens
    out = torch.empty_like(q)
    kernels.paged_prefill(out, q, k_cache, v_cache, torch.tensor([0]), torch.tensor([30]), torch.tensor([70]),
                          tables[:1], alibi=slopes)
    for i in (0, 13, 29):
        want = _alibi_reference(q[i], keys, values, torch.arange(100) <= 70 + i, slopes)
        torch.testing.assert_close(out[i], want, atol=3e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="8 contiguous fp32 CPU ALiBi slopes"):
        kernels.paged_decode(out[:1], q[:1], k_cache, v_cache, tables[:1], lens[:1], alibi=slopes[:4])


def test_falcon_rw_alibi_matches_its_bf16_biased_attention(kernels):
    """Falcon-RW's biases (``alibi_bf16``) in the decode and chunk kernels: transformers' bf16(bf16(slope) *
    position) / sqrt(D) by the key's absolute position, past 256 positions, where bf16 rounds the products unevenly
    (a relative bias rounded alike differs)."""
    g = torch.Generator().manual_seed(17)
    k_cache, v_cache = _pool(48, 16, 2, 32)
    tables = torch.randperm(48, generator=g)[:40][None].repeat(3, 1)
    slopes = falcon_alibi_slopes(8)  # 2^-1 ... 2^-8, bf16 values
    bias = (slopes.bfloat16()[:, None] * torch.arange(640)[None, :]).float() / math.sqrt(32)
    keys, values = (c[tables[0]].reshape(-1, 2, 32) for c in (k_cache, v_cache))

    def reference(q, seen):
        k, v = keys.repeat_interleave(4, 1).transpose(0, 1), values.repeat_interleave(4, 1).transpose(0, 1)
        scores = (q[:, None, :] @ k.transpose(1, 2))[:, 0] * 32**-0.5 + bias
        return (torch.softmax(scores.masked_fill(~seen, float("-inf")), -1)[:, None, :] @ v)[:, 0]

    q = torch.randn(3, 8, 32, generator=g) * 2
    lens = torch.tensor([300, 517, 640])
    out = torch.empty_like(q)
    kernels.paged_decode(out, q, k_cache, v_cache, tables, lens, alibi=slopes, alibi_bf16=True)
    for i in range(3):
        torch.testing.assert_close(out[i], reference(q[i], torch.arange(640) < lens[i]), atol=3e-6, rtol=1e-5)
    q = torch.randn(40, 8, 32, generator=g) * 2  # a 40-token chunk after 560 cached tokens
    out = torch.empty_like(q)
    kernels.paged_prefill(out, q, k_cache, v_cache, torch.tensor([0]), torch.tensor([40]), torch.tensor([560]),
                          tables[:1], alibi=slopes, alibi_bf16=True)
    for i in (0, 17, 39):
        torch.testing.assert_close(out[i], reference(q[i], torch.arange(640) <= 560 + i), atol=3e-6, rtol=1e-5)
