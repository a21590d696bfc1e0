"""Process entry of a worker: ``python -m services.prefill`` / ``services.decode`` / ``services.worker``.

Loads the model, registers the KV pool with a NIXL agent, serves the Worker service (plus health and
reflection), registers with the scheduler, and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket

import anyio
import grpc
from prometheus_client import CollectorRegistry

from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from services.common import gc_pauses, grpc_kv
from services.common import tracing as tr
from services.common.errors import Unavailable, error_for_code
from services.common.grpc_server import CHANNEL_OPTIONS, Server, run_service, wait_for_shutdown_signal
from services.common.metrics import serve_metrics
from services.common.rpc import rpc
from services.common.tracing import setup_tracing
from services.engine.config import EngineConfig, add_kv_cache_dtype_flag
from services.engine.model_config import add_max_model_len_flag
from services.engine.runner import ModelRunner
from services.engine.step_profile import profile_step_time
from services.engine.torch_thread import InlineTorch, TorchThread
from services.worker.config import ROLES, STEP_THREADS, WorkerConfig
from services.worker.servicer import WorkerMetrics, WorkerServicer

log = logging.getLogger(__name__)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="Hugging Face checkpoint dir (default: the built-in model)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="bytes of KV pool (default: see docs)")
    add_kv_cache_dtype_flag(p)
    p.add_argument("--swap-bytes", type=int, default=256 * 2**20, help="bytes of host swap pool")
    p.add_argument("--no-cpu-kernels", action="store_true",
                   help="CPU fp32 attention, norms and RoPE as plain torch ops instead of the fused C kernels")
    p.add_argument("--max-cpu-loras", type=int, default=8,
                   help="LoRA adapters kept loaded besides those running sequences use (default 8)")
    p.add_argument("--state-slots", type=int, default=256,
                   help="a model with linear-attention layers (Qwen3-Next, Qwen3.5): sequences whose recurrent "
                        "states a CUDA worker allocates before sizing its KV pool (default 256)")
    p.add_argument("--state-checkpoints", type=int, default=16,
                   help="a model with linear-attention layers: recurrent states kept for prefix caching, one saved "
                        "at the end of each prompt's last full block (default 16; 0: no prefix caching for it)")
    p.add_argument("--host-state-checkpoints", type=int, default=64,
                   help="and more kept in host memory, where the least recently used go when a save needs their "
                        "slot (default 64; 0: they are dropped)")
    add_max_model_len_flag(p)


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(model=args.model, device=args.device, dtype=args.dtype, block_size=args.block_size,
                        kv_cache_bytes=args.kv_cache_bytes, kv_cache_dtype=args.kv_cache_dtype,
                        swap_bytes=args.swap_bytes,
                        cpu_kernels=not args.no_cpu_kernels, max_idle_loras=args.max_cpu_loras,
                        max_model_len=args.max_model_len, state_slots=args.state_slots,
                        state_checkpoints=args.state_checkpoints, host_state_checkpoints=args.host_state_checkpoints)


def parse_args(argv: list[str] | None, role: str | None) -> WorkerConfig:
    p = argparse.ArgumentParser(prog=f"python -m services.{role or 'worker'}", description=__doc__)
    if role is None:
        p.add_argument("--role", choices=ROLES, default="hybrid")
    add_engine_flags(p)
    p.add_argument("--host", default=os.environ.get("SEAWALL_HOST", "127.0.0.1"), help="listen address")
    p.add_argument("--port", type=int, default=0, help="listen port (default: a free one)")
    p.add_argument("--scheduler", default=os.environ.get("SEAWALL_SCHEDULER"),
                   help="scheduler host:port to register with (env SEAWALL_SCHEDULER)")
    p.add_argument("--advertise", default=None,
                   help="host the scheduler and peers should use to reach this worker (default: --host)")
    p.add_argument("--no-nixl", action="store_true", help="no NIXL agent: KV moves over the gRPC fallback")
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    p.add_argument("--step-thread", choices=STEP_THREADS, default="auto",
                   help="run steps on the event-loop thread (loop) or a thread of their own (own); default auto: "
                        "the loop on a CPU, their own thread on a GPU")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus text on this port (0 = off)")
    p.add_argument("--otlp-endpoint", default=None,
                   help="export traces over OTLP/gRPC here (default: $OTEL_EXPORTER_OTLP_ENDPOINT; unset = off)")
    p.add_argument("--compute-gbps", type=float, default=0.0,
                   help="shape KV pulled from (and pushed to) peer workers to this many GB/s (10^9 bytes/s) per "
                        "direction (default 0 = not shaped)")
    p.add_argument("--no-step-profile", action="store_true",
                   help="do not time steps at start-up (the scheduler then assumes its default step-time model)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="on SIGTERM, first leave the mesh without losing work for up to this long: its requests "
                        "move to the workers that stay, or finish here (default 30; 0 = stop at once, and the "
                        "scheduler recomputes them elsewhere)")
    p.add_argument("--log-level", default=os.environ.get("SEAWALL_LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return WorkerConfig(role=role or args.role, engine=engine_config_from(args), host=args.host, port=args.port,
                        scheduler_address=args.scheduler, nixl=not args.no_nixl, torch_threads=args.torch_threads,
                        step_thread=args.step_thread,
                        name=args.advertise or "", metrics_port=args.metrics_port,
                        otlp_endpoint=args.otlp_endpoint, compute_gbps=args.compute_gbps,
                        profile_steps=not args.no_step_profile, drain_timeout_s=args.drain_timeout_s)


async def serve(config: WorkerConfig) -> None:
    on_loop = config.steps_on_loop()
    torch_thread = (InlineTorch if on_loop else TorchThread)(config.torch_threads)
    runner = torch_thread.call(ModelRunner, config.engine)
    # On the thread that runs the steps, before any: the fit is of the steps this worker will run.
    step_time = torch_thread.call(profile_step_time, runner) if config.profile_steps else None
    if step_time is not None:
        log.info("step time: %.3f ms + %.4f ms/token + %.4f ms/sequence", step_time.base_s * 1e3,
                 step_time.per_token_s * 1e3, step_time.per_seq_s * 1e3)
    server = Server()
    advertise_host = config.name or config.host
    agent = _nixl_agent(config, runner, advertise_host)
    registry = CollectorRegistry()
    tracing = setup_tracing(tr.PREFILL if config.role == "prefill" else tr.DECODE, config.otlp_endpoint)
    servicer = WorkerServicer(config, runner, agent, WorkerMetrics(registry), tracing, torch_thread, step_time)
    serve_metrics(registry, config.host, config.metrics_port)
    server.add(grpc_kv.add_worker_servicer, servicer,
               worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name)
    port = await server.start(config.host, config.port)
    address = f"{advertise_host}:{port}"
    log.info("%s worker serving on %s (%d device blocks, %d torch thread(s), steps on %s)", config.role, address,
             runner.kv.num_blocks, torch_thread.num_threads,
             "the event-loop thread" if on_loop else "their own thread")
    gc_metrics = gc_pauses.after_startup(registry)
    try:
        async with anyio.create_task_group() as tg:
            if config.scheduler_address:
                await register(config.scheduler_address, address, servicer.info())
                tg.start_soon(stay_registered, config.scheduler_address, address, servicer)
            await wait_for_shutdown_signal()
            tg.cancel_scope.cancel()  # draining, it must not register again when the scheduler lets it go
        if config.scheduler_address and config.drain_timeout_s > 0:
            await drain(config.scheduler_address, address, server, config.drain_timeout_s)
    finally:
        gc_metrics.close()
        servicer.close_streams()
        await server.stop()
        if agent is not None:
            agent.close()
        tracing.shutdown()
        torch_thread.close()


def _nixl_agent(config: WorkerConfig, runner: ModelRunner, host: str):
    if not config.nixl or not runner.kv.layout.bytes_per_block:  # an attention-free model's blocks hold nothing
        return None
    from services.common.kv_transport import NixlKVAgent

    name = f"{config.role}-{host}-{socket.gethostname()}-{os.getpid()}"
    try:
        return NixlKVAgent(name, runner.kv)
    except Exception as exc:  # noqa: BLE001 - any NIXL/UCX start-up failure means: use the gRPC fallback
        log.warning("NIXL is unavailable (%s); KV moves over the gRPC fallback", exc)
        return None


async def register(scheduler: str, address: str, info: worker_pb2.WorkerInfo, timeout_s: float = 120.0) -> str:
    """Announces this worker to the scheduler, retrying while it starts."""
    # gRPC backs off reconnecting up to 2 minutes: a scheduler down for a while would then be found that late.
    options = [*CHANNEL_OPTIONS, ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]
    with anyio.move_on_after(timeout_s):
        async with grpc.aio.insecure_channel(scheduler, options=options) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            while True:
                try:
                    reply = await rpc(stub.RegisterWorker(
                        scheduler_pb2.RegisterWorkerRequest(address=address, info=info), timeout=5.0))
                    log.info("registered with the scheduler at %s as %s", scheduler, reply.worker_id)
                    return reply.worker_id
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        # A refusal (a TBT target this worker cannot meet, another model): one line, exit 2.
                        raise error_for_code(exc.code().name, f"the scheduler at {scheduler} refused this worker: "
                                                              f"{exc.details()}") from None
                await anyio.sleep(0.2)
    raise Unavailable(f"the scheduler at {scheduler} did not answer within {timeout_s:.0f} s")


async def stay_registered(scheduler: str, address: str, servicer: WorkerServicer, pause_s: float = 0.5) -> None:
    """Registers again each time the scheduler's step stream ends: a scheduler that restarted (a crash, a
    redeploy) or dropped this worker (a step past its timeout) would otherwise never send it work again. The new
    registration's plans carry a new scheduler id, so the worker drops what it held for the old one."""
    while True:
        await servicer.stream_lost.wait()
        servicer.stream_lost.clear()
        log.warning("the scheduler's step stream ended; registering with %s again", scheduler)
        await anyio.sleep(pause_s)  # a worker the scheduler keeps dropping rejoins at this pace, not in a loop
        await register(scheduler, address, servicer.info(), timeout_s=math.inf)


