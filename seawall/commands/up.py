"""``seawall up``: start the whole mesh on this machine, on the built-in model by default.

Starts the scheduler (gRPC on 127.0.0.1:50051, OpenAI HTTP API on 127.0.0.1:8000) and the workers (by
default disaggregated: one prefill and one decode worker, KV moving between them over NIXL) as local
processes, waits until every worker has registered, prints the endpoints, and serves until Ctrl-C or
SIGTERM, then stops every child cleanly.

    seawall up                                     # built-in model, disaggregated 1 prefill + 1 decode
    seawall up --mode colocated --workers 2        # two workers running mixed batches (Sarathi-Serve)
    seawall up --model ~/models/Llama-3.2-1B --policy fastserve --http-port 8080
    seawall up --model ~/models/Llama-3.2-1B --lora-modules sql=~/loras/sql chat=~/loras/chat
    seawall up --compose docker-compose.yml        # the compose topology, as local processes
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from seawall.commands.trace import default_trace_file
from seawall.compose import ComposeMesh, ComposeOptions
from seawall.launcher import LocalMesh, MeshOptions
from seawall.trace_receiver import TraceReceiver
from services.common.errors import InvalidArgument
from services.common.lora import read_lora
from services.common.step import LoraRef
from services.engine.checkpoint import resolve_model_dir
from services.engine.config import add_kv_cache_dtype_flag
from services.engine.model_config import ModelConfig, add_max_model_len_flag
from services.scheduler.main import (
    add_api_flags,
    add_lora_flags,
    add_scheduling_flags,
    add_served_model_name_flag,
    api_flags,
    core_config_from,
    lora_flags,
    scheduling_flags,
)
from services.scheduler.reasoning_parsers import PARSERS as REASONING_PARSERS
from services.scheduler.tool_parsers import PARSERS
from services.worker.config import STEP_THREADS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start the mesh (scheduler + workers) on this machine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="Hugging Face checkpoint dir (default: the built-in model)")
    p.add_argument("--host", default="127.0.0.1", help="address every service listens on (default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, default=50051, help="scheduler gRPC port (default 50051; 0 = free)")
    p.add_argument("--http-port", type=int, default=8000, help="OpenAI HTTP API port (default 8000; 0 = free)")
    add_api_flags(p)
    add_served_model_name_flag(p)
    p.add_argument("--prefill", type=int, default=1, help="prefill workers when disaggregated (default 1)")
    p.add_argument("--decode", type=int, default=1, help="decode workers when disaggregated (default 1)")
    p.add_argument("--workers", type=int, default=1, help="hybrid workers when colocated (default 1)")
    add_scheduling_flags(p)
    p.add_argument("--device", default="auto", help="workers' torch device: cpu, cuda, cuda:N or auto")
    add_worker_thread_flags(p)
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="KV pool bytes per worker")
    add_kv_cache_dtype_flag(p)
    add_max_model_len_flag(p)
    p.add_argument("--no-nixl", action="store_true", help="workers start no NIXL agent (gRPC KV fallback)")
    p.add_argument("--no-cpu-kernels", action="store_true",
                   help="workers run CPU attention, norms and RoPE as plain torch ops, not the fused C kernels")
    p.add_argument("--storage-gbps", type=float, default=0.0,
                   help="shape each worker node's storage traffic (kvcache loads/stores) to this many GB/s (0 = off)")
    p.add_argument("--compute-gbps", type=float, default=0.0,
                   help="shape each worker's KV pulls from peers to this many GB/s (0 = off)")
    p.add_argument("--tool-call-parser", choices=tuple(PARSERS), default=None,
                   help="read tool calls in the model's own syntax, for tool_choice \"auto\" (default: none)")
    p.add_argument("--reasoning-parser", choices=tuple(REASONING_PARSERS), default=None,
                   help="return a chat reply's thinking (<think>...</think>, or harmony's analysis channel) as "
                        "reasoning_content (default: none)")
    p.add_argument("--structured-output-in-reasoning", action="store_true",
                   help="with --reasoning-parser: constrain a structured output from the reply's first token, "
                        "thought included (default: the answer after the thought)")
    add_lora_flags(p)
    p.add_argument("--max-cpu-loras", type=int, default=8,
                   help="LoRA adapters each worker keeps loaded besides those its running sequences use (default 8)")
    p.add_argument("--state-checkpoints", type=int, default=16,
                   help="a model with linear-attention layers: recurrent states each worker keeps for prefix "
                        "caching, at least one per conversation in flight (default 16; 0: no prefix caching)")
    p.add_argument("--host-state-checkpoints", type=int, default=64,
                   help="and more each worker keeps in host memory, where the least recently used go when a save "
                        "needs their slot (default 64; 0: they are dropped)")
    p.add_argument("--no-kvcache", action="store_true", help="start no kvcache service (no multi-turn KV reuse)")
    p.add_argument("--kvcache-dram-bytes", type=int, default=None, help="kvcache DRAM tier size")
    p.add_argument("--kvcache-state-bytes", type=int, default=None,
                   help="kvcache host memory for the recurrent states of models with linear-attention layers, "
                        "stored with their blocks (default: kvcache's, 1 GiB; 0 = none)")
    p.add_argument("--kvcache-disk-dir", default=None, help="kvcache disk tier directory (default: none)")
    p.add_argument("--kvcache-disk-bytes", type=int, default=8 * 2**30, help="kvcache disk tier size")
    p.add_argument("--trace", action="store_true",
                   help="collect traces with an embedded OTLP receiver (read them with `seawall trace`)")
    p.add_argument("--trace-file", type=Path, default=None, help="where --trace appends spans "
                   "(default: $SEAWALL_CACHE_DIR/traces.jsonl)")
    p.add_argument("--compose", type=Path, default=None, metavar="FILE",
                   help="run FILE's Seawall services (docker-compose.yml) as local processes instead; its "
                   "commands and ${VARS} set the topology, so the flags above do not apply")
    p.set_defaults(func=run)


def torch_threads(value: str) -> int:
    """``--torch-threads``: a count >= 0, refused by argparse in one line otherwise."""
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (0 = split the cores), got {value!r}")
    return n


def add_worker_thread_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--torch-threads", type=torch_threads, default=0, metavar="N",
                   help="torch threads per worker (default 0: the cores split across the workers); fewer "
                        "leave cores to other work on the box (scheduler, clients, other services)")
    p.add_argument("--step-thread", choices=STEP_THREADS, default="auto",
                   help="where workers run their steps: on the event-loop thread (loop) or a thread of their own "
                        "(own); default auto: the loop on a CPU, their own thread on a GPU")


def worker_thread_args(args: argparse.Namespace) -> list[str]:
    """The worker flags that ``add_worker_thread_flags`` adds besides --torch-threads (which the launcher splits)."""
    return [] if args.step_thread == "auto" else ["--step-thread", args.step_thread]


def checked_lora_flags(args: argparse.Namespace) -> list[str]:
    """The scheduler's LoRA flags, each adapter checked against the model first: a bad one is refused here,
    before any process starts."""
    if args.lora_modules:
        shape = ModelConfig.from_dir(resolve_model_dir(args.model)).lora_shape
        for name, path in args.lora_modules:
            read_lora(LoraRef(name, path), shape, args.max_lora_rank)
    return lora_flags(args)


def _parser_flags(args: argparse.Namespace) -> list[str]:
    """The scheduler's tool-call and reasoning parser flags, refused here when they do not go together."""
    flags = []
    if args.tool_call_parser:
        flags += ["--tool-call-parser", args.tool_call_parser]
    if args.reasoning_parser:
        flags += ["--reasoning-parser", args.reasoning_parser]
    if args.tool_call_parser == "harmony" and args.reasoning_parser != "harmony":
        raise InvalidArgument("--tool-call-parser harmony needs --reasoning-parser harmony (it reads the answer that "
                              "parser leaves)")
    if args.structured_output_in_reasoning:
        if not args.reasoning_parser:
            raise InvalidArgument("--structured-output-in-reasoning needs --reasoning-parser")
        flags.append("--structured-output-in-reasoning")
    return flags


