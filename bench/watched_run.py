"""One in-process run of a workload, watched step by step: what the in-process benchmarks of KV memory print."""

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