async def drain(scheduler: str, address: str, server: Server, timeout_s: float) -> None:
    """Leaves the mesh without losing work (``Scheduler.DrainWorker``): returns once the scheduler moved or
    finished every request this worker held, after ``timeout_s``, or at a second signal. Meanwhile the worker
    runs the steps it is sent and serves its KV to the peers taking its requests; health says NOT_SERVING."""
    await server.set_serving(False)
    log.info("draining: moving this worker's requests to others or finishing them here (up to %g s; signal "
             "again to stop now)", timeout_s)
    async with anyio.create_task_group() as tg:
        async def again() -> None:
            await wait_for_shutdown_signal()
            tg.cancel_scope.cancel()

        tg.start_soon(again)
        try:
            async with grpc.aio.insecure_channel(scheduler, options=CHANNEL_OPTIONS) as channel:
                reply = await rpc(scheduler_pb2_grpc.SchedulerStub(channel).DrainWorker(
                    scheduler_pb2.DrainWorkerRequest(address=address), timeout=timeout_s))
            log.info("drained: %d requests moved to other workers, %d finished here", reply.num_moved,
                     reply.num_finished)
        except grpc.aio.AioRpcError as exc:
            log.warning("stopping undrained (%s: %s): the scheduler recomputes what this worker held elsewhere",
                        exc.code().name, exc.details())
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None, role: str | None = None) -> int:
    return run_service(lambda: parse_args(argv, role), serve)
