"""A beam search through the mesh (services/common/beam_search.py): each step runs every open beam as a
one-token request asking for its best next tokens (vLLM's approach); the prefix cache serves the beams' shared
full blocks and each beam's partly filled last block (core/tail_blocks.py), so a step computes one token a beam."""

from __future__ import annotations

from dataclasses import replace

from opentelemetry import trace

from services.common import tracing as t
from services.common.beam_search import BeamParams, BeamSearch, Hypothesis, beam_step_params
from services.common.errors import SeawallError
from services.scheduler.frontend import Frontend, Submission
from services.scheduler.tracked import Delta


async def beam_search(frontend: Frontend, item: Submission, beam: BeamParams, trace_parent=None) -> list[Hypothesis]:
    """The hypotheses of ``item``'s prompt, best first (``item.params`` validated by the caller; its LoRA
    adapter, priority and cache salt apply to every step). Raises a step's error, or ResourceExhausted when a
    step's requests do not fit the queue; a caller that goes away aborts the step in flight."""
    tracer = frontend.mesh.tracing.tracer if frontend.mesh.tracing.enabled else None
    if tracer is None:
        return await _search(frontend, item, beam, trace_parent)
    # One trace for the whole search: its steps' requests are children of this span.
    span = tracer.start_span(t.SPAN_BEAM_SEARCH, context=trace_parent, kind=trace.SpanKind.SERVER,
                             attributes={t.BEAM_WIDTH: beam.width, t.GEN_AI_MAX_TOKENS: beam.max_tokens,
                                         t.GEN_AI_INPUT_TOKENS: len(item.prompt_token_ids)})
    try:
        found = await _search(frontend, item, beam, t.span_context(span))
        span.set_attributes({t.BEAM_STEPS: max((len(h.token_ids) for h in found), default=0),
                             t.GEN_AI_FINISH_REASONS: tuple(h.finish_reason for h in found)})
        return found
    finally:
        span.end()


async def _search(frontend: Frontend, item: Submission, beam: BeamParams, parent) -> list[Hypothesis]:
    search = BeamSearch(beam)
    step = beam_step_params(beam)
    while not search.done:
        items = [replace(item, prompt_token_ids=[*item.prompt_token_ids, *b.token_ids], params=step, request_id="")
                 for b in search.running]
        tracked = frontend.submit_many(items, parent, labels=[""] * len(items))
        outs: list[Delta] = [Delta() for _ in tracked]
        async for ready in frontend.stream_many(tracked, [True] * len(tracked)):
            for i, delta in ready:
                outs[i] = delta
        for delta in outs:
            if delta.error is not None:
                raise delta.error
            if not delta.logprobs:
                raise SeawallError(f"a beam's step ended ({delta.finish_reason}) without its next token")
        search.advance([delta.logprobs[0].top_logprobs for delta in outs])
    return search.result()
