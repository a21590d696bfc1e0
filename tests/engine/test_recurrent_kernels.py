"""The linear-attention kernels (services/engine/cpu_kernels/recurrent.c) against the torch ops they replace: the
short convolution over a step's groups of sequences, and Gated DeltaNet's delta rule, a decode's and a prompt
chunk's, with their states updated in place in the slots named and nowhere else."""

from __future__ import annotations

import shutil

import pytest
import torch

from services.engine import cpu_kernels
from services.engine.gated_delta_net import chunked_delta_rule, recurrent_step
from services.engine.linear_attention_config import LinearAttentionShape, ShortConvShape
from services.engine.recurrent_state import RecurrentBatch, RecurrentStates, SpanGroup
from services.engine.short_conv import causal_conv

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def kernels():
    k = cpu_kernels.load()
    assert k is not None, "cc is on PATH, so the kernels must build"
    return k


def _groups(spans: list[tuple[int, int]], save_to: dict[int, int] | None = None) -> list[SpanGroup]:
    """(count, length) per group, slots numbered from 1 (row 0 stays a bystander), the first group decodes and
    the rest prompt chunks; ``save_to``: group -> row."""
    groups, start, slot = [], 0, 1
    for i, (count, length) in enumerate(spans):
        row = (save_to or {}).get(i)
        groups.append(SpanGroup(start, count, length, torch.arange(slot, slot + count),
                                None if row is None else torch.tensor([row]), prefill=i > 0))
        start, slot = start + count * length, slot + count
    return groups


# Decodes, a run of equal chunks, a long chunk that saves its state to a checkpoint row.
SPANS = [(5, 1), (2, 7), (1, 70)]


