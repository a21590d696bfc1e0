"""Configuration of the scheduler service (the mesh's front door and step driver)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from services.engine.checkpoint import generation_override
from services.scheduler.chat_template import check_compiles
from services.scheduler.core.scheduler import SchedulerConfig
from services.scheduler.reasoning_parsers import PARSERS as REASONING_PARSERS
from services.scheduler.tool_parsers import PARSERS

MODES = ("disaggregated", "colocated")
TRANSPORTS = ("nixl", "grpc")
# "dual+recompute": dual, and per request a cached prefix is computed instead when, from the live read queue and
# the prefill worker's backlog, that is measured to end sooner (DualPath's load-or-recompute; off by default).
READ_POLICIES = ("pe-read", "de-read", "dual", "dual+recompute")
STEP_PIPELINING = ("auto", "all", "prompts", "known", "off")

# Prompt tokens per step when neither --chunk-size nor --tbt-target-s is given.
DEFAULT_CHUNK_SIZE = 256


@dataclass(frozen=True)
class SchedulerServiceConfig:
    # Model directory the workers serve: the scheduler reads its tokenizer and config (None = built-in model).
    model: str | None = None
    # Names clients may use in the OpenAI API's "model" field, the first the one replies give (vLLM's
    # --served-model-name); none = the model directory's name.
    served_model_name: tuple[str, ...] = ()
    # The longest context served (--max-model-len); None = the model's. Workers must serve the same.
    max_model_len: int | None = None
    host: str = "127.0.0.1"
    # The key every client-facing call must carry (api_key.py); None = none. Not in the repr: configs are logged.
    api_key: str | None = field(default=None, repr=False)
    # On SIGTERM/SIGINT, how long requests in flight may take to finish (new ones refused, health NOT_SERVING)
    # before the scheduler stops: a rolling restart loses no stream that ends in time; 0 = stop at once.
    drain_timeout_s: float = 30.0
    # Logprobs name tokens "token_id:ID" unless a request's return_tokens_as_token_ids says otherwise (vLLM's
    # --return-tokens-as-token-ids).
    return_tokens_as_token_ids: bool = False
    # Web origins whose browser pages may call the HTTP API (CORS; "*" = any); none = browsers allow only pages
    # the API itself serves (vLLM allows any origin by default: opt-in here, as the API may hold a key).
    allowed_origins: tuple[str, ...] = ()
    # The chat template's text in place of the checkpoint's (vLLM's --chat-template); None = the checkpoint's.
    chat_template: str | None = field(default=None, repr=False)
    # A chat request may bring its own template (vLLM's --trust-request-chat-template).
    trust_request_chat_template: bool = False
    # Where requests' default sampling comes from (vLLM's --generation-config): "auto", the checkpoint's
    # generation_config.json; "vllm", the API's own defaults; or a directory holding a generation_config.json.
    generation_config: str = "auto"
    # Sampling fields over it, as JSON under generation_config.json's names (vLLM's --override-generation-config).
    override_generation_config: str = ""
    # The Scheduler gRPC service (clients, workers registering). 0 picks a free port.
    grpc_port: int = 50051
    # The OpenAI-compatible HTTP API (it also serves /metrics); None turns it off.
    http_port: int | None = 8000
    # Prometheus text on its own port as well (0 = off), for scrapers that cannot reach the API port.
    metrics_port: int = 0
    # OTLP/gRPC endpoint for traces; None = the OTEL_EXPORTER_OTLP_ENDPOINT variable (unset: tracing off).
    otlp_endpoint: str | None = None
    # "disaggregated": prompts run on prefill workers and their KV moves to decode workers;
    # "colocated": every worker runs mixed batches of prompt chunks and decodes (Sarathi-Serve).
    mode: str = "disaggregated"
    # The step policy and budgets each worker's core runs with (max_model_len comes from the workers).
    core: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(chunk_size=256))
    # Requests waiting (admitted, not yet started) beyond which Generate answers RESOURCE_EXHAUSTED.
    max_queue_len: int = 1024
    # How many times a request is moved off a worker that failed while holding it; past that it ends with an
    # error: a request that fails the step of any worker it lands on must not take every worker down in turn.
    max_moves: int = 3
    # Live migration (migrator.py): a decode or colocated worker whose free KV memory falls under this many tokens
    # a running request (about the decode steps left before it must preempt) moves one of its decodes, with its
    # KV, to a peer that stays above it after taking it, and gives such a peer its next request that holds no KV
    # yet (queued, preempted for recompute, an arrival); 0 = never. The default is two 16-token blocks.
    migration_headroom: int = 32
    # Whether a worker getting short of memory copies a decode's full blocks ahead to a peer while it keeps
    # decoding (Llumnix's multi-stage copy), so that a move pauses it only for the rest (18-25 ms against
    # 55-93 on the 2-core box, bench/README.md); else a move stops it for the whole copy.
    migration_precopy: bool = True
    # Llumnix's priorities: KV tokens a worker keeps free for each high-priority request it holds (priority < 0),
    # beyond the migration headroom. Rebalancing and placement count them as used (Llumnix's virtual usage), so
    # normal requests move off and keep away from such a worker, leaving its high-priority requests a smaller
    # batch and room to grow; 0 = off. (A high-priority decode is never the one moved while a normal one could
    # go, whatever this is: Scheduler.migratable.)
    priority_headroom: int = 0
    # How KV moves between workers: "nixl" (when both sides have an agent) or "grpc" (streamed chunks).
    kv_transport: str = "nixl"
    # NIXL: a worker that registers and every live one (and kvcache) meet at once (peer_meeting.py), so that a
    # pair's first transfer does not open its connections (a new pair's first 4 MiB: ~19 ms meeting in it,
    # ~2.3 ms met before, bench/kv_transfer.py); False = each pair meets on its first transfer.
    peer_meeting: bool = True
    # The kvcache service (host:port) for multi-turn KV reuse; None = none.
    kvcache_address: str | None = None
    # DualPath: load a cached prefix through the prefill worker ("pe-read"), the decode worker ("de-read"), or
    # per request the side with the shorter storage-read queue ("dual").
    kv_read_policy: str = "dual"
    # Disaggregated: a prompt whose prefix a decode worker caches more of than its prefill worker (a
    # conversation's turn before's outputs) reads it from there peer-to-peer (peer_prefix.py); False = computes it.
    peer_prefix: bool = True
    # How the chat API reads tool calls in the model's own syntax (tool_choice "auto"): "hermes",
    # "llama3_json" (services/scheduler/tool_parsers.py); None = "auto" is refused.
    tool_call_parser: str | None = None
    # How the chat and Responses APIs read a reply's thinking: "deepseek_r1", "qwen3"
    # (services/scheduler/reasoning_parsers.py); None = the reply is all answer.
    reasoning_parser: str | None = None
    # With a reasoning parser, a chat request's structured output (or forced tool call) applies to the answer
    # after the thought (vLLM's default); True = from the first token, thought included (vLLM's
    # enable_in_reasoning).
    structured_output_in_reasoning: bool = False
    # A KV transfer not done within this many seconds fails; the request is recomputed on the receiver.
    transfer_timeout_s: float = 30.0
    # A worker that does not answer a step within this many seconds is declared dead.
    step_timeout_s: float = 120.0
    # A worker's core holding requests that plans nothing for this long is logged, with what it holds, every
    # this many seconds while it lasts (mesh.py, Mesh._idle): waits on transfers end within their timeout.
    stall_warning_s: float = 60.0
    # Plan a worker's next step while its current one runs (mesh.py, Scheduler.expect): "all" behind every
    # plan (async scheduling, as vLLM v1), "prompts" behind plans without a decode (their samples are first
    # tokens), "known" only behind plans that sample nothing (prompt chunks), "off" never. "auto" (the
    # default) is "all" on every device. On a GPU the scheduler's work overlaps the forward pass for free. On
    # a 2-core CPU box, where the forward pass shares the cores with the scheduler, "all" once cost decode
    # latency, and "auto" meant "prompts" there; re-measured after later changes to the mesh, "all" wins on
    # the CPU too under bursts (lower p99 TBT in 11 of 11 paired runs), while "prompts" keeps ~3 % more
    # throughput on big batches (bench/README.md, "Step pipelining").
    step_pipelining: str = "auto"
    # LoRA adapters served from the start, (name, directory) each (vLLM's --lora-modules); requests select one
    # by its name in the "model" field.
    lora_modules: tuple[tuple[str, str], ...] = ()
    # The highest adapter rank accepted (vLLM's --max-lora-rank).
    max_lora_rank: int = 16
    # Let clients load and unload adapters through the HTTP API (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING): off
    # by default, since it has the scheduler and the workers read any path the client names.
    allow_runtime_lora_updating: bool = False

    def __post_init__(self) -> None:
        for name, choices in (("mode", MODES), ("kv_transport", TRANSPORTS), ("step_pipelining", STEP_PIPELINING),
                              ("kv_read_policy", READ_POLICIES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        for name in ("grpc_port", "http_port", "metrics_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port < 65536:
                raise ValueError(f"{name} must be in [0, 65535], got {port}")
        self._check_front_door()
        if self.kvcache_address is not None and ":" not in self.kvcache_address:
            raise ValueError(f"kvcache_address must be host:port, got {self.kvcache_address!r}")
        self._check_parsers()
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        for name, least in (("max_queue_len", 1), ("max_moves", 0), ("max_lora_rank", 1),
                            ("migration_headroom", 0), ("priority_headroom", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        for name in ("transfer_timeout_s", "step_timeout_s", "stall_warning_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def _check_front_door(self) -> None:
        """The client-facing API's names, key, origins, chat template and default sampling, and the drain."""
        names = self.served_model_name
        if any(not name or name != name.strip() for name in names) or len(set(names)) < len(names):
            raise ValueError(f"served_model_name must be distinct names without surrounding spaces, got {list(names)}")
        if self.api_key is not None and (not self.api_key or self.api_key != self.api_key.strip()):
            raise ValueError("api_key must be non-empty without surrounding spaces (clients' headers are read "
                             "stripped, so such a key could never match)")
        for origin in self.allowed_origins:
            # Browsers send "scheme://host[:port]"; an origin without a scheme would never match one.
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"allowed_origins: {origin!r} is no origin; use scheme://host[:port], such as "
                                 "https://ui.example, or *")
        if not self.drain_timeout_s >= 0:  # NaN too
            raise ValueError(f"drain_timeout_s must be >= 0 (0 = stop at once), got {self.drain_timeout_s}")
        if self.chat_template is not None:
            check_compiles(self.chat_template)
        if not self.generation_config:
            raise ValueError("generation_config must be auto, vllm or a directory holding a generation_config.json")
        if self.override_generation_config:
            generation_override(self.override_generation_config)

    def _check_parsers(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(PARSERS)}, got {self.tool_call_parser!r}")
        if self.structured_output_in_reasoning and self.reasoning_parser is None:
            raise ValueError("structured_output_in_reasoning needs a reasoning_parser (it says where a structured "
                             "output starts in a reasoning model's reply)")
        if self.tool_call_parser == "harmony" and self.reasoning_parser != "harmony":
            raise ValueError("tool_call_parser harmony reads the answer the harmony reasoning parser leaves: set "
                             "reasoning_parser to harmony too (--reasoning-parser harmony)")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")


def as_flag(message: str) -> str:
    """``num_decode_steps must be ...`` -> ``--decode-steps must be ...``: the name the user typed."""
    name, _, rest = message.partition(" ")
    name = name.removeprefix("mlfq.")
    renamed = {"num_decode_steps": "decode-steps", "num_speculative_tokens": "speculative-tokens"}
    flag = renamed.get(name) or name.replace("_", "-")
    return f"--{flag} {rest}"
