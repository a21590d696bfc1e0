"""The worker's spans, in each request's own trace: one per prompt chunk it ran, and one summary of a
sequence's decode steps on this worker (emitted when the sequence is dropped), never a span per token."""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace

from seawall.v1 import worker_pb2
from services.common import tracing as t


@dataclass
class _Decode:
    start_ns: int
    end_ns: int
    tokens: int  # decode passes run: one per step, or several for a multi-step decode


class SequenceTraces:
    def __init__(self, tracer: trace.Tracer, worker: str) -> None:
        self.tracer = tracer
        self.worker = worker
        self._contexts: dict[str, object] = {}
        self._decodes: dict[str, _Decode] = {}

    def begin_step(self, msg: worker_pb2.StepPlan, seqs: dict) -> tuple[int, list[tuple[str, int, bool]]]:
        """Call before the step runs (after its drops): the start time and, per traced sequence, whether it
        runs prompt tokens."""
        self.drop(msg.finished_seq_ids)
        prompt_of = {}
        for new in msg.new_sequences:
            ctx = t.extract(new.trace_context)
            if ctx is not None:
                self._contexts[new.seq_id] = ctx
            prompt_of[new.seq_id] = new.num_computed_tokens < new.num_prompt_tokens
        running = []
        for seq_id, n in zip(msg.scheduled_seq_ids, msg.num_scheduled_tokens, strict=True):
            if seq_id not in self._contexts:
                continue
            seq = seqs.get(seq_id)
            is_prompt = prompt_of.get(seq_id, seq is not None and seq.num_computed < seq.prompt_len)
            running.append((seq_id, n, is_prompt))
        return time.time_ns(), running

    def end_step(self, start_ns: int, running: list[tuple[str, int, bool]], step_id: int) -> None:
        end_ns = time.time_ns()
        for seq_id, n, is_prompt in running:
            if is_prompt:
                span = self.tracer.start_span(t.SPAN_WORKER_PREFILL, context=self._contexts[seq_id],
                                              start_time=start_ns, attributes={
                                                  t.WORKER_ID: self.worker, t.STEP_ID: step_id, t.CHUNK_TOKENS: n})
                span.end(end_time=end_ns)
            else:
                d = self._decodes.setdefault(seq_id, _Decode(start_ns, end_ns, 0))
                d.end_ns, d.tokens = end_ns, d.tokens + n

    def drop(self, seq_ids) -> None:
        for seq_id in seq_ids:
            ctx = self._contexts.pop(seq_id, None)
            d = self._decodes.pop(seq_id, None)
            if ctx is not None and d is not None:
                span = self.tracer.start_span(t.SPAN_WORKER_DECODE, context=ctx, start_time=d.start_ns,
                                              attributes={t.WORKER_ID: self.worker, t.DECODE_TOKENS: d.tokens})
                span.end(end_time=d.end_ns)

    def drop_all(self) -> None:
        self.drop(list(self._contexts))
