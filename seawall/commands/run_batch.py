"""``seawall run-batch``: an OpenAI batch file through one in-process engine, all lines concurrently."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from seawall.commands.paths import check_output_file, write_output_file
from services.common.errors import InvalidArgument, NotFound
from services.engine.config import add_kv_cache_dtype_flag
from services.engine.model_config import add_max_model_len_flag
from services.scheduler.core.config import MLFQ_PRESETS, SchedulerConfig
from services.scheduler.core.policies import POLICY_NAMES
from services.scheduler.main import add_lora_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run-batch", help="run an OpenAI batch file (JSON lines) through the engine",
                       description=__doc__)
    p.add_argument("-i", "--input", required=True, help="input JSONL file ('-' for stdin)")
    p.add_argument("-o", "--output", required=True, help="output JSONL file ('-' for stdout)")
    p.add_argument("--model", default=None, help="Hugging Face checkpoint dir (default: the built-in model)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="prompt tokens per step (the chunked-prefill budget; default: whole prompts)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens (decodes + prompt chunks) per step (default: no limit)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step (default 256)")
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="KV pool size in bytes")
    add_kv_cache_dtype_flag(p)
    add_max_model_len_flag(p)
    p.add_argument("--swap-bytes", type=int, default=256 * 2**20, help="host memory for swapped-out KV, bytes")
    p.add_argument("--policy", choices=POLICY_NAMES, default="sarathi",
                   help="step policy: sarathi (stall-free chunked prefill, default), vllm (prefill-first), "
                        "fcfs (run to completion), fastserve (skip-join MLFQ, proactive swapping), "
                        "fastserve+sarathi (MLFQ order, stall-free chunked steps)")
    p.add_argument("--preemption-mode", choices=("recompute", "swap"), default=None,
                   help="what happens to a preempted request's KV (default: the policy's; swap for the "
                        "fastserve policies, recompute for the others)")
    p.add_argument("--tbt-target-s", type=float, default=None,
                   help="time-between-tokens target: without --chunk-size, the chunking policies' step "
                        "budget is the largest step the step-time model fits in it")
    p.add_argument("--mlfq", choices=tuple(MLFQ_PRESETS), default="default",
                   help="FastServe's queue constants: default (the paper's, with the code's 3 s starvation "
                        "threshold), paper, or released-code")
    p.add_argument("--no-prefix-caching", action="store_true", help="do not reuse KV of shared prompt prefixes")
    p.add_argument("--decode-steps", type=int, default=None,
                   help="multi-step decoding: while nothing waits, up to this many decode passes per step "
                        "(default 8: nothing streams from a batch file, so only throughput counts; 1 = off; "
                        "1 with --speculative-tokens)")
    p.add_argument("--speculative-tokens", type=int, default=0,
                   help="speculative decoding by n-gram lookup: a decode verifies up to this many tokens drafted "
                        "from its own context in one pass, keeping those it would have sampled (default 0: off)")
    add_lora_flags(p, runtime=False)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--no-cpu-kernels", action="store_true",
                   help="CPU fp32 attention, norms and RoPE as plain torch ops instead of the fused C kernels")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                   help="what lines that leave temperature, top_p, top_k, min_p, repetition_penalty or max_tokens "
                        "out sample with: auto (the model's generation_config.json), vllm (none) or a directory "
                        "holding one (vLLM's flag; default auto)")
    p.add_argument("--override-generation-config", default="", metavar="JSON",
                   help="sampling fields over that, as '{\"temperature\": 0.5}' (vLLM's flag)")
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="the chat template (a Jinja file, or the template itself) in place of the checkpoint's "
                        "(vLLM's flag)")
    p.set_defaults(func=run)


def _decode_steps(args: argparse.Namespace) -> int:
    """--decode-steps, else 8, or 1 with --speculative-tokens (the two exclude each other)."""
    if args.decode_steps is not None:
        return args.decode_steps
    return 1 if args.speculative_tokens else 8


def run(args: argparse.Namespace) -> int:
    from seawall.offline.batch import base_names, run_batch
    from seawall.offline.engine import OfflineEngine
    from services.engine.checkpoint import generation_override, sampling_defaults
    from services.engine.config import EngineConfig
    from services.scheduler.chat_prompt import ChatPrompt
    from services.scheduler.chat_template import checked_template
    from services.scheduler.config import as_flag
    from services.scheduler.lora_registry import LoraRegistry

    try:
        template = None if args.chat_template is None else checked_template(args.chat_template)
        override = generation_override(args.override_generation_config) if args.override_generation_config else None
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    lines = _read_lines(args.input)
    check_output_file(args.output, "-o")
    try:
        sched = SchedulerConfig(args.max_num_batched_tokens, args.chunk_size, args.max_num_seqs,
                                enable_prefix_caching=not args.no_prefix_caching,
                                preemption_mode=args.preemption_mode, policy=args.policy,
                                tbt_target_s=args.tbt_target_s, mlfq=MLFQ_PRESETS[args.mlfq](),
                                num_decode_steps=_decode_steps(args),
                                num_speculative_tokens=args.speculative_tokens)
    except ValueError as exc:
        raise InvalidArgument(as_flag(str(exc))) from exc
    engine = OfflineEngine(
        EngineConfig(model=args.model, device=args.device, dtype=args.dtype, block_size=args.block_size,
                     kv_cache_bytes=args.kv_cache_bytes, kv_cache_dtype=args.kv_cache_dtype,
                     swap_bytes=args.swap_bytes, cpu_kernels=not args.no_cpu_kernels, max_model_len=args.max_model_len),
        sched,
    )
    model_name = args.model or "seawall-builtin-tiny"
    loras = LoraRegistry(engine.checkpoint.config.lora_shape, args.max_lora_rank, base_names(engine, model_name))
    for name, path in args.lora_modules:
        loras.add(name, path)
    results = run_batch(engine, lines, model_name, loras, ChatPrompt(engine.checkpoint.path, engine.encode, template),
                        sampling_defaults(engine.checkpoint, args.generation_config, override))
    text = "".join(json.dumps(r) + "\n" for r in results)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        write_output_file(args.output, text, "-o")
    drafts = engine.scheduler.draft_stats
    if drafts.drafted:
        print(f"speculative decoding: {drafts.kept} of {drafts.drafted} draft tokens kept "
              f"({drafts.kept / drafts.drafted:.0%})", file=sys.stderr)
    return 0


def _read_lines(path: str) -> list[str]:
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise NotFound(f"input file {path!r} does not exist") from exc
    except OSError as exc:
        raise InvalidArgument(f"cannot read input file {path!r}: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"input file {path!r} is not UTF-8 text (byte {exc.start}); JSON lines are UTF-8") from exc
