"""Gated DeltaNet's two forms (services/engine/gated_delta_net.py) against each other and against the delta rule
written out token by token: the chunked form over any split of a sequence reaches the state (and outputs) of one
recurrent step per token."""

from __future__ import annotations

import torch

from services.engine.gated_delta_net import chunked_delta_rule, l2_normalize, recurrent_step

HEADS, DK, DV = 3, 8, 5


def _inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, HEADS, DK, generator=g), torch.randn(n, HEADS, DK, generator=g)
    v = torch.randn(n, HEADS, DV, generator=g)
    decay = -torch.rand(n, HEADS, generator=g)  # log of a decay in (e^-1, 1]
    beta = torch.rand(n, HEADS, generator=g)
    return q, k, v, decay, beta


def _by_definition(q, k, v, decay, beta, state):
    """S = S * exp(g); S += k ⊗ beta (v - Sᵀk); out = Sᵀq, on l2-normed q/k and q over sqrt(Dk)."""
    q, k = l2_normalize(q) / DK**0.5, l2_normalize(k)
    outs = []
    for t in range(q.shape[0]):
        state = state * decay[t].exp()[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", state, k[t])
        state = state + torch.einsum("hk,hv->hkv", k[t], beta[t][:, None] * (v[t] - predicted))
        outs.append(torch.einsum("hkv,hk->hv", state, q[t]))
    return torch.stack(outs), state


def test_one_recurrent_step_per_token_is_the_delta_rule():
    q, k, v, decay, beta = _inputs(9)
    state = torch.randn(HEADS, DK, DV)
    want_out, want_state = _by_definition(q, k, v, decay, beta, state)
    outs = []
    for t in range(9):
        out, state = recurrent_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], decay[t:t + 1], beta[t:t + 1], state[None])
        outs.append(out[0])
        state = state[0]
    torch.testing.assert_close(torch.stack(outs), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)


def test_the_chunked_form_over_any_split_reaches_the_same_state():
    """150 tokens (past two of the form's 64-token blocks) whole, and as chunks of 1, 63 and 86 carrying the
    state between them, from a state left by earlier tokens."""
    q, k, v, decay, beta = _inputs(150, seed=1)
    start = torch.randn(HEADS, DK, DV) * 0.1
    want_out, want_state = _by_definition(q, k, v, decay, beta, start)
    out, state = chunked_delta_rule(q[None], k[None], v[None], decay[None], beta[None], start[None])
    torch.testing.assert_close(out[0], want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state[0], want_state, rtol=1e-4, atol=1e-4)
    state, outs = start[None], []
    for a, b in ((0, 1), (1, 64), (64, 150)):
        o, state = chunked_delta_rule(q[None, a:b], k[None, a:b], v[None, a:b], decay[None, a:b], beta[None, a:b],
                                      state)
        outs.append(o[0])
    torch.testing.assert_close(torch.cat(outs), want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state[0], want_state, rtol=1e-4, atol=1e-4)


def test_a_batch_of_chunks_keeps_sequences_apart():
    """Three sequences' 70-token chunks as one batch, each after a state of its own: each as if run alone."""
    inputs = [_inputs(70, seed=s) for s in (4, 5, 6)]
    starts = torch.randn(3, HEADS, DK, DV) * 0.1
    out, states = chunked_delta_rule(*(torch.stack(parts) for parts in zip(*inputs, strict=True)), starts)
    for i, one in enumerate(inputs):
        want_out, want_state = _by_definition(*one, starts[i])
        torch.testing.assert_close(out[i], want_out, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(states[i], want_state, rtol=1e-4, atol=1e-4)


def test_a_batch_of_recurrent_steps_keeps_sequences_apart():
    q, k, v, decay, beta = _inputs(4, seed=2)
    states = torch.randn(4, HEADS, DK, DV)
    out, new = recurrent_step(q, k, v, decay, beta, states)
    for i in range(4):
        one_out, one_state = recurrent_step(q[i:i + 1], k[i:i + 1], v[i:i + 1], decay[i:i + 1], beta[i:i + 1],
                                            states[i:i + 1])
        torch.testing.assert_close(out[i], one_out[0])
        torch.testing.assert_close(new[i], one_state[0])
