"""What the kvcache reports: Prometheus metrics and the names of its OpenTelemetry spans and attributes.

Metrics (``--metrics-port``; Prometheus text, ``seawall_kvcache_`` prefix, base units, ``_total`` counters).
Counted where calls end:

* ``seawall_kvcache_request_seconds{method}`` — histogram of Lookup / Load / Store wall time (queueing and
  shaping included); ``seawall_kvcache_requests_total{method,status}`` — calls by how they ended (``ok`` for a
  lookup; ``done``, ``not_found``, ``failed``, ``timed_out``, ``aborted`` for transfers; ``invalid_argument``
  etc. for refused calls; ``cancelled`` when the caller went away).
* ``seawall_kvcache_load_bytes_total{path,transport}`` — bytes loaded into workers by DualPath read path
  (``pe_read``, ``de_read``, ``unspecified``, from LoadRequest.path) and plane (``nixl``, ``grpc``);
  ``seawall_kvcache_store_bytes_total{transport}`` — bytes stored from workers.

Read from the store, the servicer and the shaper at scrape time (never duplicated, never stale):

* ``seawall_kvcache_lookups_total``; ``seawall_kvcache_lookup_blocks_total{result}`` — blocks asked for by
  lookups, by where the cached prefix found them (``dram``, ``disk``) or ``miss``; ``seawall_kvcache_hit_ratio
  {tier}`` — those hits over all blocks asked for, per tier and ``all``.
* per ``tier`` (``dram``, ``disk``): ``seawall_kvcache_tier_capacity_bytes``, ``_tier_used_bytes``,
  ``_tier_blocks``, ``_tier_read_bytes_total`` (loads), ``_tier_written_bytes_total`` (stores, promotions,
  demotions), ``_evictions_total``; ``seawall_kvcache_corrupt_blocks_total``.
* per ``tier`` (``dram``, ``disk``): ``seawall_kvcache_states`` — recurrent states held (hybrids', each stored
  after a block); ``seawall_kvcache_state_bytes{kind}`` — their bytes (``used``) and room (``capacity``);
  ``seawall_kvcache_state_evictions_total``.
* ``seawall_kvcache_queued_loads{endpoint}`` and ``seawall_kvcache_queued_bytes{endpoint}`` — loads queued or
  in flight per target worker and the bytes they still have to move (DualPath's storage-read queue);
  ``seawall_kvcache_queue_depth`` — all loads plus stores in flight.
* with shaping on: ``seawall_shaper_rate_bytes_per_second{class}``, and per bucket (``class``, ``node``,
  ``direction``) ``seawall_shaper_bytes_total``, ``seawall_shaper_wait_seconds_total`` (summed over callers)
  and ``seawall_shaper_backlog_seconds`` (how long a new transfer would wait now).

Spans (service ``seawall-kvcache``), children of the caller's context from gRPC metadata: ``seawall.kvcache
.lookup``, ``.load``, ``.store``, with the attributes below plus ``seawall.kv.path`` (the plane: nixl | grpc),
``seawall.kv.bytes``, ``seawall.kv.blocks`` (blocks found / loaded / newly stored), ``seawall.kv.tier``,
``seawall.kv.gb_per_s`` (bytes over the call's wall time) and ``seawall.kv.status``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from seawall.v1 import common_pb2, kvcache_pb2
from services.common.metrics import LATENCY_BUCKETS

_READ_PATHS = {
    kvcache_pb2.KV_READ_PATH_UNSPECIFIED: "unspecified",
    kvcache_pb2.KV_READ_PATH_PE_READ: "pe_read",
    kvcache_pb2.KV_READ_PATH_DE_READ: "de_read",
}


def read_path_name(path: int) -> str:
    return _READ_PATHS.get(path, "unspecified")


def status_name(status: int) -> str:
    """``done``, ``not_found``, ... of a ``common_pb2.TransferStatus``."""
    return common_pb2.TransferStatus.Name(status).removeprefix("TRANSFER_STATUS_").lower()


def tier_summary(num_dram: int, num_disk: int) -> str:
    """``dram``, ``disk``, ``dram+disk`` or ``none``: where a call's blocks were."""
    return "+".join(t for t, n in (("dram", num_dram), ("disk", num_disk)) if n) or "none"


class KVCacheMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.seconds = Histogram("seawall_kvcache_request_seconds",
                                 "Wall time of one kvcache call, queueing and shaping included", ("method",),
                                 registry=r, buckets=LATENCY_BUCKETS)
        self.requests = Counter("seawall_kvcache_requests", "kvcache calls by method and how they ended",
                                ("method", "status"), registry=r)
        self.load_bytes = Counter("seawall_kvcache_load_bytes",
                                  "Bytes loaded into workers, by DualPath read path and transport",
                                  ("path", "transport"), registry=r)
        self.store_bytes = Counter("seawall_kvcache_store_bytes", "Bytes stored from workers, by transport",
                                   ("transport",), registry=r)

    def watch(self, servicer) -> None:
        """Registers the scrape-time collector over a ``KVCacheServicer`` (its store, queues and shaper)."""
        self.registry.register(_KVCacheCollector(servicer))


