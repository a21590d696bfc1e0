"""Process entry of the scheduler: ``python -m services.scheduler``.

Serves the Scheduler gRPC service (clients, worker registration; plus health and reflection) and the
OpenAI-compatible HTTP API from one event loop, drives every registered worker, and stops cleanly on
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import replace

import anyio
import uvicorn

from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import gc_pauses
from services.common.credentials import API_KEY_ENV
from services.common.errors import InvalidArgument
from services.common.grpc_server import Server, run_service, wait_for_shutdown_signal
from services.common.metrics import serve_metrics
from services.common.ports import listen_tcp
from services.common.tracing import SCHEDULER as SCHEDULER_SERVICE
from services.common.tracing import setup_tracing
from services.engine.checkpoint import (
    GENERATION_CONFIG_CHOICES,
    generation_override,
    load_checkpoint_meta,
    resolve_model_dir,
    sampling_defaults,
)
from services.engine.model_config import add_max_model_len_flag
from services.scheduler.api_key import ApiKey, ApiKeyInterceptor
from services.scheduler.chat_prompt import ChatPrompt
from services.scheduler.chat_template import checked_template
from services.scheduler.config import (
    DEFAULT_CHUNK_SIZE,
    MODES,
    READ_POLICIES,
    STEP_PIPELINING,
    TRANSPORTS,
    SchedulerServiceConfig,
    as_flag,
)
from services.scheduler.core.config import MLFQ_PRESETS, WAIT_CREDITS, MLFQConfig
from services.scheduler.core.scheduler import POLICIES, SchedulerConfig
from services.scheduler.dual_path import DualPath
from services.scheduler.frontend import Frontend
from services.scheduler.http_api import create_app
from services.scheduler.kvcache_client import KVCacheClient
from services.scheduler.mesh import Mesh
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.reasoning_parsers import PARSERS as REASONING_PARSERS
from services.scheduler.reasoning_parsers import reasoning_parser
from services.scheduler.server import SchedulerServicer
from services.scheduler.tool_parsers import PARSERS, tool_parser
from services.scheduler.vllm_metrics import VllmMetrics

log = logging.getLogger(__name__)


def add_scheduling_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared with ``seawall up``, which passes them through."""
    p.add_argument("--mode", choices=MODES, default="disaggregated", help="default: disaggregated")
    p.add_argument("--policy", choices=POLICIES, default="sarathi", help="step policy (default: sarathi)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="prompt tokens per step (default 256; with --tbt-target-s, what that target allows)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per step (default: no cap)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step (default 256)")
    p.add_argument("--preemption-mode", choices=("swap", "recompute"), default=None,
                   help="default: the policy's own (swap for fastserve*, recompute for the others)")
    p.add_argument("--max-queue-len", type=int, default=1024, help="queued requests before 429 (default 1024)")
    p.add_argument("--max-moves", type=int, default=3,
                   help="times a request is moved off a failed worker before it ends with an error (default 3)")
    p.add_argument("--migration-headroom", type=int, default=32,
                   help="live migration: a decode (or colocated) worker whose free KV falls under this many tokens a "
                        "running request moves a decode with its KV to a peer with room, instead of preempting "
                        "soon, and gives a queued request to such a peer (default 32; 0 = off)")
    p.add_argument("--no-migration-precopy", action="store_true",
                   help="live migration stops a request for the copy of all its KV, instead of copying its full "
                        "blocks ahead while it keeps decoding and stopping it only for the rest")
    p.add_argument("--priority-headroom", type=int, default=0,
                   help="Llumnix's priorities: KV tokens a worker keeps free for each high-priority request "
                        "(priority < 0) it holds; migration and placement count them as used, so normal "
                        "requests move off and keep away (default 0: off)")
    p.add_argument("--kv-transport", choices=TRANSPORTS, default="nixl", help="KV between workers (default nixl)")
    p.add_argument("--no-peer-meeting", action="store_true",
                   help="NIXL: workers (and kvcache) do not meet when one registers; each pair opens its "
                        "connections on its first transfer instead")
    p.add_argument("--kv-read-policy", choices=READ_POLICIES, default="dual",
                   help="DualPath: where cached prefixes are loaded (default dual: the less busy side)")
    p.add_argument("--no-prefix-caching", action="store_true", help="workers' cores cache no prefixes")
    p.add_argument("--no-peer-prefix", action="store_true",
                   help="disaggregated: never read a prompt's prefix from a decode worker's cache (a next turn "
                        "computes what the prefill worker does not cache)")
    p.add_argument("--tbt-target-s", type=float, default=None,
                   help="without --chunk-size: the step budget the step-time model fits in this TBT")
    p.add_argument("--mlfq", choices=tuple(MLFQ_PRESETS), default="default",
                   help="FastServe's queue constants: default, paper or released-code")
    p.add_argument("--starvation-s", type=float, default=None,
                   help="FastServe: promote a job to the top queue after waiting this long (default: the preset's)")
    p.add_argument("--max-wait-ratio", type=float, default=None,
                   help="FastServe: a started job waiting more than this x its time run (+ --wait-slack-s, + its "
                        "FCFS credit) runs ahead of the queues (default: off)")
    p.add_argument("--wait-slack-s", type=float, default=None, help="FastServe: slack of --max-wait-ratio, s")
    p.add_argument("--wait-credit", choices=WAIT_CREDITS, default=None,
                   help="FastServe: also allow the wait FCFS would have had (fcfs, the default) or not (none)")
    p.add_argument("--decode-steps", type=int, default=1,
                   help="multi-step decoding: while nothing waits, a worker runs up to this many decode passes per "
                        "plan, tokens streamed in groups of as many (default 1: one pass per plan)")
    p.add_argument("--step-pipelining", choices=STEP_PIPELINING, default="auto",
                   help="plan a worker's next step before its current result: behind every step (all: async "
                        "scheduling), behind steps without decodes (prompts), behind prompt chunks that sample "
                        "nothing only (known), never (off), or auto (default: all)")
    p.add_argument("--speculative-tokens", type=int, default=0,
                   help="speculative decoding by n-gram lookup: a decode verifies up to this many tokens drafted "
                        "from its own context in one pass, keeping those it would have sampled (default 0: off)")


def scheduling_flags(args: argparse.Namespace, policy: str | None = None) -> list[str]:
    """The flags ``add_scheduling_flags`` parsed (but ``--mode``, which launchers set themselves), as a
    scheduler command line."""
    flags = ["--policy", policy or args.policy, *(["--chunk-size", str(args.chunk_size)] if args.chunk_size else []),
             "--max-num-seqs", str(args.max_num_seqs), "--max-queue-len", str(args.max_queue_len),
             "--max-moves", str(args.max_moves), "--migration-headroom", str(args.migration_headroom),
             "--priority-headroom", str(args.priority_headroom),
             "--kv-transport", args.kv_transport, "--kv-read-policy", args.kv_read_policy, "--mlfq", args.mlfq,
             "--step-pipelining", args.step_pipelining, "--decode-steps", str(args.decode_steps),
             "--speculative-tokens", str(args.speculative_tokens),
             *(["--no-migration-precopy"] if args.no_migration_precopy else [])]
    for name in ("max_num_batched_tokens", "preemption_mode", "tbt_target_s", "starvation_s", "max_wait_ratio",
                 "wait_slack_s", "wait_credit"):
        if getattr(args, name) is not None:
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return (flags + (["--no-prefix-caching"] if args.no_prefix_caching else [])
            + (["--no-peer-prefix"] if args.no_peer_prefix else [])
            + (["--no-peer-meeting"] if args.no_peer_meeting else []))


def _mlfq(args: argparse.Namespace) -> MLFQConfig:
    given = {name: getattr(args, name) for name in ("starvation_s", "max_wait_ratio", "wait_slack_s", "wait_credit")}
    return replace(MLFQ_PRESETS[args.mlfq](), **{k: v for k, v in given.items() if v is not None})


def core_config_from(args: argparse.Namespace) -> SchedulerConfig:
    """The scheduler core's config from ``add_scheduling_flags``' flags; a value it cannot take is an
    ``InvalidArgument`` naming the flag (launchers call this to refuse bad flags before starting anything)."""
    try:
        return SchedulerConfig(chunk_size=chunk_size(args), max_num_batched_tokens=args.max_num_batched_tokens,
                               max_num_seqs=args.max_num_seqs, policy=args.policy,
                               preemption_mode=args.preemption_mode,
                               enable_prefix_caching=not args.no_prefix_caching, tbt_target_s=args.tbt_target_s,
                               mlfq=_mlfq(args), num_decode_steps=args.decode_steps,
                               num_speculative_tokens=args.speculative_tokens)
    except ValueError as exc:
        raise InvalidArgument(as_flag(str(exc))) from None


def chunk_size(args: argparse.Namespace) -> int | None:
    """``--chunk-size``, else 256, or none with ``--tbt-target-s`` (the target then sets the step's budget from
    each worker's measured step times)."""
    if args.chunk_size is not None:
        return args.chunk_size
    return None if args.tbt_target_s is not None else DEFAULT_CHUNK_SIZE


def config_from(args: argparse.Namespace) -> SchedulerServiceConfig:
    core = core_config_from(args)
    return SchedulerServiceConfig(model=args.model, served_model_name=tuple(args.served_model_name or ()),
                                  max_model_len=args.max_model_len, host=args.host,
                                  grpc_port=args.grpc_port, http_port=args.http_port or None, mode=args.mode,
                                  core=core, max_queue_len=args.max_queue_len, kv_transport=args.kv_transport,
                                  kv_read_policy=args.kv_read_policy, max_moves=args.max_moves,
                                  migration_headroom=args.migration_headroom,
                                  migration_precopy=not args.no_migration_precopy,
                                  priority_headroom=args.priority_headroom,
                                  peer_prefix=not args.no_peer_prefix, peer_meeting=not args.no_peer_meeting)


def parse_args(argv: list[str] | None) -> SchedulerServiceConfig:
    p = argparse.ArgumentParser(prog="python -m services.scheduler", description=__doc__)
    p.add_argument("--model", default=None, help="Hugging Face checkpoint dir (default: the built-in model)")
    add_served_model_name_flag(p)
    add_max_model_len_flag(p)
    p.add_argument("--host", default=os.environ.get("SEAWALL_HOST", "127.0.0.1"), help="listen address")
    p.add_argument("--grpc-port", type=int, default=50051, help="Scheduler gRPC port (default 50051)")
    p.add_argument("--http-port", type=int, default=8000, help="OpenAI HTTP API port, 0 = off (default 8000)")
    add_api_flags(p)
    p.add_argument("--kvcache", default=os.environ.get("SEAWALL_KVCACHE"),
                   help="kvcache service host:port for multi-turn KV reuse (env SEAWALL_KVCACHE; default none)")
    p.add_argument("--otlp-endpoint", default=None,
                   help="export traces over OTLP/gRPC here (default: $OTEL_EXPORTER_OTLP_ENDPOINT; unset = off)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="Prometheus text on this port too (0 = off; the HTTP API always serves /metrics)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="on SIGTERM, how long requests in flight may take to finish while new ones are refused "
                        "(default 30; 0 = stop at once)")
    add_scheduling_flags(p)
    p.add_argument("--tool-call-parser", choices=tuple(PARSERS), default=None,
                   help="read tool calls in the model's own syntax, for tool_choice \"auto\" (default: none)")
    p.add_argument("--reasoning-parser", choices=tuple(REASONING_PARSERS), default=None,
                   help="return a chat reply's thinking as reasoning_content (default: none)")
    p.add_argument("--structured-output-in-reasoning", action="store_true",
                   help="with --reasoning-parser: constrain a structured output from the reply's first token, "
                        "thought included (default: the answer after the thought)")
    add_lora_flags(p)
    p.add_argument("--log-level", default=os.environ.get("SEAWALL_LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A ValueError here (a template that does not compile, a bad config) is one line and exit 2 (run_service).
    template = None if args.chat_template is None else checked_template(args.chat_template)
    return replace(config_from(args), metrics_port=args.metrics_port, otlp_endpoint=args.otlp_endpoint,
                   kvcache_address=args.kvcache, step_pipelining=args.step_pipelining,
                   tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                   structured_output_in_reasoning=args.structured_output_in_reasoning,
                   lora_modules=tuple(args.lora_modules or env_lora_modules()), max_lora_rank=args.max_lora_rank,
                   allow_runtime_lora_updating=args.allow_runtime_lora_updating, api_key=args.api_key or None,
                   allowed_origins=tuple(args.allowed_origins), drain_timeout_s=args.drain_timeout_s,
                   return_tokens_as_token_ids=args.return_tokens_as_token_ids, chat_template=template,
                   trust_request_chat_template=args.trust_request_chat_template,
                   generation_config=args.generation_config,
                   override_generation_config=args.override_generation_config)


def add_served_model_name_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model's names in the API, the first the one replies give (default: the dir's name)")


def add_api_flags(p: argparse.ArgumentParser) -> None:
    """Who may call the client-facing API, and how its replies name tokens."""
    # The environment is the way to give the key: a flag's value shows in the process list.
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"clients must send this key (Authorization: Bearer KEY); default ${API_KEY_ENV}, unset = "
                        "no key; /health, /version and /metrics stay open")
    p.add_argument("--allowed-origins", nargs="+", default=[], metavar="ORIGIN",
                   help="web origins (https://ui.example, or *) whose pages may call the HTTP API from a browser "
                        "(CORS); default none")
    p.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help="logprobs name tokens token_id:ID unless a request's return_tokens_as_token_ids says "
                        "otherwise (vLLM's flag)")
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="the chat template (a Jinja file, or the template itself) in place of the checkpoint's "
                        "(vLLM's flag; default: the checkpoint's)")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="a chat request may bring its own chat_template (vLLM's flag; default: refused)")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                   help="what requests that leave temperature, top_p, top_k, min_p, repetition_penalty or "
                        f"max_tokens out sample with: {GENERATION_CONFIG_CHOICES} (vLLM's flag; default auto)")
    p.add_argument("--override-generation-config", default="", metavar="JSON",
                   help="sampling fields over that, as '{\"temperature\": 0.5}' (generation_config.json's names: "
                        "max_new_tokens for max_tokens; vLLM's flag)")


