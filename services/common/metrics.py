"""Prometheus metrics: one registry per service process, passed explicitly, served as text on an HTTP port.

Counters and histograms are updated where events happen (a step ends, a token is streamed, a transfer
ends). State that already lives elsewhere (queue lengths, block usage) is read at scrape time by a
collector, so it is never duplicated or stale. Names follow Prometheus conventions: ``seawall_`` prefix,
base units (seconds, bytes), ``_total`` on counters.
"""

from __future__ import annotations

import errno
import logging

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from services.common.errors import PortInUse

log = logging.getLogger(__name__)

# Latency buckets from 1 ms to 60 s: TBT lives at the low end, TTFT and E2E under bursts at the high end.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class StepMetrics:
    """Per-step figures, shared by the scheduler (per worker) and the workers themselves."""

    def __init__(self, registry: CollectorRegistry, labels: tuple[str, ...] = ()) -> None:
        self.step_seconds = Histogram("seawall_step_seconds", "Wall time of one step (plan to result)", labels,
                                      registry=registry, buckets=LATENCY_BUCKETS)
        self.step_tokens = Histogram("seawall_step_tokens", "Tokens run in one step", labels, registry=registry,
                                     buckets=TOKEN_BUCKETS)
        self.swap_bytes = Counter("seawall_swap_bytes", "KV bytes copied by swap-out and swap-in",
                                  (*labels, "direction"), registry=registry)


class TransferMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.bytes = Counter("seawall_kv_transfer_bytes", "KV bytes moved between processes", ("path", "status"),
                             registry=registry)
        self.seconds = Histogram("seawall_kv_transfer_seconds", "Duration of one KV transfer", ("path",),
                                 registry=registry, buckets=LATENCY_BUCKETS)


def priority_class(priority: int) -> str:
    """A request priority as a bounded label value: "high" (< 0), "normal" (0), "low" (> 0)."""
    return "high" if priority < 0 else "low" if priority > 0 else "normal"


class RequestMetrics:
    """Client-facing latencies, measured where tokens are streamed (the scheduler). The per-request ones carry
    the request's ``priority_class``, so an operator sees what each class gets under load; the per-token gap
    does not (a labelled lookup per token)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        by_class = ("priority_class",)
        self.ttft = Histogram("seawall_request_ttft_seconds", "Arrival to first token", by_class, registry=registry,
                              buckets=LATENCY_BUCKETS)
        self.tbt = Histogram("seawall_request_tbt_seconds", "Gap between consecutive tokens of a request",
                             registry=registry, buckets=LATENCY_BUCKETS)
        self.e2e = Histogram("seawall_request_e2e_seconds", "Arrival to last token", by_class, registry=registry,
                             buckets=LATENCY_BUCKETS)
        self.queue = Histogram("seawall_request_queue_seconds", "Arrival to the first step that ran it", by_class,
                               registry=registry, buckets=LATENCY_BUCKETS)
        self.finished = Counter("seawall_requests_finished", "Requests finished, by reason", ("reason",),
                                registry=registry)
        # vLLM's prompt_tokens_total and generation_tokens_total: rate() of these is the mesh's throughput.
        self.prompt_tokens = Counter("seawall_prompt_tokens", "Prompt tokens of requests that got their first "
                                     "token (cached ones too)", registry=registry)
        self.generation_tokens = Counter("seawall_generation_tokens", "Tokens generated and streamed",
                                         registry=registry)
        self.request_prompt_tokens = Histogram("seawall_request_prompt_tokens", "Prompt length of a finished "
                                               "request", registry=registry, buckets=TOKEN_BUCKETS)
        self.request_generation_tokens = Histogram("seawall_request_generation_tokens", "Tokens a finished request "
                                                   "generated", registry=registry, buckets=TOKEN_BUCKETS)


def serve_metrics(registry: CollectorRegistry, host: str, port: int):
    """Serves ``registry`` at http://host:port/metrics from a background thread and returns the HTTP server
    (``shutdown()`` stops it); port 0 = off, returns None."""
    if not port:
        return None
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"cannot serve metrics on {host}:{port}: in use by another process "
                            "(pick another --metrics-port)") from exc
        raise
    log.info("Prometheus metrics on http://%s:%d/metrics", host, server.server_port)
    return server
