"""In-process runs of a workload, watched step by step, in alternating rounds: what the in-process benchmarks of
KV memory (kv_cache_dtype.py, sliding_window.py) print."""

from __future__ import annotations

import time

from seawall.offline.engine import OfflineEngine


def watched_run(engine: OfflineEngine, prompts, params) -> tuple[float, int, int, int, list[list[int]]]:
    """tokens/s, most requests running in a step, most blocks in use, preemptions, outputs."""
    core, schedule = engine.scheduler, engine.scheduler.schedule
    peak = {"running": 0, "blocks": 0}

    def watched(now=None):
        plan = schedule(now)
        peak["running"] = max(peak["running"], len(plan.num_scheduled_tokens))
        peak["blocks"] = max(peak["blocks"], engine.blocks.num_blocks - engine.blocks.num_free)
        return plan

    core.schedule = watched
    before = sum(core.preemptions.values())
    t = time.perf_counter()
    out = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t
    del core.schedule
    tokens = sum(len(c.token_ids) for c in out)
    return (tokens / elapsed, peak["running"], peak["blocks"], sum(core.preemptions.values()) - before,
            [c.token_ids for c in out])


def alternating_rounds(engines: dict[str, OfflineEngine], prompts, params, rounds: int
                       ) -> tuple[dict[str, list[tuple]], dict[str, list[list[int]]]]:
    """``rounds`` of ``watched_run`` per engine after a warm-up round, the order alternating each round (so a
    drift of the box falls on each alike): each engine's figures per round, and its last outputs."""
    results: dict[str, list[tuple]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(rounds + 1):  # round 0 warms up
        for name in (list(engines) if r % 2 else list(engines)[::-1]):
            *figures, outputs[name] = watched_run(engines[name], prompts, params)
            if r:
                results[name].append(tuple(figures))
    return results, outputs
