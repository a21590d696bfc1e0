"""The peer baseline: the same requests through Hugging Face ``transformers`` on the same weights, in process.

With ``generate_batch`` available (continuous batching), the requests are added to a continuous-batching
manager at their arrival times and every token is timestamped by transformers itself
(``record_timestamps``); TTFT counts from ``add_request``. Without it, requests run through batched
``generate`` (left-padded static batches of up to ``max_batch`` requests that have arrived, one batch at a
time; TTFT counts from the request's arrival); a logits processor stamps every step, so each token still
gets its own time. Greedy, no eos (every
request produces exactly its ``max_tokens``), fp32, torch's default threads. The mesh is stopped before
this runs, so both get the same cores. The result is a list of ``metrics.RequestRecord`` like a live run's.
"""

from __future__ import annotations

import logging
import time
import warnings

import torch

from seawall.bench.metrics import RequestRecord
from seawall.bench.runner import Progress
from seawall.bench.workload import Workload

PAGE_SIZE = 256
MAX_BATCH_TOKENS = 2048


def quiet_transformers() -> None:
    """Silences transformers' warnings, progress bars and continuous-batching logs (for clean tables)."""
    warnings.filterwarnings("ignore")
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def load(model_dir: str):
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    model.generation_config.eos_token_id = None  # nothing stops early: exactly max_tokens, as in the mesh runs
    return model


def run_hf(model_dir: str, workload: Workload, *, max_batch: int = 64, progress: bool = True,
           use_cb: bool | None = None) -> tuple[list[RequestRecord], str]:
    """Runs ``workload`` through transformers; returns the records and which API ran it."""
    model = load(model_dir)
    if use_cb is None:
        use_cb = hasattr(model, "generate_batch")
    bar = Progress(len(workload.requests), "hf-transformers", progress)
    try:
        if use_cb:
            return _continuous(model, workload, max_batch, bar), "generate_batch (continuous batching)"
        return _static(model, workload, max_batch, bar), "batched generate"
    finally:
        bar.close()


def _records(workload: Workload) -> list[RequestRecord]:
    return [RequestRecord(r.index, r.arrival, len(r.prompt), r.max_tokens, r.role, priority=r.priority)
            for r in workload.requests]


def _continuous(model, workload: Workload, max_batch: int, bar: Progress) -> list[RequestRecord]:
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    reqs = sorted(workload.requests, key=lambda r: r.arrival)
    longest = max(r.max_tokens for r in reqs)
    config = GenerationConfig(max_new_tokens=longest, do_sample=False, eos_token_id=-1,
                              pad_token_id=model.config.pad_token_id)
    pages = sum(-(-(len(r.prompt) + r.max_tokens) // PAGE_SIZE) for r in reqs)
    cb = ContinuousBatchingConfig(page_size=PAGE_SIZE, num_blocks=pages + 8, max_batch_tokens=MAX_BATCH_TOKENS,
                                  max_requests_per_batch=max_batch, allow_block_sharing=False)
    records = {r.index: r for r in _records(workload)}
    finished = 0
    with model.continuous_batching_context_manager(generation_config=config, continuous_batching_config=cb,
                                                   block=True, timeout=5) as manager:
        t0 = time.perf_counter()
        for r in reqs:
            delay = t0 + r.arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            manager.add_request(list(r.prompt), request_id=str(r.index), max_new_tokens=r.max_tokens,
                                record_timestamps=True)
            bar.update(sent=1)
        while finished < len(reqs):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped")
                continue
            if not result.is_finished():
                continue
            rec = records[int(result.request_id)]
            rec.sent = result.created_time - t0
            rec.chunk_times = [t - t0 for t in result.timestamps or []]
            rec.chunk_tokens = [1] * len(rec.chunk_times)
            rec.error = result.error
            rec.finish_reason = "length"
            finished += 1
            bar.update(done=1)
    return list(records.values())


class _StepClock:
    """A logits processor that stamps each generation step (one token for every row of the batch)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


@torch.inference_mode()
def _static(model, workload: Workload, max_batch: int, bar: Progress) -> list[RequestRecord]:
    from transformers import GenerationConfig, LogitsProcessorList

    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    records = {r.index: r for r in _records(workload)}
    pending = sorted(workload.requests, key=lambda r: r.arrival)
    t0 = time.perf_counter()
    while pending:
        now = time.perf_counter() - t0
        if pending[0].arrival > now:
            time.sleep(pending[0].arrival - now)
            now = time.perf_counter() - t0
        batch = [r for r in pending if r.arrival <= now][:max_batch]
        pending = [r for r in pending if r not in batch]
        width = max(len(r.prompt) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):
            ids[row, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[row, width - len(r.prompt):] = 1
        steps = max(r.max_tokens for r in batch)
        clock = _StepClock()
        bar.update(sent=len(batch))
        model.generate(input_ids=ids, attention_mask=mask, logits_processor=LogitsProcessorList([clock]),
                       generation_config=GenerationConfig(max_new_tokens=steps, min_new_tokens=steps,
                                                          do_sample=False, eos_token_id=None, pad_token_id=pad))
        for r in batch:
            rec = records[r.index]
            rec.sent = r.arrival  # waiting for the previous batch is queueing: it counts in TTFT
            rec.chunk_times = [t - t0 for t in clock.times[: r.max_tokens]]
            rec.chunk_tokens = [1] * len(rec.chunk_times)
            rec.finish_reason = "length"
        bar.update(done=len(batch))
    return list(records.values())
