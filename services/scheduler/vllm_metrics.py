"""The mesh's load under vLLM's metric names, so that what routes and scales vLLM servers by their metrics takes
a Seawall mesh as one: the Kubernetes Gateway API Inference Extension's endpoint picker (and llm-d's) reads
the queue, the running requests, the KV cache's use and size and the LoRA adapters in use from these names
(its model-server protocol); autoscalers (KEDA) and dashboards made for vLLM read the same, and its request
latencies and token counters. The mesh is one "server" to them: its scheduler's front door, over every
worker's pool. Read at scrape time, as ``metrics.py``'s collector reads the seawall_* ones; the latencies are
the seawall_* histograms summed over their labels (their buckets, not vLLM's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from services.common.metrics import RequestMetrics


class VllmMetrics:
    """``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc`` (and its
    older name ``vllm:gpu_cache_usage_perc``), ``vllm:num_preemptions_total``, ``vllm:prefix_cache_queries_total``
    and ``_hits_total``, ``vllm:cache_config_info`` and, where adapters are served, ``vllm:lora_requests_info``."""

    def __init__(self, mesh, model_name: str, requests: RequestMetrics | None = None,
                 loras: Callable[[], list[str]] | None = None, clock: Callable[[], float] = time.time) -> None:
        """``requests``: the scheduler's request metrics, also given under vLLM's names; ``loras``: the names of
        the LoRA adapters served now (None: adapters are off); ``clock``: the timestamp ``lora_requests_info``
        carries, as vLLM's does (the endpoint picker keeps the latest)."""
        self.mesh, self.model_name, self.requests, self.loras, self.clock = mesh, model_name, requests, loras, clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        links = self.mesh.live_links()
        cores = [link.core for link in links]
        name = [self.model_name]
        yield _gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled (Seawall: queued on the "
                     "mesh)", name, self.mesh.num_waiting)
        yield _gauge("vllm:num_requests_running", "Requests running (Seawall: on any worker, arriving ones too)",
                     name, sum(len(c.running) + len(c.arriving) for c in cores))
        total = sum(c.blocks.num_blocks for c in cores)
        used = sum(c.blocks.num_blocks - c.blocks.num_free for c in cores)
        usage = used / total if total else 0.0
        for metric in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            yield _gauge(metric, "KV cache usage, 1 = full (Seawall: over every worker's device pool; cached "
                         "blocks no request holds count as free, as in vLLM)", name, usage)
        yield _counter("vllm:num_preemptions", "Preemptions (a swap or a recompute)", self.model_name,
                       self.mesh.num_preemptions_gone + sum(sum(c.preemptions.values()) for c in cores))
        bs = [c.blocks.block_size for c in cores]
        yield _counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache (full blocks)",
                       self.model_name, sum(c.prefix_stats.queried_blocks * b for c, b in zip(cores, bs, strict=True)))
        yield _counter("vllm:prefix_cache_hits", "Of those, tokens served from it", self.model_name,
                       sum(c.prefix_stats.hit_blocks * b for c, b in zip(cores, bs, strict=True)))
        config = GaugeMetricFamily("vllm:cache_config_info", "Information of the KV cache (Seawall: the mesh's "
                                   "pools together)", labels=["block_size", "num_gpu_blocks"])
        if links:
            config.add_metric([str(links[0].core.blocks.block_size), str(total)], 1.0)
        yield config
        if self.loras is not None:
            yield self._lora_requests(cores)
        if self.requests is not None:
            yield from self._requests(self.requests)

    def _requests(self, m: RequestMetrics) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        name = self.model_name
        for metric, source, doc in (
                ("vllm:time_to_first_token_seconds", m.ttft, "Time to first token"),
                ("vllm:inter_token_latency_seconds", m.tbt, "Time between consecutive tokens of a request"),
                ("vllm:e2e_request_latency_seconds", m.e2e, "End-to-end request latency"),
                ("vllm:request_queue_time_seconds", m.queue, "Time a request waited before its first step"),
                ("vllm:request_prompt_tokens", m.request_prompt_tokens, "Prompt tokens of a finished request"),
                ("vllm:request_generation_tokens", m.request_generation_tokens, "Tokens a finished request "
                                                                                 "generated")):
            yield _histogram(metric, doc, name, source)
        for metric, source, doc in (("vllm:prompt_tokens", m.prompt_tokens, "Prompt tokens processed"),
                                    ("vllm:generation_tokens", m.generation_tokens, "Generation tokens processed")):
            yield _counter(metric, doc, name, sum(s.value for s in _samples(source, "_total")))
        success = CounterMetricFamily("vllm:request_success", "Requests finished, by reason",
                                      labels=["model_name", "finished_reason"])
        for sample in _samples(m.finished, "_total"):
            success.add_metric([name, sample.labels["reason"]], sample.value)
        yield success

    def _lora_requests(self, cores) -> GaugeMetricFamily:
        """vLLM's one sample: the adapters with running and with waiting requests, comma-separated. Seawall puts
        no cap on the adapters in a batch (workers load what their requests run), so ``max_lora`` is every
        adapter served."""
        family = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on LoRA requests",
                                   labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        running = {r.lora.name for c in cores for r in (*c.running, *c.arriving.values()) if r.lora is not None}
        waiting = {r.lora.name for r in (*self.mesh.unplaced, *(r for c in cores for r in c.waiting))
                   if r.lora is not None}
        family.add_metric([str(len(self.loras())), ",".join(sorted(running)), ",".join(sorted(waiting))],
                          self.clock())
        return family


def _samples(source: Counter | Histogram, suffix: str):
    return [s for family in source.collect() for s in family.samples if s.name.endswith(suffix)]


def _histogram(metric: str, documentation: str, model_name: str, source: Histogram) -> HistogramMetricFamily:
    """``source`` summed over its labels (each bucket, the sum), as one histogram of ``model_name``."""
    counts: dict[str, float] = {}
    for sample in _samples(source, "_bucket"):
        counts[sample.labels["le"]] = counts.get(sample.labels["le"], 0.0) + sample.value
    total = sum(s.value for s in _samples(source, "_sum"))
    family = HistogramMetricFamily(metric, documentation, labels=["model_name"])
    if counts:  # a labelled histogram has no buckets before its first observation
        family.add_metric([model_name], sorted(counts.items(), key=lambda kv: float(kv[0])), total)
    return family


def _counter(metric: str, documentation: str, model_name: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(metric, documentation, labels=["model_name"])
    family.add_metric([model_name], value)
    return family


def _gauge(metric: str, documentation: str, labels: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(metric, documentation, labels=["model_name"])
    family.add_metric(labels, value)
    return family