class _KVCacheCollector:
    def __init__(self, servicer) -> None:
        self.servicer = servicer

    def collect(self):
        yield from self._lookups()
        yield from self._tiers()
        yield from self._states()
        yield from self._queues()
        yield from self._shaper()

    def _lookups(self):
        s = self.servicer.store.stats()
        yield CounterMetricFamily("seawall_kvcache_lookups", "Lookup calls", value=s.num_lookups)
        blocks = CounterMetricFamily("seawall_kvcache_lookup_blocks",
                                     "Blocks asked for by lookups: hits by tier, and misses", labels=["result"])
        blocks.add_metric(["dram"], s.hit_dram_blocks)
        blocks.add_metric(["disk"], s.hit_disk_blocks)
        blocks.add_metric(["miss"], s.miss_blocks)
        yield blocks
        asked = s.hit_blocks + s.miss_blocks
        ratio = GaugeMetricFamily("seawall_kvcache_hit_ratio",
                                  "Blocks a lookup found (per tier, and all) over blocks asked for, since start",
                                  labels=["tier"])
        for tier, hits in (("dram", s.hit_dram_blocks), ("disk", s.hit_disk_blocks), ("all", s.hit_blocks)):
            ratio.add_metric([tier], hits / asked if asked else 0.0)
        yield ratio
        yield CounterMetricFamily("seawall_kvcache_corrupt_blocks",
                                  "Disk blocks that failed their checks on read (deleted, served as misses)",
                                  value=s.num_corrupt)

    def _tiers(self):
        s = self.servicer.store.stats()
        fams = {
            "capacity": GaugeMetricFamily("seawall_kvcache_tier_capacity_bytes", "Capacity of a tier",
                                          labels=["tier"]),
            "used": GaugeMetricFamily("seawall_kvcache_tier_used_bytes", "Bytes of a tier holding blocks",
                                      labels=["tier"]),
            "blocks": GaugeMetricFamily("seawall_kvcache_tier_blocks", "Blocks held in a tier", labels=["tier"]),
            "read": CounterMetricFamily("seawall_kvcache_tier_read_bytes", "Block bytes read from a tier by loads",
                                        labels=["tier"]),
            "written": CounterMetricFamily("seawall_kvcache_tier_written_bytes",
                                           "Block bytes written to a tier (stores, promotions, demotions)",
                                           labels=["tier"]),
            "evictions": CounterMetricFamily("seawall_kvcache_evictions", "Blocks evicted from a tier",
                                             labels=["tier"]),
        }
        for tier, t in (("dram", s.dram), ("disk", s.disk)):
            if t is None:
                continue
            for key, value in (("capacity", t.capacity_bytes), ("used", t.used_bytes), ("blocks", t.num_blocks),
                               ("read", t.bytes_read), ("written", t.bytes_written),
                               ("evictions", t.num_evictions)):
                fams[key].add_metric([tier], value)
        yield from fams.values()

    def _states(self):
        states = self.servicer.store.states
        held = GaugeMetricFamily("seawall_kvcache_states", "Recurrent states held (hybrids'), by tier",
                                 labels=["tier"])
        nbytes = GaugeMetricFamily("seawall_kvcache_state_bytes", "Bytes of recurrent states held, and the room, "
                                   "by tier", labels=["tier", "kind"])
        evictions = CounterMetricFamily("seawall_kvcache_state_evictions", "Recurrent states evicted, by tier",
                                        labels=["tier"])
        for tier, n, used, room, evicted in (
                ("dram", len(states), states.used_bytes, states.capacity_bytes, states.num_evictions),
                ("disk", states.num_on_disk, states.disk_used, states.disk_bytes, states.num_disk_evictions)):
            held.add_metric([tier], n)
            nbytes.add_metric([tier, "used"], used)
            nbytes.add_metric([tier, "capacity"], room)
            evictions.add_metric([tier], evicted)
        yield from (held, nbytes, evictions)

    def _queues(self):
        queues = self.servicer.queues()
        loads = GaugeMetricFamily("seawall_kvcache_queued_loads", "Loads queued or in flight per target worker",
                                  labels=["endpoint"])
        nbytes = GaugeMetricFamily("seawall_kvcache_queued_bytes",
                                   "Bytes the loads of a target worker still have to move", labels=["endpoint"])
        for name, q in sorted(queues.items()):
            loads.add_metric([name], q.loads)
            nbytes.add_metric([name], q.bytes)
        yield loads
        yield nbytes
        yield GaugeMetricFamily("seawall_kvcache_queue_depth", "Loads and stores in flight",
                                value=self.servicer.queue_depth())

    def _shaper(self):
        shaper = self.servicer.mover.shaper
        if not shaper.enabled:
            return
        rate = GaugeMetricFamily("seawall_shaper_rate_bytes_per_second", "Shaped rate per node and direction",
                                 labels=["class"])
        for cls, r in sorted(shaper.rates.items()):
            rate.add_metric([cls], r)
        yield rate
        labels = ["class", "node", "direction"]
        nbytes = CounterMetricFamily("seawall_shaper_bytes", "Bytes that passed a shaped NIC", labels=labels)
        waited = CounterMetricFamily("seawall_shaper_wait_seconds",
                                     "Seconds transfers waited for a shaped NIC, summed over transfers",
                                     labels=labels)
        backlog = GaugeMetricFamily("seawall_shaper_backlog_seconds",
                                    "How long a transfer starting now would wait for a shaped NIC", labels=labels)
        for key, bucket in sorted(shaper.buckets().items(), key=lambda kv: (kv[0].traffic_class, kv[0].node,
                                                                              kv[0].direction)):
            values = [key.traffic_class, key.node, key.direction]
            nbytes.add_metric(values, bucket.bytes)
            waited.add_metric(values, bucket.waited_s)
            backlog.add_metric(values, bucket.delay())
        yield from (nbytes, waited, backlog)