def options_from(args: argparse.Namespace) -> MeshOptions:
    core_config_from(args)  # a bad scheduling flag is refused here, before any process starts
    sched = scheduling_flags(args)
    sched += _parser_flags(args)
    sched += checked_lora_flags(args)
    sched += api_flags(args)
    workers = ["--device", args.device]
    if args.max_model_len is not None:  # refused here when the model cannot serve it, before any process starts
        ModelConfig.from_dir(resolve_model_dir(args.model)).with_max_model_len(args.max_model_len)
        sched += ["--max-model-len", str(args.max_model_len)]
        workers += ["--max-model-len", str(args.max_model_len)]
    if args.kv_cache_bytes:
        workers += ["--kv-cache-bytes", str(args.kv_cache_bytes)]
    workers += ["--kv-cache-dtype", args.kv_cache_dtype]
    if args.no_nixl:
        workers.append("--no-nixl")
    if args.no_cpu_kernels:
        workers.append("--no-cpu-kernels")
    # A model with linear-attention layers: each worker makes room for a recurrent state per sequence a step runs.
    workers += worker_thread_args(args) + ["--max-cpu-loras", str(args.max_cpu_loras),
                                           "--state-checkpoints", str(args.state_checkpoints),
                                           "--host-state-checkpoints", str(args.host_state_checkpoints),
                                           "--state-slots", str(args.max_num_seqs)]
    kvcache = []
    if args.kvcache_dram_bytes:
        kvcache += ["--dram-bytes", str(args.kvcache_dram_bytes)]
    if args.kvcache_state_bytes is not None:
        kvcache += ["--state-bytes", str(args.kvcache_state_bytes)]
    if args.kvcache_disk_dir:
        kvcache += ["--disk-dir", args.kvcache_disk_dir, "--disk-bytes", str(args.kvcache_disk_bytes)]
    if args.no_nixl:
        kvcache.append("--no-nixl")
    if args.storage_gbps:
        kvcache += ["--storage-gbps", str(args.storage_gbps)]
    if args.compute_gbps:
        workers += ["--compute-gbps", str(args.compute_gbps)]
    colocated = args.mode == "colocated"
    return MeshOptions(model=args.model, mode=args.mode, num_prefill=0 if colocated else args.prefill,
                       num_decode=args.workers if colocated else args.decode, host=args.host,
                       grpc_port=args.grpc_port, http_port=args.http_port, scheduler_args=sched,
                       worker_args=workers, kvcache=not args.no_kvcache, kvcache_args=kvcache,
                       torch_threads=args.torch_threads, api_key=args.api_key or None)


