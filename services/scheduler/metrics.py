"""The scheduler's Prometheus metrics: event counters and histograms, plus a collector that reads the mesh's
queues and block pools at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.common.metrics import LATENCY_BUCKETS, RequestMetrics, StepMetrics, TransferMetrics


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = RequestMetrics(self.registry)
        self.steps = StepMetrics(self.registry, ("worker",))
        self.transfers = TransferMetrics(self.registry)
        self.pipelined_steps = Counter(
            "seawall_steps_pipelined", "Plans sent while the worker's previous step still ran (planned ahead)",
            ("worker",), registry=self.registry)
        self.worker_failures = Counter(
            "seawall_worker_failures", "Workers dropped as failed (a step, a call or the connection failed)",
            ("role",), registry=self.registry)
        self.stalls = Counter(
            "seawall_worker_stalls", "Times a worker's core held requests and planned nothing for stall_warning_s "
            "(each logged with what it held)", ("worker",), registry=self.registry)
        self.requests_moved = Counter(
            "seawall_requests_moved", "Requests taken off a failed worker, or handed off with KV that died with "
            "one, and recomputed (their streams go on)", registry=self.registry)
        self.migrations = Counter(
            "seawall_migrations", "Running requests moved with their KV to a worker with more free KV memory "
            "(live migration, --migration-headroom)", ("src", "dst"), registry=self.registry)
        self.migration_pause = Histogram(
            "seawall_migration_pause_seconds", "Time a migrating request holds still: from when it stops being "
            "scheduled on its worker until its KV landed on the receiver (--migration-headroom)",
            registry=self.registry, buckets=LATENCY_BUCKETS)
        self.queued_moves = Counter(
            "seawall_queued_moves", "Requests without KV yet (queued, preempted for recompute, arrivals waiting for "
            "blocks) taken over by a worker with room from one short of KV memory (--migration-headroom)",
            ("src", "dst"), registry=self.registry)
        # Acceptance rate = accepted / draft (vLLM's spec_decode_num_draft_tokens / _num_accepted_tokens).
        self.draft_tokens = Counter(
            "seawall_spec_decode_draft_tokens", "Draft tokens verified by speculative decoding", ("worker",),
            registry=self.registry)
        self.accepted_tokens = Counter(
            "seawall_spec_decode_accepted_tokens", "Draft tokens kept: the sampler agreed with them", ("worker",),
            registry=self.registry)

    def watch(self, mesh) -> None:
        """Registers the scrape-time collector over ``mesh``."""
        self.registry.register(_MeshCollector(mesh))


class _MeshCollector:
    def __init__(self, mesh) -> None:
        self.mesh = mesh

    def _workers(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        workers = GaugeMetricFamily("seawall_workers", "Registered live workers by role", labels=["role"])
        draining = GaugeMetricFamily("seawall_workers_draining", "Of those, workers leaving (DrainWorker): they take "
                                     "no new request", labels=["role"])
        for role in ("prefill", "decode", "hybrid"):
            live = self.mesh.live_links(role)
            workers.add_metric([role], len(live))
            draining.add_metric([role], sum(link.drain is not None for link in live))
        return workers, draining

    def _lora_requests(self, cores) -> GaugeMetricFamily:
        """Live requests per LoRA adapter, as ``seawall_requests`` counts them (vLLM's lora_requests_info, as one
        series per adapter and state); adapters with no live request have none."""
        family = GaugeMetricFamily("seawall_lora_requests", "Live requests per LoRA adapter and state",
                                   labels=["lora_name", "state"])
        counts: dict[tuple[str, str], int] = {}
        waiting = [*self.mesh.unplaced, *(r for c in cores for r in c.waiting)]
        running = [r for c in cores for r in (*c.running, *c.arriving.values())]
        for state, reqs in (("running", running), ("waiting", waiting)):
            for req in reqs:
                if req.lora is not None:
                    counts[req.lora.name, state] = counts.get((req.lora.name, state), 0) + 1
        for labels, n in sorted(counts.items()):
            family.add_metric(list(labels), n)
        return family

    def collect(self):
        links = self.mesh.live_links()
        requests = GaugeMetricFamily("seawall_requests", "Live requests by state", labels=["state"])
        cores = [link.core for link in links]
        requests.add_metric(["running"], sum(len(c.running) + len(c.arriving) for c in cores))
        requests.add_metric(["waiting"], self.mesh.num_waiting)
        requests.add_metric(["swapped"], sum(len(c.swapped) for c in cores))
        yield requests
        yield self._lora_requests(cores)
        levels = GaugeMetricFamily("seawall_queue_length", "Waiting requests per queue level (MLFQ; 0 = highest)",
                                   labels=["worker", "level"])
        blocks = GaugeMetricFamily("seawall_kv_blocks", "KV blocks per worker pool and state",
                                   labels=["worker", "pool", "state"])
        preempt = CounterMetricFamily("seawall_preemptions", "Preemptions by kind", labels=["worker", "kind"])
        hits = CounterMetricFamily("seawall_prefix_cache_blocks", "Prompt blocks looked up in the prefix cache",
                                   labels=["worker", "result"])
        tails = CounterMetricFamily("seawall_prefix_cache_tail_tokens", "Prompt tokens copied from a finished "
                                    "request's partly filled last block instead of computed", labels=["worker"])
        states = GaugeMetricFamily("seawall_state_checkpoints", "Recurrent states a worker keeps for prefix caching "
                                   "(models with linear attention): saved and slots on the device, saved_host "
                                   "and host_slots in host memory", labels=["worker", "state"])
        for link in links:
            w, core = link.worker_id, link.core
            for level, n in enumerate(core.queue_lengths()):
                levels.add_metric([w, str(level)], n)
            for pool, bm in (("device", core.blocks), ("host", core.host_blocks)):
                if bm is None:
                    continue
                blocks.add_metric([w, pool, "used"], bm.num_blocks - bm.num_free)
                blocks.add_metric([w, pool, "free"], bm.num_free)
                blocks.add_metric([w, pool, "cached"], bm.num_cached)
            for kind, n in core.preemptions.items():
                preempt.add_metric([w, kind], n)
            stats = core.prefix_stats
            hits.add_metric([w, "hit"], stats.hit_blocks)
            hits.add_metric([w, "miss"], stats.queried_blocks - stats.hit_blocks)
            tails.add_metric([w], stats.tail_tokens)
            slots = core.checkpoints
            if slots.capacity:
                on_host = slots.num_on_host
                states.add_metric([w, "saved"], len(slots) - on_host)
                states.add_metric([w, "slots"], slots.capacity)
                states.add_metric([w, "saved_host"], on_host)
                states.add_metric([w, "host_slots"], slots.host_capacity)
        yield from (levels, blocks, preempt, hits, tails, states)
        yield from self._workers()
        peer = self.mesh.peer
        reads = CounterMetricFamily("seawall_peer_prefix_reads", "Prompts whose cached prefix a prefill worker read "
                                    "from a decode worker's prefix cache (disaggregated), by outcome",
                                    labels=["result"])
        for result, n in peer.reads.items():
            reads.add_metric([result], n)
        yield reads
        yield CounterMetricFamily("seawall_peer_prefix_tokens", "Prompt tokens read from a decode worker's prefix "
                                  "cache instead of computed", value=peer.tokens)
        dual = self.mesh.dual_path
        if dual is not None:  # the per-request decision; the kvcache service counts the bytes each path moved
            choices = CounterMetricFamily("seawall_dual_path_choices", "Prompts with a prefix in kvcache, by what "
                                          "the scheduler chose: load it via the prefill or the decode worker, or "
                                          "compute it (load-or-recompute)", labels=["choice"])
            for path, n in dual.loads.items():
                choices.add_metric([path], n)
            choices.add_metric(["recompute"], dual.recomputes)
            yield choices
