"""The spans of one request on the scheduler: the request itself, its queueing, each prompt chunk step it
rode in, preemptions (as events), KV transfers, and one summary span for its decode."""

from __future__ import annotations

import time

from opentelemetry import trace

from services.common import tracing as t
from services.scheduler.core.request import Request


class RequestTrace:
    def __init__(self, tracer: trace.Tracer, request: Request, model: str, parent=None) -> None:
        self.tracer = tracer
        p = request.params
        self.span = tracer.start_span(t.SPAN_REQUEST, context=parent, kind=trace.SpanKind.SERVER, attributes={
            t.GEN_AI_OPERATION: "text_completion", t.GEN_AI_SYSTEM: "seawall", t.GEN_AI_MODEL: model,
            t.GEN_AI_MAX_TOKENS: p.max_tokens, t.GEN_AI_TEMPERATURE: p.temperature,
            t.GEN_AI_INPUT_TOKENS: len(request.prompt_token_ids), t.REQUEST_ID: request.request_id})
        self.context = t.span_context(self.span)
        self.queue = tracer.start_span(t.SPAN_QUEUE, context=self.context)
        self.decode: trace.Span | None = None
        self.num_preemptions = 0
        self._first_token_ns = 0

    def started(self) -> None:
        if self.queue is not None:
            self.queue.end()
            self.queue = None

    def prefill_chunk(self, start_ns: int, end_ns: int, worker_id: str, step_id: int, tokens: int) -> None:
        span = self.tracer.start_span(t.SPAN_PREFILL_CHUNK, context=self.context, start_time=start_ns, attributes={
            t.WORKER_ID: worker_id, t.STEP_ID: step_id, t.CHUNK_TOKENS: tokens})
        span.end(end_time=end_ns)

    def token(self, num_output_tokens: int) -> None:
        if self.decode is None and num_output_tokens == 1:
            self._first_token_ns = time.time_ns()
            self.decode = self.tracer.start_span(t.SPAN_DECODE, context=self.context)

    def preempted(self, request: Request, kind: str) -> None:
        if request.num_preemptions > self.num_preemptions:
            self.num_preemptions = request.num_preemptions
            self.span.add_event(t.EVENT_PREEMPTED, {t.PREEMPTION_KIND: kind})

    def transfer(self, worker_id: str, path: str, blocks: int) -> trace.Span:
        return self.tracer.start_span(t.SPAN_KV_TRANSFER, context=self.context, attributes={
            t.WORKER_ID: worker_id, t.KV_PATH: path, t.KV_BLOCKS: blocks})

    def finish(self, request: Request, reason: str | None) -> None:
        self.started()
        n = len(request.output_token_ids)
        if self.decode is not None:
            decode_s = (time.time_ns() - self._first_token_ns) / 1e9
            self.decode.set_attribute(t.DECODE_TOKENS, max(n - 1, 0))
            if n > 1:
                self.decode.set_attribute(t.TBT_MEAN_MS, decode_s * 1e3 / (n - 1))
            self.decode.end()
        self.span.set_attributes({t.GEN_AI_OUTPUT_TOKENS: n, t.GEN_AI_FINISH_REASONS: (reason or "abort",),
                                  t.CACHED_TOKENS: request.num_prefix_hit_tokens,
                                  t.PREEMPTIONS: request.num_preemptions})
        self.span.end()
