"""Turns one step's logits into one token per row, following each row's ``SamplingParams``.

Pipeline, per row (rows are batched; only seeded draws loop in Python)::

    raw logits --log_softmax--> logprobs (of the raw model distribution, as vLLM v1 reports them)
        |
        +-> grammar mask (structured output) and allowed_token_ids (others -inf), bad_words (-inf)
            -> logit_bias (added; Hugging Face applies sequence_bias first too)
            -> repetition penalty (prompt + output ids) -> presence/frequency penalty (output ids)
            -> min_tokens: eos + stop_token_ids set to -inf while len(output) < min_tokens
            -> greedy rows: argmax
            -> sampled rows: / temperature -> top-k -> top-p -> min-p -> softmax
                             -> argmax(probs / Exp(1) noise)   (the exponential race)
        a row whose constraints ruled out every token picks a -inf logit: reported (``no_token``), not used

A seeded row draws its noise from a fresh ``torch.Generator`` seeded from ``(seed, len(output))``, so the
k-th output token depends only on the seed, k and that row's logits: not on the batch around it, on
preemption (recompute replays the same steps) or on the process.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from services.common.sampling_params import SamplingParams

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels

_MASK64 = (1 << 64) - 1


@dataclass
class SamplingRow:
    """One row of the logits: the request's params and its tokens so far (before this step's token)."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    # Structured output: the tokens the grammar allows next, as llguidance's bitmask (int32, bit t % 32 of word
    # t // 32 = token t); None = unconstrained (services/engine/grammar.py).
    token_mask: torch.Tensor | None = None
    # bad_words as token sequences (services/engine/bad_words.py): a sequence's last token is banned where the
    # output ends with the rest.
    bad_words: tuple[tuple[int, ...], ...] = ()


@dataclass
class TokenLogprobs:
    """Logprobs of the raw model distribution for one sampled token."""

    token_id: int
    logprob: float
    # 1 + the number of tokens strictly more likely than the sampled one (1 = best).
    rank: int
    # The params.logprobs most likely (token id, logprob), best first; empty when params.logprobs == 0.
    top: list[tuple[int, float]]


