"""Multi-turn workloads: sessions whose turns reuse the KV of earlier turns.

Two sources, one request type (``MultiTurnRequest``):

* ``mooncake_conversation`` replays the Mooncake conversation trace (``bench/traces``). Each record lists
  ``hash_ids``, one per 512-token prompt block, chained (an id names its block and every block before it).
  Every id becomes ``block_tokens`` token ids drawn deterministically from the id and ``seed``, so two
  prompts share exactly the leading blocks whose ids they share; a partial last block (from
  ``input_length``) is a prefix of its id's block. ``block_tokens`` scales the trace down: 16 maps each
  512-token block to 16 tokens (lengths, outputs by default, all scaled by 16/512), so the built-in model's
  4096-token context can replay it. The trace has no session ids: a record continues the most recent
  earlier record it shares the longest prefix with (at least ``min_shared_blocks`` blocks; block 0 is a
  system prompt every record shares), which gives its ``session_id``, ``turn`` and ``prev_request_id``.
* ``agentic_sessions`` generates DualPath-style agent trajectories (papers.md §4.6): S sessions of up to T
  turns; turn 1's prompt is a first context, and each later prompt is the previous prompt + the previous
  turn's output + a short append, so almost every prompt token was seen before (≥ 95 % with the defaults).
  Open loop (``agentic_sessions``), the output is an assumed one; closed loop (``session_plans``, then
  ``SessionPlan.first_turn`` / ``next_turn``), it is what the model generated, so a live cache can hit it.

Token ids are drawn from ``[3, vocab_size)`` (0–2 are left to special tokens) and are not materialised until
read: ``prompt_token_ids`` is a ``TokenSeq``, a lazy concatenation of named segments, so a workload of long
contexts costs memory per segment, not per token.

``prefix_hits`` counts prefix-cache hits independently of the scheduler (no block hashing: a trie of
exact block contents): a prompt's full block is a hit when it and every block before it were seen in an
earlier request. ``structural_hits`` gives the same counts from the workload's structure (hash ids, shared
prefix lengths) without reading a token; the tests hold the two equal.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import random
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.common.errors import InvalidArgument, NotFound

MOONCAKE_FILE = "mooncake_conversation_trace.jsonl"
MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake traces
DEFAULT_VOCAB = 4096  # the built-in model's vocabulary
FIRST_TOKEN_ID = 3  # ids below this are left to special tokens (BOS/EOS/pad)


# --- token ids -------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def block_token_ids(key: str, length: int, vocab_size: int = DEFAULT_VOCAB, seed: int = 0) -> tuple[int, ...]:
    """``length`` token ids for the segment named ``key``: deterministic in (key, seed, vocab_size), stable
    across processes and machines, and prefix-consistent (the first k ids do not depend on ``length``)."""
    if vocab_size <= FIRST_TOKEN_ID:
        raise InvalidArgument(f"vocab size must be > {FIRST_TOKEN_ID}, got {vocab_size}")
    if length <= 0:
        return ()
    raw = hashlib.shake_128(f"seawall-multiturn|{seed}|{key}".encode()).digest(4 * length)
    span = vocab_size - FIRST_TOKEN_ID
    return tuple(FIRST_TOKEN_ID + x % span for x in struct.unpack(f"<{length}I", raw))


class TokenSeq(Sequence):
    """Token ids as a lazy concatenation of segments ``(key, length)`` (see ``block_token_ids``)."""

    __slots__ = ("segments", "vocab_size", "seed", "_len")

    def __init__(self, segments: Iterable[tuple[str, int]] = (), vocab_size: int = DEFAULT_VOCAB,
                 seed: int = 0) -> None:
        self.segments = tuple((k, n) for k, n in segments if n > 0)
        self.vocab_size, self.seed = vocab_size, seed
        self._len = sum(n for _, n in self.segments)

    def extend(self, segments: Iterable[tuple[str, int]]) -> TokenSeq:
        """A new sequence: these tokens followed by ``segments``."""
        more = TokenSeq(segments, self.vocab_size, self.seed)
        out = TokenSeq.__new__(TokenSeq)
        out.segments, out.vocab_size, out.seed = self.segments + more.segments, self.vocab_size, self.seed
        out._len = self._len + more._len
        return out

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        for key, n in self.segments:
            yield from block_token_ids(key, n, self.vocab_size, self.seed)

    def tolist(self) -> list[int]:
        out: list[int] = []
        for key, n in self.segments:
            out.extend(block_token_ids(key, n, self.vocab_size, self.seed))
        return out

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tolist()[i]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("TokenSeq index out of range")
        for key, n in self.segments:
            if i < n:
                return block_token_ids(key, n, self.vocab_size, self.seed)[i]
            i -= n
        raise IndexError("TokenSeq index out of range")  # pragma: no cover

    def __eq__(self, other) -> bool:
        if isinstance(other, TokenSeq) and (self.segments, self.vocab_size, self.seed) == (
                other.segments, other.vocab_size, other.seed):
            return True
        return isinstance(other, Sequence) and len(other) == self._len and list(other) == self.tolist()

    __hash__ = None

    def __repr__(self) -> str:
        return f"TokenSeq({self._len} tokens in {len(self.segments)} segments)"


@dataclass(frozen=True)
class MultiTurnRequest:
    """One turn of one session.

    ``arrival_s`` is the earliest time the turn may be sent; a closed-loop driver sends turn k >= 2 at
    ``max(arrival_s, finish of prev_request_id + think_s)`` (agentic sessions: a turn follows the previous
    one's answer); a trace replay sends every request at ``arrival_s``.
    ``shared_prefix_tokens``: leading tokens of this prompt equal to the previous turn's context — its
    prompt plus, for generated sessions, its output (assumed, ``output_token_ids``, or generated, in a closed
    loop); 0 on turn 1. ``prompt_token_ids`` is a ``TokenSeq``, or a tuple of ids for a closed-loop turn.
    """

    request_id: str
    session_id: str
    turn: int  # 1-based
    prompt_token_ids: Sequence[int]
    max_tokens: int
    arrival_s: float
    shared_prefix_tokens: int = 0
    prev_request_id: str | None = None
    think_s: float = 0.0
    # Generated sessions: the output this turn is assumed to produce (the next prompt embeds it). A live
    # model generates other tokens, so a live cache holds the previous prompt's blocks, not these.
    output_token_ids: TokenSeq | None = None
    # Mooncake replay: the trace's block ids and the tokens each stands for after scaling.
    hash_ids: tuple[int, ...] = ()
    block_tokens: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def to_dict(self, with_tokens: bool = True) -> dict:
        d = {"request_id": self.request_id, "session_id": self.session_id, "turn": self.turn,
             "arrival_s": self.arrival_s, "think_s": self.think_s, "max_tokens": self.max_tokens,
             "prompt_len": self.prompt_len, "shared_prefix_tokens": self.shared_prefix_tokens,
             "prev_request_id": self.prev_request_id}
        if with_tokens:
            d["prompt_token_ids"] = list(self.prompt_token_ids)
        return d


def write_jsonl(requests: Iterable[MultiTurnRequest], path: str | Path, with_tokens: bool = True) -> int:
    """One JSON object per request (``MultiTurnRequest.to_dict``); returns the count."""
    n = 0
    with Path(path).open("w") as f:
        for req in requests:
            f.write(json.dumps(req.to_dict(with_tokens)) + "\n")
            n += 1
    return n


# --- the Mooncake conversation trace ------------------------------------------------------------------------


def trace_dir() -> Path:
    """``$SEAWALL_TRACE_DIR`` or the repository's ``bench/traces`` (never a path outside the repository)."""
    env = os.environ.get("SEAWALL_TRACE_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "bench" / "traces"


@dataclass(frozen=True)
class MooncakeReplayConfig:
    path: str | None = None  # default: trace_dir() / MOONCAKE_FILE
    limit: int | None = None  # records to read (None: all)
    offset: int = 0  # first record
    block_tokens: int = MOONCAKE_BLOCK  # tokens per hash id after scaling (512: the trace's own lengths)
    output_scale: float | None = None  # output lengths × this (default block_tokens / 512)
    vocab_size: int = DEFAULT_VOCAB
    seed: int = 0
    time_scale: float = 1.0  # arrival times × this (0.5: twice as fast)
    spread_s: float = 0.0  # spread records that share a timestamp evenly over this many trace seconds
    max_model_len: int | None = None  # skip records whose scaled prompt + output exceed this
    min_shared_blocks: int = 2  # a record continues a session when it shares at least this many blocks


def _read_mooncake(cfg: MooncakeReplayConfig) -> list[dict]:
    path = Path(cfg.path) if cfg.path else trace_dir() / MOONCAKE_FILE
    if not path.is_file():
        raise NotFound(f"Mooncake trace not found at {path}; set $SEAWALL_TRACE_DIR to the directory holding "
                       f"{MOONCAKE_FILE} (the repository ships it in bench/traces)")
    stop = None if cfg.limit is None else cfg.offset + cfg.limit
    with path.open() as f:
        return [json.loads(line) for line in itertools.islice(f, cfg.offset, stop) if line.strip()]


def _spread_times(stamps: list[float], spread: float) -> list[float]:
    """Records sharing a timestamp (the trace is quantised to 3 s) spread evenly over ``spread`` seconds."""
    if spread <= 0:
        return stamps
    out = list(stamps)
    i = 0
    while i < len(stamps):
        j = i
        while j < len(stamps) and stamps[j] == stamps[i]:
            j += 1
        for k in range(i, j):
            out[k] = stamps[i] + (k - i) * spread / (j - i)
        i = j
    return out


def mooncake_conversation(cfg: MooncakeReplayConfig = MooncakeReplayConfig()) -> list[MultiTurnRequest]:
    """The trace's records (from ``offset``, at most ``limit``) as requests, in trace order."""
    if cfg.block_tokens < 1 or cfg.time_scale < 0 or cfg.min_shared_blocks < 1:
        raise InvalidArgument("block tokens and min shared blocks must be >= 1 and time scale >= 0")
    records = _read_mooncake(cfg)
    bt = cfg.block_tokens
    out_scale = cfg.output_scale if cfg.output_scale is not None else bt / MOONCAKE_BLOCK
    stamps = _spread_times([r["timestamp"] / 1000.0 for r in records], cfg.spread_s)
    t0 = stamps[0] if stamps else 0.0
    # Sessions: a trie over hash-id prefixes; each node remembers the latest request that went through it.
    children: dict[tuple[int, int], int] = {}
    latest: dict[int, int] = {}  # trie node -> index into ``out``
    out: list[MultiTurnRequest] = []
    for row, (rec, stamp) in enumerate(zip(records, stamps, strict=True), start=cfg.offset):
        ids = tuple(int(h) for h in rec["hash_ids"])
        n_in = int(rec["input_length"])
        if not ids or n_in < 1:
            continue
        partial = n_in - MOONCAKE_BLOCK * (len(ids) - 1)  # tokens of the last block, 1..512
        last = max(1, math.ceil(partial * bt / MOONCAKE_BLOCK))
        prompt_len = bt * (len(ids) - 1) + last
        max_tokens = max(1, math.ceil(int(rec["output_length"]) * out_scale))
        if cfg.max_model_len is not None and prompt_len + max_tokens > cfg.max_model_len:
            continue
        node, depth, parent = 0, 0, None
        for h in ids:
            nxt = children.get((node, h))
            if nxt is None:
                break
            node, depth = nxt, depth + 1
            if depth >= cfg.min_shared_blocks:
                parent = (latest[node], depth)
        segments = [(f"mc:{h}", bt) for h in ids[:-1]] + [(f"mc:{ids[-1]}", last)]
        tokens = TokenSeq(segments, cfg.vocab_size, cfg.seed)
        rid = f"mc-{row}"
        if parent is None:
            session, turn, prev, shared = rid, 1, None, 0
        else:
            p, blocks = out[parent[0]], parent[1]
            session, turn, prev = p.session_id, p.turn + 1, p.request_id
            shared = min(blocks * bt, p.prompt_len, prompt_len)
        idx = len(out)
        out.append(MultiTurnRequest(rid, session, turn, tokens, max_tokens, (stamp - t0) * cfg.time_scale,
                                    shared, prev, 0.0, None, ids, bt))
        node = 0
        for h in ids:
            node = children.setdefault((node, h), len(children) + 1)
            latest[node] = idx
    return out


# --- synthetic agentic sessions ------------------------------------------------------------------------------

# DualPath's agentic datasets (papers.md §4.6), read as rounds: the table's "Turns" count both the model's
# and the tool's messages (rounds = turns / 2), which makes first + rounds × (append + gen) match its
# "Total" and a linearly growing context match its mean "Context": first = 2 × context − total.
AGENTIC_PRESETS = {
    "32k": {"first_prompt_len": 5727, "turns": 30, "append_len": 608, "output_len": 148, "max_len": 32768},
    "48k": {"first_prompt_len": 7633, "turns": 53, "append_len": 474, "output_len": 172, "max_len": 49152},
    "64k": {"first_prompt_len": 9484, "turns": 78, "append_len": 429, "output_len": 176, "max_len": 65536},
}


@dataclass(frozen=True)
class AgenticConfig:
    """Defaults: DualPath's 64K dataset shape (hit rate ~98 %); ``preset`` gives the others and ``scaled``
    shrinks every length (``scaled(1 / 16)`` fits the built-in model's 4096-token context)."""

    sessions: int = 16
    turns: int = 78  # at most: a session ends before a turn whose prompt + output would pass max_len
    first_prompt_len: int = 9484  # turn 1's context (task, repository, tools)
    append_len: int = 429  # tokens appended per turn (tool output, the next instruction)
    output_len: int = 176  # tokens generated per turn
    max_len: int = 65536
    jitter: float = 0.5  # every length is uniform in mean × [1 - jitter, 1 + jitter] (0: fixed)
    think_s: float = 0.0  # between a turn's last token and the next turn (tool time)
    session_arrival: str = "burst"  # burst: every session starts at 0 (offline); poisson: session_rate/s
    session_rate: float = 1.0  # sessions started per second (poisson; DualPath's APS)
    vocab_size: int = DEFAULT_VOCAB
    seed: int = 0

    @classmethod
    def preset(cls, name: str, **overrides) -> AgenticConfig:
        """DualPath's dataset shapes: ``32k``, ``48k`` or ``64k`` (papers.md §4.6), with overrides."""
        if name not in AGENTIC_PRESETS:
            raise InvalidArgument(f"unknown agentic preset {name!r}; known: {', '.join(AGENTIC_PRESETS)}")
        return cls(**{**AGENTIC_PRESETS[name], **overrides})

    def scaled(self, factor: float) -> AgenticConfig:
        """Every token length (first prompt, append, output, max_len) × ``factor``, at least 1; the hit rate
        stays about the same."""
        if factor <= 0:
            raise InvalidArgument(f"scale factor must be > 0, got {factor}")

        def f(n: int) -> int:
            return max(1, round(n * factor))

        return dataclasses.replace(self, first_prompt_len=f(self.first_prompt_len), append_len=f(self.append_len),
                                   output_len=f(self.output_len), max_len=f(self.max_len))


def _jittered(rng: random.Random, mean: int, jitter: float) -> int:
    if jitter <= 0:
        return max(1, mean)
    return max(1, round(mean * rng.uniform(1 - jitter, 1 + jitter)))


def agentic_sessions(cfg: AgenticConfig = AgenticConfig()) -> list[MultiTurnRequest]:
    """Every turn of every session, open loop (each prompt embeds the output assumed for the turn before),
    sorted by (arrival_s, session, turn)."""
    out = [req for plan in session_plans(cfg) for req in plan.open_loop()]
    out.sort(key=lambda r: (r.arrival_s, r.session_id, r.turn))
    return out


def session_plans(cfg: AgenticConfig = AgenticConfig()) -> list[SessionPlan]:
    """One plan per session: everything ``agentic_sessions`` draws, before any output exists."""
    if cfg.sessions < 1 or cfg.turns < 1:
        raise InvalidArgument(f"sessions and turns must be >= 1, got {cfg.sessions} and {cfg.turns}")
    if min(cfg.first_prompt_len, cfg.append_len, cfg.output_len) < 1 or not 0 <= cfg.jitter < 1:
        raise InvalidArgument("prompt, append and output lengths must be >= 1 and jitter in [0, 1)")
    if cfg.session_arrival not in ("burst", "poisson"):
        raise InvalidArgument(f"session arrival must be burst or poisson, got {cfg.session_arrival!r}")
    if cfg.session_arrival == "poisson" and cfg.session_rate <= 0:
        raise InvalidArgument(f"session rate must be > 0, got {cfg.session_rate}")
    arrivals = random.Random(cfg.seed)
    start = 0.0
    plans = []
    for s in range(cfg.sessions):
        if cfg.session_arrival == "poisson":
            start += arrivals.expovariate(cfg.session_rate)
        plans.append(_plan(cfg, s, start))
    return plans


def _plan(cfg: AgenticConfig, s: int, start: float) -> SessionPlan:
    # Draw order (first prompt, then per turn: its append, its output) keeps every seed's sessions as before.
    rng = random.Random(cfg.seed * 1_000_003 + s)
    sid = f"s{s}"
    first = TokenSeq([(f"ag:{sid}:first", _jittered(rng, cfg.first_prompt_len, cfg.jitter))],
                     cfg.vocab_size, cfg.seed)
    appends, outputs = [], []
    for t in range(1, cfg.turns + 1):
        if t > 1:
            appends.append(TokenSeq([(f"ag:{sid}:{t}:append", _jittered(rng, cfg.append_len, cfg.jitter))],
                                    cfg.vocab_size, cfg.seed))
        outputs.append(_jittered(rng, cfg.output_len, cfg.jitter))
    if len(first) + outputs[0] > cfg.max_len:
        raise InvalidArgument(f"the first prompt ({len(first)}) + output ({outputs[0]}) pass max_len {cfg.max_len}")
    return SessionPlan(sid, start, first, tuple(appends), tuple(outputs), cfg.think_s, cfg.max_len)


@dataclass(frozen=True)
class SessionPlan:
    """One agentic session as drawn: turn 1's context, the append before each later turn and each turn's
    output length. Turn k + 1's prompt is turn k's prompt + turn k's output + ``appends[k - 1]``.

    ``open_loop`` fills in an assumed output for every turn (the next prompt embeds tokens no model produced,
    so a live cache misses them). ``first_turn`` / ``next_turn`` close the loop: the next prompt embeds the
    tokens the model actually generated, so a live cache can hit the whole previous context.
    """

    session_id: str
    start_s: float
    first_prompt: TokenSeq
    appends: tuple[TokenSeq, ...]  # appends[i] comes before turn i + 2
    max_tokens: tuple[int, ...]  # per turn, turn 1 first
    think_s: float
    max_len: int

    @property
    def turns(self) -> int:
        return len(self.max_tokens)

    def first_turn(self) -> MultiTurnRequest:
        return self._turn(1, self.first_prompt, 0, None, None)

    def next_turn(self, prev: MultiTurnRequest, generated: Sequence[int]) -> MultiTurnRequest | None:
        """The turn after ``prev``, whose output was ``generated``: prev's prompt + generated + the append.
        None when the session is over (no turns left, or the prompt + output would pass max_len)."""
        if prev.session_id != self.session_id:
            raise InvalidArgument(f"turn {prev.request_id} belongs to session {prev.session_id}, "
                                  f"not {self.session_id}")
        t = prev.turn + 1
        if t > self.turns:
            return None
        context = (*prev.prompt_token_ids, *generated)
        prompt = (*context, *self.appends[t - 2])
        if len(prompt) + self.max_tokens[t - 1] > self.max_len:
            return None
        return self._turn(t, prompt, len(context), prev.request_id, None)

    def open_loop(self) -> list[MultiTurnRequest]:
        """Every turn, each given an assumed output (``output_token_ids``) that the next prompt embeds."""
        sid = self.session_id
        turns = [self._turn(1, self.first_prompt, 0, None, self._assumed_output(1))]
        for t in range(2, self.turns + 1):
            prev = turns[-1]
            prompt = prev.prompt_token_ids.extend([*prev.output_token_ids.segments, *self.appends[t - 2].segments])
            if len(prompt) + self.max_tokens[t - 1] > self.max_len:
                break
            turns.append(self._turn(t, prompt, prev.prompt_len + len(prev.output_token_ids), f"{sid}-t{t - 1}",
                                    self._assumed_output(t)))
        return turns

    def _assumed_output(self, t: int) -> TokenSeq:
        return TokenSeq([(f"ag:{self.session_id}:{t}:out", self.max_tokens[t - 1])], self.first_prompt.vocab_size,
                        self.first_prompt.seed)

    def _turn(self, t: int, prompt: Sequence[int], shared: int, prev: str | None,
              output: TokenSeq | None) -> MultiTurnRequest:
        arrival = self.start_s
        for _ in range(t - 1):  # summed, not multiplied: the same floats as every earlier release
            arrival += self.think_s
        return MultiTurnRequest(f"{self.session_id}-t{t}", self.session_id, t, prompt, self.max_tokens[t - 1],
                                arrival, shared, prev, self.think_s if t > 1 else 0.0, output)


# --- hit-rate accounting -------------------------------------------------------------------------------------


@dataclass
class HitStats:
    block_size: int
    prompt_tokens: int = 0
    hit_tokens: int = 0
    per_request: list[int] = field(default_factory=list)  # hit tokens of each request, in the given order

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prefix_hits(requests: Iterable[MultiTurnRequest], block_size: int, *,
                count_outputs: bool = False) -> HitStats:
    """Prefix-cache hits of ``requests`` in the given order with an unbounded cache, from the token ids alone.

    A full ``block_size`` block of a prompt is a hit when it and every block before it appeared, at the same
    position after the same tokens, in an earlier request (a trie of exact block contents: no hashing, so
    nothing shared with the scheduler's block hashes). Partial blocks never hit. Every full block of a prompt
    is remembered; with ``count_outputs`` also those of prompt + ``output_token_ids`` (a store that keeps
    the generated blocks too).
    """
    if block_size < 1:
        raise InvalidArgument(f"block size must be >= 1, got {block_size}")
    trie: dict[tuple[int, bytes], int] = {}
    stats = HitStats(block_size)
    for req in requests:
        tokens = req.prompt_token_ids.tolist() if isinstance(req.prompt_token_ids, TokenSeq) \
            else list(req.prompt_token_ids)
        n_prompt = len(tokens)
        if count_outputs and req.output_token_ids is not None:
            tokens.extend(req.output_token_ids)
        node, hit, matching = 0, 0, True
        for b in range(len(tokens) // block_size):
            key = (node, array("q", tokens[b * block_size:(b + 1) * block_size]).tobytes())
            nxt = trie.get(key)
            if nxt is None:
                matching = False
                nxt = trie[key] = len(trie) + 1
            elif matching and (b + 1) * block_size <= n_prompt:
                hit += block_size
            node = nxt
        stats.prompt_tokens += n_prompt
        stats.hit_tokens += hit
        stats.per_request.append(hit)
    return stats


def structural_hits(requests: Sequence[MultiTurnRequest], block_size: int, *,
                    count_outputs: bool = False) -> HitStats:
    """The same counts as ``prefix_hits`` from the workload's structure, without reading a token.

    Trace replays count leading hash ids seen as full blocks before (``block_size`` must be the replay's
    ``block_tokens``); generated sessions hit the previous turn's context, prompt (+ output with
    ``count_outputs``), rounded down to whole blocks (sessions share no tokens with each other).
    """
    stats = HitStats(block_size)
    children: dict[tuple[int, int], int] = {}
    by_id = {r.request_id: r for r in requests}
    for req in requests:
        n = req.prompt_len
        if req.hash_ids:
            if req.block_tokens != block_size:
                raise InvalidArgument(f"trace blocks are {req.block_tokens} tokens; count them with that "
                                      f"block size (got {block_size}) or use prefix_hits")
            node, hit, matching = 0, 0, True
            for h in req.hash_ids[: n // block_size]:
                nxt = children.get((node, h))
                if nxt is None:
                    matching = False
                    nxt = children[(node, h)] = len(children) + 1
                elif matching:
                    hit += block_size
                node = nxt
        elif req.prev_request_id is not None:
            prev = by_id[req.prev_request_id]
            ctx = prev.prompt_len + (len(prev.output_token_ids or ()) if count_outputs else 0)
            hit = min(ctx, req.shared_prefix_tokens, n) // block_size * block_size
        else:
            hit = 0
        stats.prompt_tokens += n
        stats.hit_tokens += hit
        stats.per_request.append(hit)
    return stats
