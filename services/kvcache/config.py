"""Configuration of the kvcache process: one frozen dataclass, validated without I/O (STYLE §4)."""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.kv_pool import KVLayout


@dataclass(frozen=True)
class KVCacheConfig:
    # Where the KVCache service listens; port 0 picks a free port.
    host: str = "127.0.0.1"
    port: int = 0
    # Bytes of the DRAM tier: host memory laid out as a block-major pool, registered with NIXL. Loads from disk
    # and stores are staged here, so it must hold at least one block of the layout.
    dram_bytes: int = 1 << 30
    # Bytes of host memory for recurrent states stored with blocks (models with linear-attention layers; one
    # state per stored turn, state_store.py). 0 = store none: such a model's turns then resume only from the
    # workers' own saved states.
    state_bytes: int = 1 << 30
    # With disk_dir: bytes of the disk tier's state files (the states memory makes room by, and the rest at
    # shutdown, so a restart finds them); 0 = states in memory only.
    state_disk_bytes: int = 4 << 30
    # Directory of the disk tier (one file per block); None = no disk tier (DRAM evictions drop blocks).
    disk_dir: str | None = None
    # Bytes the disk tier may fill (block files, headers included). Required with disk_dir.
    disk_bytes: int = 0
    # Register the DRAM tier with a NIXL agent (UCX backend), so loads and stores move bytes by NIXL WRITE/READ.
    # Without it (or when a peer sent no NIXL metadata) KV moves over Worker.WriteKV / ReadKV.
    nixl: bool = True
    # Threads reading or writing block files at once: the disk tier's queue depth.
    io_threads: int = 4
    # Name of this process's NIXL agent; empty = derived from the host name and process id.
    name: str = ""
    # The KV layout blocks must have; None = fixed by the disk tier on start, else by the first Store.
    layout: KVLayout | None = None
    # Longest pin a Lookup may ask for (ms); longer pin_ms values are clipped to it.
    max_pin_ms: int = 60_000
    # Deadline of a Load or Store whose timeout_ms is 0 (s).
    default_timeout_s: float = 600.0
    # On shutdown, write DRAM blocks that have no disk copy to the disk tier, so a restart still serves them.
    flush_on_exit: bool = True
    # Prometheus text at http://host:metrics_port/metrics; 0 = off.
    metrics_port: int = 0
    # OTLP/gRPC endpoint for traces; None = the OTEL_EXPORTER_OTLP_ENDPOINT variable (unset: tracing off).
    otlp_endpoint: str | None = None
    # Emulated storage-NIC bandwidth of each worker node, GB/s (10^9 bytes/s) per direction: Loads into one
    # worker share one token bucket, Stores out of it another (services/common/shaper.py). 0 = not shaped.
    storage_gbps: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.dram_bytes <= 0:
            raise ValueError(f"dram_bytes must be > 0 (loads and stores are staged in DRAM), got {self.dram_bytes}")
        if self.state_bytes < 0:
            raise ValueError(f"state_bytes must be >= 0 (0 = store no recurrent states), got {self.state_bytes}")
        if self.state_disk_bytes < 0:
            raise ValueError(f"state_disk_bytes must be >= 0 (0 = states in memory only), got {self.state_disk_bytes}")
        if self.disk_dir is not None and self.disk_bytes <= 0:
            raise ValueError(f"a disk tier at {self.disk_dir!r} needs a capacity: give --disk-bytes N (> 0)")
        if self.disk_dir is None and self.disk_bytes:
            raise ValueError("--disk-bytes without --disk-dir: give the directory of the disk tier too")
        if self.io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {self.io_threads}")
        if self.max_pin_ms < 0:
            raise ValueError(f"max_pin_ms must be >= 0, got {self.max_pin_ms}")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in [0, 65535] (0 = off), got {self.metrics_port}")
        if self.storage_gbps < 0:
            raise ValueError(f"storage_gbps must be >= 0 GB/s (0 = not shaped), got {self.storage_gbps}")
        if self.default_timeout_s <= 0:
            raise ValueError(f"default_timeout_s must be > 0, got {self.default_timeout_s}")
        if self.layout is not None and self.dram_bytes < self.layout.bytes_per_block:
            raise ValueError(f"dram_bytes={self.dram_bytes} holds no block of the layout "
                             f"({self.layout.bytes_per_block} bytes each); raise --dram-bytes")