def api_flags(args: argparse.Namespace) -> list[str]:
    """The scheduler flags ``add_api_flags`` and ``add_served_model_name_flag`` add, but the key: a launcher
    passes that in the environment."""
    flags = ["--allowed-origins", *args.allowed_origins] if args.allowed_origins else []
    flags += ["--return-tokens-as-token-ids"] if args.return_tokens_as_token_ids else []
    if args.chat_template is not None:  # a file by its absolute path: the scheduler may run elsewhere
        template = args.chat_template
        flags += ["--chat-template", os.path.abspath(template) if os.path.isfile(template) else template]
    flags += ["--trust-request-chat-template"] if args.trust_request_chat_template else []
    if args.generation_config not in ("auto", "vllm"):
        flags += ["--generation-config", os.path.abspath(args.generation_config)]
    elif args.generation_config == "vllm":
        flags += ["--generation-config", "vllm"]
    flags += ["--override-generation-config", args.override_generation_config] if args.override_generation_config \
        else []
    return flags + (["--served-model-name", *args.served_model_name] if args.served_model_name else [])


def add_lora_flags(p: argparse.ArgumentParser, runtime: bool = True) -> None:
    """LoRA flags, vLLM's names (``seawall up`` passes them through; ``run-batch`` takes all but ``runtime``'s)."""
    p.add_argument("--lora-modules", nargs="+", type=lora_module, metavar="NAME=PATH", default=[],
                   help="LoRA adapters (PEFT format) to serve, each selected by its name in a request's model "
                        "field (default none; the scheduler also reads $SEAWALL_LORA_MODULES, space-separated)")
    p.add_argument("--max-lora-rank", type=int, default=16, help="highest adapter rank accepted (default 16)")
    if runtime:
        p.add_argument("--allow-runtime-lora-updating", action="store_true",
                       help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (default: off)")


def lora_flags(args: argparse.Namespace) -> list[str]:
    """``add_lora_flags``' flags as a scheduler command line."""
    flags = ["--max-lora-rank", str(args.max_lora_rank)]
    if args.lora_modules:
        flags += ["--lora-modules", *(f"{name}={path}" for name, path in args.lora_modules)]
    return flags + (["--allow-runtime-lora-updating"] if getattr(args, "allow_runtime_lora_updating", False) else [])


def env_lora_modules() -> list[tuple[str, str]]:
    """``SEAWALL_LORA_MODULES``: ``NAME=PATH`` entries separated by spaces (how docker-compose.yml passes them)."""
    try:
        return [lora_module(m) for m in os.environ.get("SEAWALL_LORA_MODULES", "").split()]
    except argparse.ArgumentTypeError as exc:
        raise InvalidArgument(f"SEAWALL_LORA_MODULES: {exc}") from None


def lora_module(value: str) -> tuple[str, str]:
    """``NAME=PATH`` (vLLM's form) as (name, absolute path): workers may run in other directories."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{value!r}: give an adapter as NAME=PATH")
    return name, os.path.abspath(path)


class _Uvicorn(uvicorn.Server):
    """Leaves signals to us: one handler stops both servers."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    def capture_signals(self):  # uvicorn >= 0.29
        import contextlib

        return contextlib.nullcontext()


async def serve(config: SchedulerServiceConfig) -> None:
    checkpoint = load_checkpoint_meta(resolve_model_dir(config.model), config.max_model_len)
    config = replace(config, core=replace(config.core, max_model_len=checkpoint.config.max_model_len))
    metrics = SchedulerMetrics()
    tracing = setup_tracing(SCHEDULER_SERVICE, config.otlp_endpoint)
    mesh = Mesh(config, metrics, tracing)
    kvcache = None
    if config.kvcache_address:
        kvcache = KVCacheClient(config.kvcache_address, config.transfer_timeout_s, transport=mesh.transport)
        mesh.dual_path = DualPath(mesh, kvcache, config.kv_read_policy)
    metrics.watch(mesh)
    serve_metrics(metrics.registry, config.host, config.metrics_port)
    frontend = Frontend(checkpoint, mesh, config.served_model_name, config.max_lora_rank)
    for name, path in config.lora_modules:
        frontend.loras.add(name, path)  # a bad adapter stops the start, saying why
        log.info("serving LoRA adapter %r from %s", name, path)
    adapters = config.lora_modules or config.allow_runtime_lora_updating
    defaults = sampling_defaults(checkpoint, config.generation_config, generation_override(
        config.override_generation_config) if config.override_generation_config else None)
    if defaults:
        log.info("requests that leave them out sample with %s (the model's generation config; "
                 "--generation-config vllm: the API's defaults)", defaults)
    metrics.registry.register(VllmMetrics(mesh, frontend.model_name, metrics.requests, (
        lambda: [spec.ref.name for spec in frontend.loras]) if adapters else None))
    key = ApiKey(config.api_key) if config.api_key else None
    server = Server([ApiKeyInterceptor(key)] if key is not None else ())
    server.add(scheduler_pb2_grpc.add_SchedulerServicer_to_server,
               SchedulerServicer(frontend, mesh, config.core.policy, defaults),
               scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name)
    http = None
    http_socket = None if config.http_port is None else listen_tcp(config.host, config.http_port,
                                                                   "the OpenAI HTTP API")
    async with anyio.create_task_group() as tg:
        tg.start_soon(mesh.run)
        port = await server.start(config.host, config.grpc_port)
        log.info("scheduler gRPC on %s:%d (%s, policy %s)%s", config.host, port, config.mode, config.core.policy,
                 ", clients need the API key" if key is not None else "")
        if http_socket is not None:
            app = create_app(frontend, tg, metrics.registry, tool_parser(config.tool_call_parser),
                             reasoning_parser(config.reasoning_parser), config.structured_output_in_reasoning,
                             lora_updating=config.allow_runtime_lora_updating, api_key=key,
                             allowed_origins=config.allowed_origins,
                             tokens_as_ids=config.return_tokens_as_token_ids,
                             chat=ChatPrompt(checkpoint.path, frontend.encode, config.chat_template,
                                             config.trust_request_chat_template), sampling_defaults=defaults)
            http = _Uvicorn(uvicorn.Config(app, host=config.host, port=config.http_port, log_level="warning",
                                           lifespan="off"))
            tg.start_soon(http.serve, [http_socket])
            log.info("OpenAI API on http://%s:%d/v1", config.host, config.http_port)
        gc_metrics = gc_pauses.after_startup(metrics.registry)
        await wait_for_shutdown_signal()
        await drain(frontend, mesh, server, config.drain_timeout_s)
        gc_metrics.close()
        if http is not None:
            http.should_exit = True
        await server.stop(grace_s=2.0)
        await mesh.close()
        if kvcache is not None:
            await kvcache.close()
        tracing.shutdown()
        tg.cancel_scope.cancel()


async def drain(frontend: Frontend, mesh: Mesh, server: Server, timeout_s: float) -> None:
    """Lets the requests in flight finish before the scheduler stops (a rolling restart's SIGTERM), for up to
    ``timeout_s``: new ones are refused (UNAVAILABLE, HTTP 503) and health says NOT_SERVING, so a balancer sends
    them elsewhere. Ends early once none is left, or no worker to finish them; a second signal ends it at once."""
    if timeout_s <= 0 or not mesh.tracked or not mesh.live_links():
        return
    frontend.draining = True
    await server.set_serving(False)
    log.info("draining %d requests in flight (up to %g s; signal again to stop now)", len(mesh.tracked), timeout_s)
    async with anyio.create_task_group() as tg:
        async def again() -> None:
            await wait_for_shutdown_signal()
            tg.cancel_scope.cancel()

        tg.start_soon(again)
        with anyio.move_on_after(timeout_s):
            while mesh.tracked and mesh.live_links():
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    if mesh.tracked:
        log.warning("stopping with %d requests unfinished", len(mesh.tracked))


def main(argv: list[str] | None = None) -> int:
    return run_service(lambda: parse_args(argv), serve)
