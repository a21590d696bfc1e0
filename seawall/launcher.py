"""Runs the mesh as local processes on loopback: what ``seawall up`` and the end-to-end tests use.

Starts the scheduler, waits until its gRPC health check passes, starts the workers (which register with
it), waits until every worker has registered, and on ``stop()`` sends SIGTERM to the workers at once, then
to the scheduler and the kvcache (each SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.credentials import API_KEY_ENV, bearer_metadata
from services.common.errors import EXIT_PORT_IN_USE, InvalidArgument, Unavailable
from services.engine.checkpoint import resolve_model_dir


@dataclass
class MeshOptions:
    model: str | None = None
    mode: str = "disaggregated"
    # disaggregated: prefill and decode workers; colocated: ``num_decode`` hybrid workers.
    num_prefill: int = 1
    num_decode: int = 1
    host: str = "127.0.0.1"
    grpc_port: int = 50051  # 0 = a free port
    http_port: int | None = 8000  # None = no HTTP API; 0 = a free port
    # Extra flags passed through: to the scheduler (policy, chunk size...) and to every worker.
    scheduler_args: list[str] = field(default_factory=list)
    worker_args: list[str] = field(default_factory=list)
    # Start a kvcache service (multi-turn KV reuse, DualPath) and point the scheduler at it.
    kvcache: bool = False
    kvcache_args: list[str] = field(default_factory=list)
    # Where children write their logs; None = inherit this process's stdout and stderr.
    log_dir: Path | None = None
    startup_timeout_s: float = 300.0
    # Torch threads per worker; 0 = this machine's cores split evenly across the workers. Fewer leave cores
    # to other work on the box (scheduler, clients, other services); bench/README.md, "Worker threads", has
    # what that did on 2 cores.
    torch_threads: int = 0
    # The key clients must send (services/scheduler/api_key.py); None = none. Given to the scheduler in its
    # environment, not as a flag that the process list shows.
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Refused here, before any process starts: a mesh without a worker came up "ready" and held every
        # request forever, a negative count passed as 0, and a bad port failed in the scheduler with a traceback.
        if self.mode == "colocated":
            if self.num_decode < 1:
                raise InvalidArgument(f"--workers must be >= 1, got {self.num_decode}")
        elif min(self.num_prefill, self.num_decode) < 0 or self.num_prefill + self.num_decode < 1:
            raise InvalidArgument(f"--prefill and --decode must be >= 0 and add up to at least one worker, got "
                                  f"{self.num_prefill} and {self.num_decode}")
        for flag, port in (("--grpc-port", self.grpc_port), ("--http-port", self.http_port)):
            if port is not None and not 0 <= port <= 65535:
                raise InvalidArgument(f"{flag} must be in [0, 65535] (0 = a free one), got {port}")

    @property
    def worker_roles(self) -> list[str]:
        if self.mode == "colocated":
            return ["decode"] * self.num_decode
        return ["prefill"] * self.num_prefill + ["decode"] * self.num_decode


def worker_threads(options: MeshOptions, cpus: int) -> int:
    """Torch threads each worker gets: the caller's choice, or the cores split evenly across the workers."""
    if options.torch_threads < 0:
        raise InvalidArgument(f"torch_threads must be >= 0 (0 = split the cores), got {options.torch_threads}")
    return options.torch_threads or max(1, cpus // max(1, len(options.worker_roles)))


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path | None
    module_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = field(default=None, repr=False)  # None: this process's
    # How ``stop`` ends it: this signal, then SIGKILL after this many seconds (None = ``stop``'s grace).
    stop_signal: int = signal.SIGTERM
    stop_grace_s: float | None = None


class LocalMesh:
    def __init__(self, options: MeshOptions) -> None:
        self.options = options
        self.children: list[Child] = []
        self.grpc_address = ""
        self.http_url = ""
        self.metrics_urls: dict[str, str] = {}  # child name -> its Prometheus endpoint
        self.worker_addresses: dict[str, str] = {}  # worker child name -> its Worker service's host:port
        self.kvcache_address = ""
        # Set by a Ctrl-C: ``stopping`` gives up a start in progress (it raises KeyboardInterrupt once what it
        # started is stopped); ``forced`` (a second one) kills the children without waiting for them to finish.
        self.stopping = threading.Event()
        self.forced = threading.Event()

    def __enter__(self) -> LocalMesh:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> None:
        """Starts every child; if any step fails, the children already started are stopped first.

        A port picked here is free when picked but only bound by the child seconds later; if another process
        took it meanwhile, the child exits with ``EXIT_PORT_IN_USE`` and the whole start is tried again on newly
        picked ports (up to ``attempts`` times).
        """
        for attempt in range(1, attempts + 1):
            try:
                self._launch()
                return
            except _PortTaken as exc:
                self.stop()
                if attempt == attempts or not self._picked_all_ports_of(exc.child):
                    raise
            except BaseException:
                self.stop()
                raise

    def _launch(self) -> None:
        o = self.options
        model = resolve_model_dir(o.model)  # create the built-in model once, before the children race for it
        grpc_port = o.grpc_port or free_port(o.host)
        http_port = None if o.http_port is None else (o.http_port or free_port(o.host))
        self.grpc_address = f"{o.host}:{grpc_port}"
        self.http_url = f"http://{o.host}:{http_port}" if http_port else ""
        if http_port:
            self.metrics_urls["scheduler"] = f"{self.http_url}/metrics"
        mode_args = ["--mode", o.mode]
        # Every child starts at once: each spends seconds importing torch and loading, and none needs another
        # up to start (workers retry registering until the scheduler answers; the scheduler reaches the
        # kvcache per request). On this 2-core box the default mesh came up in 10-13 s in sequence, 5-6 s at once
        # (with the kvcache: 13-16 s, 9 s).
        if o.kvcache:
            kv_port = free_port(o.host)
            self.kvcache_address = f"{o.host}:{kv_port}"
            self._spawn("kvcache", ["services.kvcache", "--host", o.host, "--port", str(kv_port), *o.kvcache_args])
            mode_args += ["--kvcache", self.kvcache_address]
        # The key only from the options: one this process's environment holds is not the mesh's unless asked.
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
        if o.api_key:
            env[API_KEY_ENV] = o.api_key
        # No drain on stop, for the scheduler or the workers: stop() ends the whole mesh, so no worker would be
        # left to take a draining one's requests, nor to finish the scheduler's.
        self._spawn("scheduler", ["services.scheduler", "--model", model, "--host", o.host, "--grpc-port",
                                  str(grpc_port), "--http-port", str(http_port or 0), "--drain-timeout-s", "0",
                                  *mode_args, *o.scheduler_args], env)
        threads = worker_threads(o, os.cpu_count() or 1)
        for i, role in enumerate(o.worker_roles):
            port, metrics_port = free_port(o.host), free_port(o.host)
            self._spawn(f"{role}-{i}", [f"services.{role}", "--model", model, "--host", o.host, "--port", str(port),
                                        "--scheduler", self.grpc_address, "--torch-threads", str(threads),
                                        "--metrics-port", str(metrics_port), "--drain-timeout-s", "0",
                                        *o.worker_args])
            self.metrics_urls[f"{role}-{i}"] = f"http://{o.host}:{metrics_port}/metrics"
            self.worker_addresses[f"{role}-{i}"] = f"{o.host}:{port}"
        if o.kvcache and not _wait_healthy(self.kvcache_address, o.startup_timeout_s, self._check_children):
            raise Unavailable(f"kvcache did not become healthy{self._log_hint()}")
        n = len(o.worker_roles)
        self._wait(lambda stats: len(stats.workers) >= n, f"{n} workers to register")

    def _spawn(self, name: str, module_args: list[str], env: dict[str, str] | None = None) -> None:
        log_path = None
        out = None
        if self.options.log_dir is not None:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.options.log_dir / f"{name}.log"
            out = log_path.open("ab")
        proc = subprocess.Popen([sys.executable, "-m", *module_args], stdout=out, stderr=subprocess.STDOUT if out
                                else None, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        if out is not None:
            out.close()
        self.children.append(Child(name, proc, log_path, module_args, env))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        with grpc.insecure_channel(self.grpc_address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            while time.monotonic() < deadline:
                self._check_children()
                try:
                    if ready(stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=2.0,
                                           metadata=bearer_metadata(self.options.api_key))):
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise Unavailable(f"timed out after {self.options.startup_timeout_s:.0f} s waiting for {what}"
                          f"{self._log_hint()}")

    def _check_children(self) -> None:
        """Raises if a child exited during start-up, or KeyboardInterrupt if the start was given up."""
        self._check_stopping()
        for child in self.children:
            if child.proc.poll() is not None:
                message = (f"{child.name} exited with code {child.proc.returncode} during start-up"
                           f"{self._log_hint(child)}")
                if child.proc.returncode == EXIT_PORT_IN_USE:
                    raise _PortTaken(message, child)
                raise Unavailable(message)

    def _check_stopping(self) -> None:
        if self.stopping.is_set():
            raise KeyboardInterrupt

    def _picked_all_ports_of(self, child: Child) -> bool:
        """Whether every port ``child`` listens on was picked here (a port the caller fixed is not retried)."""
        o = self.options
        return child.name != "scheduler" or (not o.grpc_port and not o.http_port)

    def _log_hint(self, child: Child | None = None) -> str:
        paths = [c.log_path for c in ([child] if child else self.children) if c.log_path]
        hint = f"; see {', '.join(map(str, paths))}" if paths else ""
        if child is not None and child.log_path is not None:
            # The log may be gone by the time anyone reads the error (a CI runner's temp dir): carry its end.
            hint += _log_tail(child.log_path)
        return hint

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def counter(self, name: str, **labels: str) -> float:
        """A counter of this mesh's scheduler (``name`` without ``_total``), summed over the samples that carry
        ``labels``; 0 before it first counts. The mesh needs its HTTP API: /metrics is served there."""
        return self._sum_samples(name, "_total", labels)

    def histogram(self, name: str, **labels: str) -> tuple[float, float]:
        """A histogram of this mesh's scheduler: (observations, their sum), over the samples with ``labels``."""
        return self._sum_samples(name, "_count", labels), self._sum_samples(name, "_sum", labels)

    def gauge(self, name: str, child: str = "scheduler", **labels: str) -> float:
        """A gauge of one child (``scheduler``, ``decode-0``...), summed over the samples with ``labels``."""
        return self._sum_samples(name, "", labels, child)

    def _sum_samples(self, name: str, suffix: str, labels: dict[str, str], child: str = "scheduler") -> float:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.metrics_urls[child], timeout=10) as response:
            text = response.read().decode()
        family = next((f for f in text_string_to_metric_families(text) if f.name == name), None)
        if family is None:
            return 0.0
        return sum(s.value for s in family.samples
                   if s.name.endswith(suffix) and all(s.labels.get(k) == v for k, v in labels.items()))

    def kill(self, name: str) -> None:
        """Kills one child at once (SIGKILL): a crash, for failure tests."""
        c = self.child(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(c.proc.pid, signal.SIGKILL)
        c.proc.wait(10)

    def respawn(self, name: str, address: str | None = None) -> None:
        """Starts a child that exited (or was killed) again, with the same arguments and ports; with
        ``address``, returns once its gRPC health service there answers SERVING."""
        old = self.child(name)
        assert old.proc.poll() is not None, f"{name} is still running"
        self.children.remove(old)
        self._spawn(name, old.module_args, old.env)
        if address is not None and not _wait_healthy(address, self.options.startup_timeout_s, self._check_children):
            raise Unavailable(f"{name} did not become healthy again{self._log_hint()}")

    def stop(self, grace_s: float = 10.0) -> dict[str, int]:
        """Stops every child and returns each one's exit code.

        The children stop group by group (``_stop_groups``), each group's at once: each gets its stop signal
        and, once its grace period is over or ``forced`` is set, SIGKILL.
        """
        codes = {}
        for group in self._stop_groups():
            _stop_together(group, grace_s, self.forced)
            codes.update((child.name, child.proc.returncode) for child in group)
        self.children.clear()
        return codes

    def _stop_groups(self) -> list[list[Child]]:
        """The workers together first (the scheduler sees them leave), then the rest one by one, newest first."""
        workers = [c for c in reversed(self.children) if c.name in self.worker_addresses]
        return [workers] + [[c] for c in reversed(self.children) if c not in workers]


def _stop_together(children: list[Child], grace_s: float, force: threading.Event) -> None:
    """Signals every child at once, then waits for each until its own deadline (or ``force``), then kills it."""
    now = time.monotonic()
    deadlines = {}
    for child in children:
        if child.proc.poll() is None:
            if not force.is_set():  # forced: killed below without a chance to finish
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(child.stop_signal)
            deadlines[child.name] = now + (grace_s if child.stop_grace_s is None else child.stop_grace_s)
    for child in children:
        if child.name not in deadlines:
            continue
        while child.proc.poll() is None:
            if force.is_set() or time.monotonic() >= deadlines[child.name]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(0.05)


def _wait_healthy(address: str, timeout_s: float, check) -> bool:
    """Polls the gRPC health service at ``address``; ``check`` raises if a child died meanwhile."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            check()
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


class _PortTaken(Unavailable):
    """A child exited because a port it was given had been taken since it was picked."""

    def __init__(self, message: str, child: Child) -> None:
        super().__init__(message)
        self.child = child


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "; its log ends:\n" + "\n".join("    " + line for line in tail) if tail else ""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now and stays free until a child binds it.

    A port from ``bind(("", 0))`` lies in the kernel's ephemeral range, which every outgoing connection and
    every ``bind(0)`` also draws from, so between this call and the child's bind, seconds later, another
    process could take it. Below that range only explicit binds land, so pick one there at random and check
    that it binds. Explicit binds at random ports still happen (a NIXL agent's UCX listeners were seen at
    29075), so a child whose port was taken exits with ``EXIT_PORT_IN_USE`` and ``start`` tries again.
    """
    low = _ephemeral_range()[0]
    if low > _FIRST_PICKED_PORT + 1000:
        rng = random.Random()  # seeded from the OS: independent across processes
        for _ in range(100):
            port = rng.randrange(_FIRST_PICKED_PORT, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# Above most registered service ports; the bind check skips any that is in use.
_FIRST_PICKED_PORT = 20000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 0, 0  # unknown (not Linux): fall back to bind(0)
