"""OpenTelemetry tracing: one trace per request across every service.

Configured by the standard ``OTEL_*`` environment variables: tracing is on when an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or the ``--otlp-endpoint`` flag)
and ``OTEL_TRACES_EXPORTER`` is not ``none``; otherwise every tracer is OpenTelemetry's no-op tracer, so
tracing off costs a few attribute-free calls. Spans go out over OTLP/gRPC in batches
(``OTEL_BSP_SCHEDULE_DELAY`` etc. apply). ``OTEL_SERVICE_NAME`` overrides the per-service default name.

W3C trace context travels as a ``{traceparent, tracestate}`` carrier: in gRPC metadata for calls, and in the
``trace_context`` map fields of StepPlan/NewSequence for the sequences a step runs. Span and attribute
names are the constants below (GenAI semantic conventions where they fit, ``seawall.*`` otherwise).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

# --- service names (resource service.name) ---
SCHEDULER = "seawall-scheduler"
PREFILL = "seawall-prefill"
DECODE = "seawall-decode"
KVCACHE = "seawall-kvcache"

# --- span names ---
SPAN_REQUEST = "seawall.request"  # the whole request, on the scheduler (root or child of the client's span)
SPAN_QUEUE = "seawall.queue"  # arrival to the first step that ran it
SPAN_PREFILL_CHUNK = "seawall.prefill_chunk"  # one step that ran some of its prompt (scheduler side)
SPAN_DECODE = "seawall.decode"  # first token to finish: a summary, never a span per token
SPAN_KV_TRANSFER = "seawall.kv_transfer"  # moving a request's KV between workers
SPAN_BEAM_SEARCH = "seawall.beam_search"  # a beam search, parent of its steps' request spans
SPAN_WORKER_PREFILL = "seawall.worker.prefill"  # the worker's forward pass over one of its prompt chunks
SPAN_WORKER_DECODE = "seawall.worker.decode"  # a sequence's decode steps on one worker (summary)
SPAN_WORKER_TRANSFER = "seawall.worker.kv_transfer"  # the worker side of a KV transfer
SPAN_KVCACHE = "seawall.kvcache"  # prefix of kvcache spans: .lookup, .load, .store
SPAN_KVCACHE_LOOKUP = f"{SPAN_KVCACHE}.lookup"
SPAN_KVCACHE_LOAD = f"{SPAN_KVCACHE}.load"
SPAN_KVCACHE_STORE = f"{SPAN_KVCACHE}.store"

# --- attribute names ---
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_MODEL = "gen_ai.request.model"
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
REQUEST_ID = "seawall.request.id"
CACHED_TOKENS = "seawall.request.cached_prompt_tokens"
PREEMPTIONS = "seawall.request.preemptions"
WORKER_ID = "seawall.worker.id"
STEP_ID = "seawall.step.id"
STEP_TOKENS = "seawall.step.tokens"
CHUNK_TOKENS = "seawall.chunk.tokens"
DECODE_TOKENS = "seawall.decode.tokens"
BEAM_WIDTH = "seawall.beam.width"
BEAM_STEPS = "seawall.beam.steps"
TBT_MEAN_MS = "seawall.decode.tbt_mean_ms"
KV_PATH = "seawall.kv.path"  # nixl | grpc
KV_BYTES = "seawall.kv.bytes"
KV_BLOCKS = "seawall.kv.blocks"
KV_GBPS = "seawall.kv.gb_per_s"
KV_TIER = "seawall.kv.tier"
KV_STATUS = "seawall.kv.status"
KV_READ_PATH = "seawall.kv.read_path"  # pe_read | de_read | unspecified (DualPath side of a load)
KV_REQUESTED_BLOCKS = "seawall.kv.requested_blocks"  # hashes in a kvcache request
KV_DRAM_BLOCKS = "seawall.kv.dram_blocks"  # of the blocks found or loaded, those from DRAM
KV_DISK_BLOCKS = "seawall.kv.disk_blocks"  # ... and those from disk
KV_PRESENT_BLOCKS = "seawall.kv.present_blocks"  # a store's blocks that were already held
KV_ENDPOINT = "seawall.kv.endpoint"  # the worker loaded into or stored from (agent name or address)
KV_TRANSFER_ID = "seawall.kv.transfer_id"
KV_ROUNDS = "seawall.kv.rounds"  # staged rounds a kvcache load or store took (one transfer each)
KV_PIN_MS = "seawall.kv.pin_ms"
EVENT_PREEMPTED = "seawall.preempted"  # span event on the request: attribute seawall.preemption.kind
PREEMPTION_KIND = "seawall.preemption.kind"

_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass
class Tracing:
    """A service's tracer and, when tracing is on, the provider to flush on shutdown."""

    tracer: trace.Tracer
    provider: object | None = None

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def setup_tracing(service_name: str, endpoint: str | None = None) -> Tracing:
    """A tracer exporting to ``endpoint`` (or the OTEL_* configuration); the no-op tracer when none is set."""
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT")
    disabled = os.environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none" or os.environ.get(
        "OTEL_SDK_DISABLED", "").lower() == "true"
    if not endpoint or disabled:
        return Tracing(trace.NoOpTracer())
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    log.info("tracing to %s as %s", endpoint, name)
    return Tracing(provider.get_tracer("seawall"), provider)


def inject(ctx: otel_context.Context | None) -> dict[str, str]:
    """The W3C carrier (traceparent, tracestate) of ``ctx``; empty when it holds no recording span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The context a carrier names, or None when it carries none."""
    if not carrier or "traceparent" not in carrier:
        return None
    return _PROPAGATOR.extract(carrier)


def from_grpc_metadata(metadata) -> otel_context.Context | None:
    """The caller's context from gRPC invocation metadata (a sequence of key/value pairs)."""
    return extract({k: v for k, v in (metadata or ()) if k in ("traceparent", "tracestate")})


def to_grpc_metadata(ctx: otel_context.Context | None) -> tuple[tuple[str, str], ...]:
    return tuple(inject(ctx).items())


def span_context(span: trace.Span) -> otel_context.Context:
    """A context whose current span is ``span``: the parent for its children."""
    return trace.set_span_in_context(span)