@pytest.mark.parametrize("kernel", [3, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("silu", [True, False])
def test_causal_conv_matches_torch_conv1d(kernels, kernel, bias, silu):
    channels = 80  # a 64-channel block and a part one
    g = torch.Generator().manual_seed(kernel)
    states = RecurrentStates(ShortConvShape(channels, kernel, bias), 1, torch.float32, CPU, capacity=12)
    states.conv[0].copy_(torch.randn(states.conv[0].shape, generator=g))
    groups = _groups(SPANS, save_to={2: 11})
    tokens = sum(c * n for c, n in SPANS)
    x = torch.randn(tokens, 2 * channels, generator=g)[:, channels:]  # strided rows, as a projection's split
    weight = torch.randn(channels, 1, kernel, generator=g)
    b = torch.randn(channels, generator=g) if bias else None
    before = states.conv[0].clone()

    got = causal_conv(x, RecurrentBatch(states, groups), 0, weight, b, silu, kernels=kernels)
    torch_states = RecurrentStates(ShortConvShape(channels, kernel, bias), 1, torch.float32, CPU, capacity=12)
    torch_states.conv[0].copy_(before)
    want = causal_conv(x, RecurrentBatch(torch_states, groups), 0, weight, b, silu)

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states.conv[0], torch_states.conv[0])
    assert torch.equal(states.conv[0][11], states.conv[0][8])  # the long chunk's window, saved to its row
    assert torch.equal(states.conv[0][0], before[0]) and torch.equal(states.conv[0][9:11], before[9:11])


def _by_recurrent_steps(q, k, v, g, beta, states, groups):
    """transformers' recurrent kernel, one token at a time per sequence, q/k repeated for each value head."""
    r = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
    out = torch.empty(v.shape)
    for grp in groups:
        for s, slot in enumerate(grp.slots.tolist()):
            state = states[slot][None]
            for t in range(grp.length):
                row = grp.start + s * grp.length + t
                one = slice(row, row + 1)
                o, state = recurrent_step(q[one], k[one], v[one], g[one], beta[one], state)
                out[row] = o[0]
            states[slot] = state[0]
    return out


@pytest.mark.parametrize(("key_heads", "value_heads", "dk", "dv"), [
    (2, 4, 32, 32),  # Qwen3.5-small's heads: one 32-column tile
    (1, 2, 128, 128),  # Qwen3-Next's: four tiles over a 64 KB state
    (2, 2, 16, 48),  # a whole tile and a 16-column one
    (1, 3, 7, 20),  # an odd key dim and a narrow tile: the plain loops
])
def test_gated_delta_matches_transformers_recurrent_kernel(kernels, key_heads, value_heads, dk, dv):
    gen = torch.Generator().manual_seed(dk + dv)
    groups = _groups(SPANS, save_to={2: 11})
    n = sum(c * t for c, t in SPANS)
    width = 2 * key_heads * dk + value_heads * dv
    mixed = torch.randn(n, width + 3, generator=gen)[:, :width]  # q, k, v side by side, rows strided
    q = mixed[:, : key_heads * dk].view(n, key_heads, dk)
    k = mixed[:, key_heads * dk : 2 * key_heads * dk].view(n, key_heads, dk)
    v = mixed[:, 2 * key_heads * dk :].view(n, value_heads, dv)
    g = -torch.rand(n, value_heads, generator=gen) * 2  # log decays
    beta = torch.rand(n, value_heads, generator=gen)
    states = torch.randn(12, value_heads, dk, dv, generator=gen) * 0.1
    want_states = states.clone()

    out = torch.empty(n, value_heads, dv)
    for grp in groups:
        kernels.gated_delta_(out[grp.tokens], q[grp.tokens], k[grp.tokens], v[grp.tokens], g[grp.tokens],
                             beta[grp.tokens], states, grp.slots, grp.length, 1e-6)
        RecurrentBatch.save(states, grp)
    want = _by_recurrent_steps(q, k, v, g, beta, want_states, groups)

    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(states[:9], want_states[:9], rtol=1e-4, atol=1e-5)
    assert torch.equal(states[11], states[8])  # the long chunk's state, saved to its row
    assert torch.equal(states[9:11], want_states[9:11])  # rows no group names are untouched


def test_a_prompt_chunk_reaches_the_chunked_forms_state(kernels):
    """The kernel takes a prompt token by token; transformers' prefill takes the chunked form: the same state
    and outputs, to fp32 rounding, over 150 tokens (past two of the form's 64-token blocks)."""
    gen = torch.Generator().manual_seed(3)
    n, heads, dk, dv = 150, 4, 32, 32
    q, k = torch.randn(n, heads, dk, generator=gen), torch.randn(n, heads, dk, generator=gen)
    v = torch.randn(n, heads, dv, generator=gen)
    g, beta = -torch.rand(n, heads, generator=gen), torch.rand(n, heads, generator=gen)
    start = torch.randn(1, heads, dk, dv, generator=gen) * 0.1
    want_out, want_state = chunked_delta_rule(q[None], k[None], v[None], g[None], beta[None], start)
    states, out = start.clone(), torch.empty(n, heads, dv)
    kernels.gated_delta_(out, q, k, v, g, beta, states, torch.tensor([0]), n, 1e-6)
    torch.testing.assert_close(out, want_out[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states, want_state, rtol=1e-4, atol=1e-4)


def test_what_the_kernels_would_write_out_of_bounds_is_refused(kernels):
    states = torch.zeros(2, 2, 8, 8)
    q = k = torch.randn(1, 2, 8)
    v, out = torch.randn(1, 2, 8), torch.empty(1, 2, 8)
    g = beta = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="outside the pool's 2 rows"):
        kernels.gated_delta_(out, q, k, v, g, beta, states, torch.tensor([2]), 1, 1e-6)
    with pytest.raises(ValueError, match="value heads a multiple of key heads"):
        kernels.gated_delta_(out, q, k, v, g, beta, states, torch.tensor([0, 1]), 1, 1e-6)  # 2 x 1 rows, not 1
    with pytest.raises(ValueError, match="contiguous states"):
        kernels.gated_delta_(out, q, k, v, g, beta, states.double(), torch.tensor([0]), 1, 1e-6)
    windows = torch.zeros(2, 8, 3)
    x = torch.randn(1, 8)
    with pytest.raises(ValueError, match="outside the pool's 2 rows"):
        kernels.causal_conv_(torch.empty(1, 8), x, windows, torch.tensor([-1]), 1, torch.randn(8, 1, 4), None, True)
    with pytest.raises(ValueError, match=r"windows \[rows, 8, 4\]"):
        kernels.causal_conv_(torch.empty(1, 8), x, windows, torch.tensor([0]), 1, torch.randn(8, 1, 5), None, True)
    with pytest.raises(ValueError, match="contiguous weight"):
        kernels.causal_conv_(torch.empty(1, 8), x, windows, torch.tensor([0]), 1, torch.randn(8, 1, 4).double(), None,
                             True)


def test_gated_delta_net_layers_take_the_kernels_with_them(kernels):
    """The same layer, with the kernels and without, on the same states: the same outputs and states (to fp32
    rounding), a decode group and a prompt chunk group."""
    from services.engine.attention import AttentionBatch
    from services.engine.gated_delta_net import GatedDeltaNet
    from services.engine.model_config import ModelConfig

    shape = LinearAttentionShape(2, 4, 32, 32, 4, grouped_projections=False)
    config = ModelConfig.from_dict({
        "architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 128,
        "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4})
    assert config.linear_attention == shape
    torch.manual_seed(0)
    layer = GatedDeltaNet(config, 0)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    groups = _groups([(3, 1), (2, 9)])
    x = torch.randn(3 + 18, 64)
    outs, pools = [], []
    for with_kernels in (kernels, None):
        states = RecurrentStates(shape, 1, torch.float32, CPU, capacity=8)
        torch.manual_seed(1)
        states.conv[0].normal_()
        states.ssm[0].normal_(std=0.1)
        batch = AttentionBatch(None, None, kernels=with_kernels)
        batch.recurrent = RecurrentBatch(states, groups)
        with torch.no_grad():
            outs.append(layer(x, None, None, batch, None, None))
        pools.append((states.conv[0], states.ssm[0]))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pools[0][0], pools[1][0])
    torch.testing.assert_close(pools[0][1], pools[1][1], rtol=1e-4, atol=1e-5)


def _mamba2_inputs(n, heads, groups, head_dim, size, seed):
    gen = torch.Generator().manual_seed(seed)
    width = heads * head_dim + 2 * groups * size
    xbc = torch.randn(n, width + 5, generator=gen)[:, :width]  # x, B, C side by side, rows strided
    x = xbc[:, : heads * head_dim].view(n, heads, head_dim)
    b = xbc[:, heads * head_dim : heads * head_dim + groups * size].view(n, groups, size)
    c = xbc[:, heads * head_dim + groups * size :].view(n, groups, size)
    dt = torch.randn(n, heads + 2, generator=gen)[:, :heads]  # a split of the input projection, before softplus
    a = -torch.rand(heads, generator=gen) * 4
    d, dt_bias = torch.randn(heads, generator=gen), torch.randn(heads, generator=gen)
    return x, b, c, dt, a, d, dt_bias


@pytest.mark.parametrize(("heads", "groups", "head_dim", "size"), [
    (4, 2, 16, 16),  # the oracle checkpoints' scale: one row tile
    (2, 1, 40, 128),  # Granite 4.0-H's state size; two whole row tiles and a part one
])
def test_mamba2_scan_matches_transformers_recurrent_step(kernels, heads, groups, head_dim, size):
    from services.engine.mamba2 import recurrent_step

    groups_ = _groups(SPANS, save_to={2: 11})
    n = sum(c * t for c, t in SPANS)
    x, b, c, dt, a, d, dt_bias = _mamba2_inputs(n, heads, groups, head_dim, size, seed=head_dim)
    states = torch.randn(12, heads, head_dim, size, generator=torch.Generator().manual_seed(1)) * 0.1
    want_states = states.clone()
    y = torch.empty(n, heads, head_dim)
    for grp in groups_:
        span = grp.tokens
        kernels.mamba2_scan_(y[span], x[span], b[span], c[span], dt[span], a, d, dt_bias, states, grp.slots,
                             grp.length, None)
        RecurrentBatch.save(states, grp)
    want = torch.empty(n, heads, head_dim)
    for grp in groups_:
        for s, slot in enumerate(grp.slots.tolist()):
            state = want_states[slot][None]
            for t in range(grp.length):
                one = slice(grp.start + s * grp.length + t, grp.start + s * grp.length + t + 1)
                out, state = recurrent_step(x[one], b[one], c[one], dt[one], a, d, dt_bias, state)
                want[one] = out
            want_states[slot] = state[0]
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(states[:9], want_states[:9], rtol=1e-4, atol=1e-5)
    assert torch.equal(states[11], states[8]) and torch.equal(states[9:11], want_states[9:11])


def test_a_mamba2_prompt_reaches_the_chunked_scans_state_with_its_dt_limit(kernels):
    """A prompt chunk with dt clamped (a checkpoint's time_step_limit, which transformers applies in its chunked
    scan only): the kernel's token-by-token scan reaches the dual form's outputs and state."""
    from services.engine.mamba2 import chunk_scan

    n, heads, groups, head_dim, size = 70, 4, 2, 16, 32
    x, b, c, dt, a, d, dt_bias = _mamba2_inputs(n, heads, groups, head_dim, size, seed=7)
    start = torch.randn(1, heads, head_dim, size, generator=torch.Generator().manual_seed(2)) * 0.1
    limit = (0.1, 0.6)  # both ends bind on these dt
    want_y, want_state = chunk_scan(x[None], b[None], c[None], dt[None], a, d, dt_bias, start, 32, limit)
    states, y = start.clone(), torch.empty(n, heads, head_dim)
    kernels.mamba2_scan_(y, x, b, c, dt, a, d, dt_bias, states, torch.tensor([0]), n, limit)
    torch.testing.assert_close(y, want_y[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states, want_state, rtol=1e-4, atol=1e-4)
    unclamped = torch.empty(n, heads, head_dim)
    kernels.mamba2_scan_(unclamped, x, b, c, dt, a, d, dt_bias, start.clone(), torch.tensor([0]), n, None)
    assert not torch.allclose(unclamped, want_y[0], rtol=1e-3, atol=1e-3)  # the limit mattered


@pytest.mark.parametrize(("channels", "size"), [(24, 8), (40, 16)])  # a whole 16-channel tile and a part one
def test_mamba1_scan_matches_transformers_selective_scan(kernels, channels, size):
    """Jamba's Mamba: decodes against transformers' selective state update, prompt chunks against its
    token-by-token scan, states in place (a checkpoint row saved, rows no group names untouched)."""
    from services.engine.mamba1 import recurrent_step, sequential_scan

    gen = torch.Generator().manual_seed(channels)
    groups = _groups(SPANS, save_to={2: 11})
    n = sum(c * t for c, t in SPANS)
    xz = torch.randn(n, 2 * channels, generator=gen)
    x, z = xz[:, :channels].contiguous(), xz[:, channels:]  # z: the second half of the input projection
    dt = torch.randn(n, channels, generator=gen)
    b, c = torch.randn(n, size, generator=gen), torch.randn(n, size, generator=gen)
    a = -torch.rand(channels, size, generator=gen) * 3
    d, dt_bias = torch.randn(channels, generator=gen), torch.randn(channels, generator=gen)
    states = torch.randn(12, channels, size, generator=gen) * 0.1
    want_states = states.clone()
    y = torch.empty(n, channels)
    for grp in groups:
        span = grp.tokens
        kernels.mamba1_scan_(y[span], x[span], dt[span], z[span], b[span], c[span], a, d, dt_bias, states,
                             grp.slots, grp.length)
        RecurrentBatch.save(states, grp)
    want = torch.empty(n, channels)
    for grp in groups:
        span, state = grp.tokens, want_states.index_select(0, grp.slots)
        parts = (x[span], dt[span], b[span], c[span], z[span])
        if grp.length == 1:
            out, state = recurrent_step(*parts, a, d, dt_bias, state)
        else:
            out, state = sequential_scan(*(t.unflatten(0, (grp.count, grp.length)) for t in parts), a, d, dt_bias,
                                         state)
        want[span] = out.reshape(-1, channels)
        want_states[grp.slots] = state
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(states[:9], want_states[:9], rtol=1e-4, atol=1e-5)
    assert torch.equal(states[11], states[8]) and torch.equal(states[9:11], want_states[9:11])


@pytest.mark.parametrize(("heads", "d"), [(2, 32), (1, 128), (2, 48), (3, 20)])  # one tile, four, one and a half
def test_kda_matches_transformers_recurrent_and_chunked_forms(kernels, heads, d):
    """Kimi Delta Attention over decodes, equal chunks and a long chunk (saved to a checkpoint row), from strided
    q|k|v rows as the layer's convolution leaves them: transformers' recurrent steps to fp32 rounding; and a
    150-token prompt against the chunked form."""
    from services.engine.kda import chunked_delta_rule as kda_chunked
    from services.engine.kda import recurrent_step as kda_step

    gen = torch.Generator().manual_seed(heads * d)
    groups = _groups(SPANS, save_to={2: 11})
    n = sum(c * t for c, t in SPANS)
    q, k, v = torch.randn(n, 3, heads, d, generator=gen).unbind(1)  # rows 3 x heads x d apart
    g = -torch.rand(n, heads, d, generator=gen) * 0.5  # a log decay per key channel
    beta = torch.rand(n, heads, generator=gen)
    states = torch.randn(12, heads, d, d, generator=gen) * 0.1
    want_states, out = states.clone(), torch.empty(n, heads, d)
    for grp in groups:
        kernels.kda_(out[grp.tokens], q[grp.tokens], k[grp.tokens], v[grp.tokens], g[grp.tokens], beta[grp.tokens],
                     states, grp.slots, grp.length, 1e-6)
        RecurrentBatch.save(states, grp)
    want = torch.empty(n, heads, d)
    for grp in groups:
        state = want_states[grp.slots]
        for t in range(grp.length):
            rows = grp.tokens.start + torch.arange(grp.count) * grp.length + t
            want[rows], state = kda_step(q[rows], k[rows], v[rows], g[rows], beta[rows], state)
        want_states[grp.slots] = state
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(states[:9], want_states[:9], rtol=1e-4, atol=1e-5)
    assert torch.equal(states[11], states[8]) and torch.equal(states[9:11], want_states[9:11])

    start = torch.randn(1, heads, d, d, generator=gen) * 0.1
    q, k, v = torch.randn(150, 3, heads, d, generator=gen).unbind(1)
    g, beta = -torch.rand(150, heads, d, generator=gen) * 0.5, torch.rand(150, heads, generator=gen)
    want_out, want_state = kda_chunked(q[None], k[None], v[None], g[None], beta[None], start)
    state, out = start.clone(), torch.empty(150, heads, d)
    kernels.kda_(out, q, k, v, g, beta, state, torch.tensor([0]), 150, 1e-6)
    torch.testing.assert_close(out, want_out[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, want_state, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="outside the pool's 1 rows"):
        kernels.kda_(out, q, k, v, g, beta, state, torch.tensor([1]), 150, 1e-6)
    with pytest.raises(ValueError, match="of one shape at one stride"):
        kernels.kda_(out, q, k, v.contiguous(), g, beta, state, torch.tensor([0]), 150, 1e-6)