def _stop_on_signals(mesh: LocalMesh) -> None:
    """Ctrl-C (or SIGTERM) stops the mesh, a start in progress too; a second one without waiting for children."""
    def on_signal(*_: object) -> None:
        if mesh.stopping.is_set():
            mesh.forced.set()
        mesh.stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def run(args: argparse.Namespace) -> int:
    mesh = ComposeMesh(ComposeOptions(args.compose)) if args.compose else LocalMesh(options_from(args))
    _stop_on_signals(mesh)
    receiver = None
    if args.trace:
        path = args.trace_file or default_trace_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        receiver = TraceReceiver(path=path).start()
        # Children inherit the environment: every service exports its spans here, quickly.
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")
        print(f"seawall: tracing to {path} (OTLP receiver {receiver.endpoint}); `seawall trace` prints the "
              "latest request", flush=True)
    try:
        mesh.start()
        if args.compose:
            running = ", ".join(c.name for c in mesh.children if c.proc.poll() is None)
            print(f"seawall: mesh ready from {args.compose} ({running})", flush=True)
            for note in mesh.plan.notes:
                print(f"  note: {note}", flush=True)
        else:
            roles = ", ".join(c.name for c in mesh.children if c.name != "scheduler")
            kv = f"; KV {args.kv_cache_dtype}" if args.kv_cache_dtype != "auto" else ""
            print(f"seawall: mesh ready ({args.mode}; {roles}; policy {args.policy}{kv})", flush=True)
        if mesh.options.api_key:
            print("  clients must send the API key (Authorization: Bearer KEY; the SDK reads $SEAWALL_API_KEY)",
                  flush=True)
        print(f"  gRPC (seawall.Client):  {mesh.grpc_address}", flush=True)
        if mesh.http_url:
            print(f"  OpenAI API:             {mesh.http_url}/v1", flush=True)
        for name, url in mesh.metrics_urls.items():
            print(f"  metrics ({name}):{' ' * max(1, 13 - len(name))}{url}", flush=True)
        if mesh.grpc_address:
            print(f"  watch it:               seawall stats --address {mesh.grpc_address} --watch 1", flush=True)
        print("press Ctrl-C to stop", flush=True)
        while not mesh.stopping.wait(0.5):
            for child in mesh.children:
                if child.proc.poll() is not None and child.name == "scheduler":
                    print("seawall: the scheduler exited; stopping", flush=True)
                    return 1
        return 0
    finally:
        if mesh.stopping.is_set():
            print("seawall: stopping (Ctrl-C again to kill at once)", flush=True)
        codes = mesh.stop()
        if receiver is not None:
            receiver.stop()
        if codes:
            print(f"seawall: stopped ({', '.join(f'{k}={v}' for k, v in codes.items())})", flush=True)
