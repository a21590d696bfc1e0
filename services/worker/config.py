"""Configuration of one worker process (prefill, decode or hybrid)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.engine.config import EngineConfig

ROLES = ("prefill", "decode", "hybrid")
STEP_THREADS = ("auto", "loop", "own")


@dataclass(frozen=True)
class WorkerConfig:
    # "prefill" runs prompt chunks and hands KV off; "decode" continues sequences (and runs mixed batches when
    # colocated); "hybrid" does both. The role is advertised to the scheduler, which plans accordingly.
    role: str = "decode"
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Where the Worker service listens; port 0 picks a free port.
    host: str = "127.0.0.1"
    port: int = 0
    # The scheduler to register with once ready (host:port); None = wait for the scheduler to call Describe.
    scheduler_address: str | None = None
    # Register a NIXL agent over the KV pool (UCX backend), so peers move KV by RDMA/shared memory.
    # Without it, KV moves over the gRPC fallback (Worker.ReadKV / WriteKV).
    nixl: bool = True
    # torch intra-op threads; 0 = torch's default. Several workers on one host should split the cores.
    torch_threads: int = 0
    # Where steps (all torch work) run: "loop" on the event-loop thread, "own" on a thread of their own, "auto"
    # the loop on a CPU and its own thread on a GPU (services/engine/torch_thread.py says why).
    step_thread: str = "auto"
    # Prometheus text at http://host:metrics_port/metrics; 0 = off.
    metrics_port: int = 0
    # OTLP/gRPC endpoint for traces; None = the OTEL_EXPORTER_OTLP_ENDPOINT variable (unset: tracing off).
    otlp_endpoint: str | None = None
    # Name this worker's NIXL agent; empty = derived from the host, port and process id.
    name: str = ""
    # Emulated compute-NIC bandwidth of this worker's node, GB/s (10^9 bytes/s) per direction: KV pulled from
    # peers (PullKV) shares one token bucket, KV pushed to them (PushKV) another (services/common/shaper.py).
    # 0 = not shaped.
    compute_gbps: float = 0.0
    # Time a few steps before registering and report the fit (services/engine/step_profile.py), so the
    # scheduler's step-time model is this worker's. False: the scheduler assumes its default model.
    profile_steps: bool = True
    # On SIGTERM, leave the mesh without losing work for up to this long (DrainWorker: requests move to
    # workers that stay or finish here) before stopping; 0 = stop at once (the scheduler recomputes them).
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        for name in ("port", "metrics_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        if self.torch_threads < 0:
            raise ValueError(f"torch_threads must be >= 0 (0 = torch's default), got {self.torch_threads}")
        if self.step_thread not in STEP_THREADS:
            raise ValueError(f"step_thread must be one of {', '.join(STEP_THREADS)}, got {self.step_thread!r}")
        if not self.drain_timeout_s >= 0:  # NaN too
            raise ValueError(f"drain_timeout_s must be >= 0 (0 = stop at once), got {self.drain_timeout_s}")
        if self.compute_gbps < 0:
            raise ValueError(f"compute_gbps must be >= 0 GB/s (0 = not shaped), got {self.compute_gbps}")

    def steps_on_loop(self) -> bool:
        """Whether steps run on the event-loop thread (``step_thread``, "auto" resolved for this device)."""
        if self.step_thread == "auto":
            return self.engine.torch_device().type == "cpu"
        return self.step_thread == "loop"
