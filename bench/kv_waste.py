"""KV-cache memory waste on the ShareGPT length distribution: paged blocks vs max-length reservation.

Each ShareGPT request holds ``used = prompt + output`` tokens of KV when it finishes. Waste is counted over
the whole trace (token-weighted: sum of wasted slots / sum of allocated slots) and also as the mean of the
per-request fractions.

* paged, block size B: allocated = ceil(used / B) * B; waste = (allocated - used) / allocated;
* max-length reservation (the PagedAttention paper's baseline): every request reserves the model's max
  length L; waste = (L - used) / L; requests with used > L cannot run under that L and are left out (the
  fraction left out is printed);
* "prompt + max_tokens" reservation: reserve prompt + M, M = the largest output length in the trace.

The paged figure is also taken from the real allocator: a sample of requests is run through the scheduler
core's ``BlockManager`` token by token (prompt, then one decode token at a time, several requests live at
once), and the blocks it hands out are compared with the formula.

Targets: paged waste <= 4 %; reservation waste 60-80 %. Exits 1 when paged waste (B=16) exceeds 4 % or
the allocator disagrees with the formula.

    .venv/bin/python bench/kv_waste.py [--json OUT] [--sample 2000]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.scheduler.core.block_manager import BlockManager  # noqa: E402

TRACE = ROOT / "bench" / "traces" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
PAGED_TARGET = 0.04
RESERVATION_TARGET = (0.60, 0.80)
PROMPT_COL, OUTPUT_COL = "num_prefill_tokens", "num_decode_tokens"


def load_lengths(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {PROMPT_COL, OUTPUT_COL} - set(reader.fieldnames or ())
        if missing:
            raise SystemExit(f"{path}: header {reader.fieldnames} lacks {sorted(missing)}")
        rows = [(int(r[PROMPT_COL]), int(r[OUTPUT_COL])) for r in reader]
    arr = np.array(rows, dtype=np.int64)
    return arr[:, 0], arr[:, 1]


def waste(allocated: np.ndarray, used: np.ndarray) -> dict[str, float]:
    return {
        "waste_token_weighted": float((allocated - used).sum() / allocated.sum()),
        "waste_mean_per_request": float(((allocated - used) / allocated).mean()),
        "allocated_tokens": int(allocated.sum()),
        "used_tokens": int(used.sum()),
    }


def paged(used: np.ndarray, block: int) -> dict[str, float]:
    allocated = -(-used // block) * block
    return {"block_size": block, **waste(allocated, used)}


def reserve_max_len(used: np.ndarray, max_len: int) -> dict[str, float]:
    fits = used <= max_len
    out = waste(np.full(int(fits.sum()), max_len), used[fits])
    return {"max_len": max_len, "fraction_left_out": float(1 - fits.mean()), **out}


def simulate_allocator(prompts: np.ndarray, outputs: np.ndarray, block: int, sample: int, live: int,
                       seed: int = 0) -> dict[str, float]:
    """Runs ``sample`` requests through ``BlockManager``, ``live`` at a time, one token per decode step.

    Mirrors ``Scheduler._reserve``: before a step that brings a request to ``n`` tokens in cache it asks for
    ``blocks_needed(n, owned)`` more blocks. Returns the waste of the final allocations, the time-averaged
    waste over all steps, and whether every request ended with exactly ceil(used / block) blocks. The pool's
    invariants (``check_integrity``) are checked every 256 steps and at the end.
    """
    rng = random.Random(seed)
    idx = rng.sample(range(len(prompts)), min(sample, len(prompts)))
    queue = [(f"r{i}", int(prompts[i]), int(outputs[i])) for i in idx]
    max_tokens = max(p + o for _, p, o in queue)
    manager = BlockManager(num_blocks=live * -(-max_tokens // block), block_size=block)
    owned: dict[str, list[int]] = {}
    state: dict[str, list[int]] = {}  # rid -> [tokens in cache, target tokens]
    final_alloc, final_used = [], []
    mismatches = 0
    step_alloc = step_used = steps = 0
    while queue or state:
        while queue and len(state) < live:  # admit: the whole prompt in one step
            rid, p, o = queue.pop()
            owned[rid] = manager.allocate(rid, manager.blocks_needed(p, 0)) or []
            assert len(owned[rid]) == -(-p // block), "pool sized too small"
            state[rid] = [p, p + o]
        for rid in list(state):  # one decode token each
            n, target = state[rid]
            if n < target:
                got = manager.allocate(rid, manager.blocks_needed(n + 1, len(owned[rid])))
                assert got is not None, "pool sized too small"
                owned[rid].extend(got)
                state[rid][0] = n + 1
        steps += 1
        if steps % 256 == 0:  # O(pool size): every step would dominate the run
            manager.check_integrity(owned)
        for rid, (n, _) in state.items():
            step_alloc += len(owned[rid]) * block
            step_used += n
        for rid in [r for r, (n, t) in state.items() if n >= t]:
            n = state.pop(rid)[0]
            blocks = owned.pop(rid)
            final_alloc.append(len(blocks) * block)
            final_used.append(n)
            mismatches += len(blocks) != -(-n // block)
            manager.free(rid, blocks)
    manager.check_integrity({})
    out = waste(np.array(final_alloc), np.array(final_used))
    formula = paged(np.array(final_used), block)
    return {
        "block_size": block,
        "requests": len(final_used),
        "live": live,
        "mismatches": mismatches,
        "formula_waste_token_weighted": formula["waste_token_weighted"],
        "time_averaged_waste": step_alloc and (step_alloc - step_used) / step_alloc,
        **out,
    }


def pct(x: float) -> str:
    return f"{100 * x:6.2f} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--sample", type=int, default=2000, help="requests run through BlockManager")
    ap.add_argument("--live", type=int, default=64, help="requests holding blocks at once in the simulation")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    prompts, outputs = load_lengths(args.trace)
    used = prompts + outputs
    max_out = int(outputs.max())
    print(f"ShareGPT ({args.trace.name}): {len(used)} requests; prompt mean {prompts.mean():.0f}, "
          f"output mean {outputs.mean():.0f} (max {max_out}), prompt+output mean {used.mean():.0f} "
          f"(max {used.max()})")

    results = {"trace": args.trace.name, "requests": int(len(used)), "paged": [], "reserve_max_len": [],
               "reserve_prompt_plus_max_tokens": None, "allocator": []}
    rows = []
    for b in (16, 32):
        r = paged(used, b)
        results["paged"].append(r)
        rows.append((f"paged, block {b}", r, "-"))
    for max_len in (8192, 4096, 2048):
        r = reserve_max_len(used, max_len)
        results["reserve_max_len"].append(r)
        rows.append((f"reserve max len {max_len}", r, f"{100 * r['fraction_left_out']:.1f} %"))
    allocated = prompts + max_out
    r = {"max_tokens": max_out, **waste(allocated, used)}
    results["reserve_prompt_plus_max_tokens"] = r
    rows.append((f"reserve prompt + {max_out}", r, "-"))

    print(f"\n{'scheme':<26} {'waste (token-wt)':>17} {'waste (mean/req)':>17} {'requests left out':>18}")
    for name, r, left in rows:
        print(f"{name:<26} {pct(r['waste_token_weighted']):>17} {pct(r['waste_mean_per_request']):>17} "
              f"{left:>18}")

    print(f"\nBlockManager, {args.sample} sampled requests, {args.live} live at a time, token by token:")
    print(f"{'block':>6} {'allocator waste':>16} {'formula waste':>14} {'time-avg waste':>15} {'mismatches':>11}")
    ok = True
    for b in (16, 32):
        sim = simulate_allocator(prompts, outputs, b, args.sample, args.live)
        results["allocator"].append(sim)
        agree = sim["mismatches"] == 0 and math.isclose(sim["waste_token_weighted"],
                                                        sim["formula_waste_token_weighted"], rel_tol=1e-12)
        ok &= agree
        print(f"{b:>6} {pct(sim['waste_token_weighted']):>16} {pct(sim['formula_waste_token_weighted']):>14} "
              f"{pct(sim['time_averaged_waste']):>15} {sim['mismatches']:>11}")

    paged16 = results["paged"][0]["waste_token_weighted"]
    alloc16 = results["allocator"][0]["waste_token_weighted"]
    reserve = results["reserve_max_len"][0]["waste_token_weighted"]
    lo, hi = RESERVATION_TARGET
    print(f"\nTargets: paged (B=16) <= {100 * PAGED_TARGET:.0f} %: {pct(paged16).strip()} (allocator sample "
          f"{pct(alloc16).strip()}) -> {'OK' if paged16 <= PAGED_TARGET and alloc16 <= PAGED_TARGET else 'FAIL'}")
    print(f"         max-length reservation {100 * lo:.0f}-{100 * hi:.0f} % (L=8192, every request fits): "
          f"{pct(reserve).strip()} -> {'in range' if lo <= reserve <= hi else 'outside range'}")
    print(f"         allocator agrees with ceil(used/B)*B: {'yes' if ok else 'NO'}")
    results["targets"] = {"paged_max": PAGED_TARGET, "reservation_range": list(RESERVATION_TARGET),
                          "paged_ok": paged16 <= PAGED_TARGET and alloc16 <= PAGED_TARGET, "allocator_agrees": ok}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["targets"]["paged_ok"] and ok else 1


if __name__ == "__main__":
    sys.exit(main())
