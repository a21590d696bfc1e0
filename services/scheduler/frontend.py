"""Request intake shared by the gRPC and HTTP front doors: tokenize, validate, submit, stream, abort."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

import anyio

from services.common.errors import SeawallError
from services.common.sampling_params import FinishReason, SamplingParams
from services.engine.loader import Checkpoint
from services.scheduler.admission import validate_request
from services.scheduler.core.request import Request
from services.scheduler.mesh import Mesh
from services.scheduler.request_trace import RequestTrace
from services.scheduler.tracked import Delta, TrackedRequest


class Frontend:
    def __init__(self, checkpoint: Checkpoint, mesh: Mesh, served_model_name: str | None = None) -> None:
        self.checkpoint = checkpoint
        self.tokenizer = checkpoint.tokenizer
        self.mesh = mesh
        self.model_name = served_model_name or checkpoint.path.name

    @property
    def max_model_len(self) -> int:
        return self.checkpoint.config.max_position_embeddings

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams,
               request_id: str = "", trace_parent=None, session_id: str = "") -> TrackedRequest:
        """Validates and queues a request; raises InvalidArgument or ResourceExhausted."""
        prompt = list(prompt_token_ids)
        pools = [link.info.num_device_blocks for link in self.mesh.live_links()]
        block_size = self.mesh.live_links()[0].info.kv_layout.block_size if pools else 16
        validate_request(prompt, params, self.checkpoint.config.vocab_size, self.max_model_len, block_size,
                         min(pools) if pools else None)
        request = Request(request_id or f"req-{uuid.uuid4().hex[:16]}", prompt, params,
                          arrival_time=anyio.current_time(), eos_token_ids=self.checkpoint.eos_token_ids)
        tracked = TrackedRequest(request, self.tokenizer, anyio.current_time(), session_id)
        tracing = self.mesh.tracing
        if tracing.enabled:
            tracked.trace = RequestTrace(tracing.tracer, request, self.model_name, trace_parent)
        try:
            self.mesh.submit(tracked)
        except SeawallError:
            if tracked.trace is not None:
                tracked.trace.finish(request, FinishReason.ERROR)
            raise
        return tracked

    async def stream(self, tracked: TrackedRequest) -> AsyncIterator[Delta]:
        """Yields what arrived since the last yield, until the request finishes (the last one carries the
        finish reason).

        If the consumer goes away first (client disconnect, cancelled call), the request is aborted, which
        frees its blocks on every worker it touched.
        """
        try:
            while True:
                await tracked.arrived.wait()
                delta = tracked.take()
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            self._abort_unless_done(tracked)

    async def collect(self, tracked: TrackedRequest) -> Delta:
        """All of the request's output, once it finished: one wake-up instead of one per step. If the caller
        goes away first, the request is aborted, as in ``stream``."""
        try:
            await tracked.done.wait()
            return tracked.take()
        finally:
            self._abort_unless_done(tracked)

    def _abort_unless_done(self, tracked: TrackedRequest) -> None:
        if not tracked.finished or tracked.request_id in self.mesh.tracked:
            self.mesh.abort(tracked.request_id, FinishReason.ABORT)

    def queue_delay_ms(self, tracked: TrackedRequest) -> float:
        if tracked.first_scheduled is None:
            return 0.0
        return (tracked.first_scheduled - tracked.arrival) * 1e3

