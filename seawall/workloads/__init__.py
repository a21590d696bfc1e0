"""Workloads shared by the simulator and the live benchmarks (pure Python: no torch, no numpy).

``multiturn``: multi-turn sessions with KV reuse across turns — the Mooncake conversation trace replayed as
token ids that share exactly the trace's prefix blocks, synthetic agentic sessions (DualPath, papers.md §4.6),
and an independent prefix-hit count.
"""

from seawall.workloads.multiturn import (
    AgenticConfig,
    HitStats,
    MooncakeReplayConfig,
    MultiTurnRequest,
    SessionPlan,
    TokenSeq,
    agentic_sessions,
    block_token_ids,
    mooncake_conversation,
    prefix_hits,
    session_plans,
    structural_hits,
)

__all__ = [
    "AgenticConfig",
    "HitStats",
    "MooncakeReplayConfig",
    "MultiTurnRequest",
    "SessionPlan",
    "TokenSeq",
    "agentic_sessions",
    "block_token_ids",
    "mooncake_conversation",
    "prefix_hits",
    "session_plans",
    "structural_hits",
]