@dataclass
class SamplerOutput:
    """``token_ids[i]`` is row i's new token; ``logprobs[i]`` is None unless row i asked for logprobs.
    ``no_token``: rows whose constraints left no token possible (their entry in ``token_ids`` means nothing),
    e.g. ``allowed_token_ids`` that the grammar never allows, or only end tokens while ``min_tokens`` holds."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    no_token: list[int] = field(default_factory=list)


def step_seed(seed: int, step: int) -> int:
    """The generator seed for output token number ``step`` (0-based) of a request seeded with ``seed``.

    ``seed * 1_000_003 + step`` mixed by the splitmix64 finaliser and folded into 63 bits, so nearby
    (seed, step) pairs give unrelated generator states.
    """
    x = (seed * 1_000_003 + step + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


class Sampler:
    """Stateless: call it with a step's logits and the rows they belong to. ``kernels``: the fused CPU kernels,
    whose argmax serves all-greedy fp32 steps on the CPU (torch's argmax over [64, 4096] took ~120 us here)."""

    def __init__(self, kernels: CpuKernels | None = None) -> None:
        self.kernels = kernels

    def __call__(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        eos_token_ids: Collection[int] = (),
    ) -> SamplerOutput:
        """Sample one token per row of ``logits`` ([len(rows), vocab], any float dtype; math in fp32)."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [num_rows={len(rows)}, vocab], got {tuple(logits.shape)}")
        n = len(rows)
        if n == 0:
            return SamplerOutput([], [])
        if all(_is_plain_greedy(r) for r in rows):
            return SamplerOutput(self._argmax(logits).tolist(), [None] * n)

        x = logits.to(torch.float32, copy=True)
        want = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        # Logprobs are of the raw distribution, so they are taken before any processing.
        raw_logprobs = torch.log_softmax(x[_index(want, x.device)], dim=-1) if want else None
        _constrain_tokens(x, rows)
        _apply_penalties(x, rows)
        _suppress_stops(x, rows, eos_token_ids)

        tokens = torch.empty(n, dtype=torch.long, device=x.device)
        greedy = [i for i, r in enumerate(rows) if r.params.is_greedy]
        sampled = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if len(greedy) == n:  # e.g. greedy rows under a grammar or logit_bias: no row copies
            tokens = self._argmax(x)
        elif greedy:
            idx = _index(greedy, x.device)
            tokens[idx] = x[idx].argmax(dim=-1)
        if sampled:
            idx = _index(sampled, x.device)
            tokens[idx] = _sample(x[idx], [rows[i] for i in sampled])
        token_list = tokens.tolist()
        logprobs: list[TokenLogprobs | None] = [None] * n
        if raw_logprobs is not None:
            _fill_logprobs(logprobs, raw_logprobs, want, tokens, rows)
        return SamplerOutput(token_list, logprobs, _no_token(x, tokens))


    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        fused = self.kernels is not None and logits.dtype == torch.float32 and logits.device.type == "cpu"
        return self.kernels.argmax_rows(logits) if fused else logits.argmax(dim=-1)


def _is_plain_greedy(row: SamplingRow) -> bool:
    p = row.params
    return (
        p.is_greedy
        and not p.has_penalties
        and not p.constrains_tokens
        and row.token_mask is None
        and p.logprobs is None
        and len(row.output_token_ids) >= p.min_tokens
    )


def _index(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long, device=device)


def _flat_ids(
    per_row: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) pairs for ``tensor[rows, cols]`` indexing of ragged per-row id lists."""
    lengths = torch.tensor([len(ids) for ids in per_row], dtype=torch.long)
    row_idx = torch.repeat_interleave(torch.arange(len(per_row)), lengths).to(device)
    cols = torch.tensor([t for ids in per_row for t in ids], dtype=torch.long, device=device)
    return row_idx, cols


def _constrain_tokens(x: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """A grammar's mask and allowed_token_ids (every other logit -inf), bad_words (their banned tokens -inf), then
    logit_bias (added), in place on fp32 logits. Token ids are checked against the vocabulary at admission
    (``SamplingParams.check_vocab``)."""
    masked = [i for i, r in enumerate(rows) if r.token_mask is not None]
    if masked:
        vocab = x.shape[1]
        words = torch.cat([rows[i].token_mask.reshape(1, -1) for i in masked])
        # Tokens past the mask's words (a model vocabulary padded beyond the tokenizer's) are never allowed.
        words = torch.nn.functional.pad(words, (0, max(0, -(-vocab // 32) - words.shape[1])))
        # Bit t % 32 of word t // 32 is bit t % 8 of byte t // 8 (little-endian words): unpack the bytes
        # (5x faster than indexing the words once per token).
        shifts = torch.arange(8, dtype=torch.uint8)
        allowed = ((words.view(torch.uint8)[:, :, None] >> shifts) & 1).bool().reshape(len(masked), -1)[:, :vocab]
        allowed = allowed.to(x.device)
        if len(masked) == len(rows):
            x.masked_fill_(~allowed, float("-inf"))
        else:
            idx = _index(masked, x.device)
            x[idx] = x[idx].masked_fill(~allowed, float("-inf"))
    allow = [i for i, r in enumerate(rows) if r.params.allowed_token_ids]
    if allow:
        idx = _index(allow, x.device)
        keep = torch.zeros(len(allow), x.shape[1], dtype=torch.bool, device=x.device)
        keep[_flat_ids([rows[i].params.allowed_token_ids for i in allow], x.device)] = True
        x[idx] = x[idx].masked_fill(~keep, float("-inf"))
    banned = [(i, word[-1]) for i, r in enumerate(rows) for word in r.bad_words
              if word[-1] < x.shape[1] and _ends_with(r.output_token_ids, word[:-1])]
    if banned:
        x[_index([i for i, _ in banned], x.device), _index([t for _, t in banned], x.device)] = float("-inf")
    bias = [i for i, r in enumerate(rows) if r.params.logit_bias]
    if bias:
        row_idx, cols = _flat_ids([[t for t, _ in rows[i].params.logit_bias] for i in bias], x.device)
        values = torch.tensor([b for i in bias for _, b in rows[i].params.logit_bias], dtype=torch.float32,
                              device=x.device)
        # Token ids are unique within a row, so no (row, token) is written twice.
        x[_index(bias, x.device)[row_idx], cols] += values


def _ends_with(tokens: Sequence[int], tail: tuple[int, ...]) -> bool:
    return not tail or (len(tokens) >= len(tail) and tuple(tokens[len(tokens) - len(tail):]) == tail)


def _no_token(x: torch.Tensor, tokens: torch.Tensor) -> list[int]:
    """The rows whose token is -inf after the constraints: greedy or sampled, a row with any token left picks one
    of them (truncation keeps the best), so -inf means every token was ruled out."""
    return (x.gather(1, tokens[:, None])[:, 0] == float("-inf")).nonzero()[:, 0].tolist()


def _apply_penalties(x: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Repetition (HF), then presence and frequency (OpenAI) penalties, in place on fp32 logits."""
    rep = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if rep:
        idx = _index(rep, x.device)
        ids = [[*rows[i].prompt_token_ids, *rows[i].output_token_ids] for i in rep]
        seen = torch.zeros(len(rep), x.shape[1], dtype=torch.bool, device=x.device)
        seen[_flat_ids(ids, x.device)] = True
        penalty = torch.tensor([rows[i].params.repetition_penalty for i in rep], device=x.device)[:, None]
        sub = x[idx]
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        x[idx] = torch.where(seen, penalised, sub)

    occ = [i for i, r in enumerate(rows) if r.params.presence_penalty or r.params.frequency_penalty]
    if occ:
        idx = _index(occ, x.device)
        counts = torch.zeros(len(occ), x.shape[1], dtype=torch.float32, device=x.device)
        row_idx, cols = _flat_ids([rows[i].output_token_ids for i in occ], x.device)
        counts.index_put_((row_idx, cols), torch.ones_like(cols, dtype=torch.float32), accumulate=True)
        freq = torch.tensor([rows[i].params.frequency_penalty for i in occ], device=x.device)[:, None]
        pres = torch.tensor([rows[i].params.presence_penalty for i in occ], device=x.device)[:, None]
        x[idx] = x[idx] - freq * counts - pres * (counts > 0).float()


def _suppress_stops(x: torch.Tensor, rows: Sequence[SamplingRow], eos_token_ids: Collection[int]) -> None:
    """min_tokens: eos and stop_token_ids get -inf while the row has fewer than min_tokens output tokens.

    eos is suppressed even with ignore_eos (as vLLM does); ids outside the vocabulary are skipped.
    """
    vocab = x.shape[1]
    per_row: list[list[int]] = []
    active: list[int] = []
    for i, r in enumerate(rows):
        if len(r.output_token_ids) < r.params.min_tokens:
            ids = [t for t in (*eos_token_ids, *r.params.stop_token_ids) if 0 <= t < vocab]
            if ids:
                active.append(i)
                per_row.append(ids)
    if active:
        row_idx, cols = _flat_ids(per_row, x.device)
        x[_index(active, x.device)[row_idx], cols] = float("-inf")


def _sample(x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, then the exponential race. ``x`` is [m, vocab] fp32, modified."""
    params = [r.params for r in rows]
    device = x.device
    x.div_(torch.tensor([p.temperature for p in params], device=device)[:, None])
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        x = _top_k_top_p(x, params)
    if any(p.min_p > 0.0 for p in params):
        probs = x.softmax(dim=-1)
        min_p = torch.tensor([p.min_p for p in params], device=device)[:, None]
        x = x.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    probs = x.softmax(dim=-1)

    noise = torch.empty_like(probs)
    if any(p.seed is None for p in params):
        noise.exponential_()
    for i, r in enumerate(rows):
        if r.params.seed is not None:
            gen = torch.Generator(device=device)
            gen.manual_seed(step_seed(r.params.seed, len(r.output_token_ids)))
            noise[i].exponential_(generator=gen)
    # Exp(1) can round to 0: 0/0 would be NaN and win the argmax for a filtered-out token.
    noise.clamp_(min=torch.finfo(torch.float32).tiny)
    return probs.div_(noise).argmax(dim=-1)


def _top_k_top_p(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Keep, per row, every token whose logit is >= the cutoff logit (ties at the cutoff are kept).

    The cutoff is the n-th largest logit, n = min(top_k, the fewest tokens whose probability after
    top-k reaches top_p); the top token is always kept. Only a row with top-p but no top-k needs a
    full sort; otherwise ``topk(max top_k)`` gives all the sorted logits that matter.
    """
    m, vocab = x.shape
    device = x.device
    top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]  # 0: no top-k for this row
    unfiltered = [k == 0 and p.top_p >= 1.0 for k, p in zip(top_k, params, strict=True)]
    if all(unfiltered):
        return x
    if any(k == 0 and p.top_p < 1.0 for k, p in zip(top_k, params, strict=True)):
        width = vocab
        sorted_x = x.sort(dim=-1, descending=True).values
    else:
        width = max(top_k)
        sorted_x = x.topk(width, dim=-1).values
    k = torch.tensor([kk or width for kk in top_k], device=device)
    keep = k
    if any(p.top_p < 1.0 for p in params):
        positions = torch.arange(width, device=device)[None, :]
        probs = sorted_x.masked_fill(positions >= k[:, None], float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        top_p = torch.tensor([p.top_p for p in params], device=device)
        keep_p = (mass_before < top_p[:, None]).sum(dim=-1).clamp(min=1)
        keep = torch.minimum(k, torch.where(top_p >= 1.0, width, keep_p))
    cutoff = sorted_x.gather(1, (keep - 1)[:, None])
    cutoff = cutoff.masked_fill(torch.tensor(unfiltered, device=device)[:, None], float("-inf"))
    return x.masked_fill(x < cutoff, float("-inf"))


def _fill_logprobs(
    out: list[TokenLogprobs | None],
    logprobs: torch.Tensor,
    want: list[int],
    tokens: torch.Tensor,
    rows: Sequence[SamplingRow],
) -> None:
    """Set ``out[i]`` for each row i in ``want``; ``logprobs[j]`` is the raw log_softmax of row want[j]."""
    chosen = tokens[_index(want, tokens.device)]
    chosen_lp = logprobs.gather(1, chosen[:, None])
    ranks = ((logprobs > chosen_lp).sum(dim=-1) + 1).tolist()
    chosen_ids, chosen_vals = chosen.tolist(), chosen_lp[:, 0].tolist()
    top_n = min(max(rows[i].params.logprobs or 0 for i in want), logprobs.shape[1])
    top_vals: list[list[float]] = [[] for _ in want]
    top_ids: list[list[int]] = [[] for _ in want]
    if top_n > 0:
        vals, ids = logprobs.topk(top_n, dim=-1)  # sorted, best first
        top_vals, top_ids = vals.tolist(), ids.tolist()
    for j, i in enumerate(want):
        n = rows[i].params.logprobs or 0
        out[i] = TokenLogprobs(
            token_id=chosen_ids[j],
            logprob=chosen_vals[j],
            rank=ranks[j],
            top=list(zip(top_ids[j][:n], top_vals[j][:n], strict=True)),
        )
