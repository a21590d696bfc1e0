"""Offline generation throughput: Seawall's OfflineEngine vs transformers, measured in the same run.

Workload: ``--num-requests`` (64) prompts of ``--prompt-len`` (128) random token ids, each generating exactly
``--output-len`` (64) tokens greedily (Seawall: ``ignore_eos=True``; transformers: no eos token, so nothing
stops early). fp32 on the CPU, torch's default thread count. ``--mixed-output`` draws each request's output
length from [1, --output-len] instead, where a static batch has to run to its longest request.

Systems, each warmed up once with a small run before timing:

* ``seawall`` — ``OfflineEngine`` (continuous batching), default ``SchedulerConfig`` (whole prompts in one
  step), with ``chunk_size=512`` (chunked prefill), and with ``num_decode_steps=8`` (multi-step decoding,
  ``seawall run-batch``'s default);
* ``hf-batched`` — ``model.generate`` on left-padded batches with an attention mask, all requests in one
  batch and in batches of 16;
* ``floor: dense ops only`` — the projections, MLPs and ``lm_head`` rows every system runs, and nothing else
  (CPU only): what no engine computing the same fp32 matmuls can beat, printed as a bound on the ratio;
* ``hf-cb`` — transformers' continuous batching, ``model.generate_batch`` (sdpa attention, 256-token pages,
  ``max_batch_tokens=2048``), when the installed version has it.

The machine is shared and noisy, so the systems are timed ``--repeats`` times in interleaved rounds; the
best (minimum) wall time of each is its figure, and the median is printed next to it. Tokens/s = output
tokens / wall seconds. Timings are reported, never asserted. The target is Seawall >= 1.5x the better
transformers figure. Greedy outputs of Seawall are compared with transformers' batched outputs.

    .venv/bin/python bench/engine_throughput.py [--preset small | --model DIR] [--json OUT] [--profile 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seawall.bench.hf_baseline import quiet_transformers  # noqa: E402
from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model, init_model  # noqa: E402
from services.engine.checkpoint_report import kv_bytes_per_token  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.engine.model_config import ModelConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402

TARGET_RATIO = 1.5
HF_CB_PAGE_SIZE = 256
HF_CB_MAX_BATCH_TOKENS = 2048

Prompts = list[list[int]]
Runner = Callable[[Prompts, list[int]], list[list[int]]]  # (prompts, output length of each) -> outputs


# ---------------------------------------------------------------------------------------------- systems


def seawall_runner(model_dir: str, scheduler: SchedulerConfig, kv_bytes: int, device: str = "cpu",
                   dtype: str = "float32", cpu_kernels: bool = True,
                   kv_sharing_fast_prefill: bool = True) -> tuple[Runner, OfflineEngine]:
    engine = OfflineEngine(
        EngineConfig(model=model_dir, device=device, dtype=dtype, block_size=16, kv_cache_bytes=kv_bytes,
                     cpu_kernels=cpu_kernels, kv_sharing_fast_prefill=kv_sharing_fast_prefill),
        scheduler,
    )

    def run(prompts: Prompts, output_lens: list[int]) -> list[list[int]]:
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in output_lens]
        return [c.token_ids for c in engine.generate(prompts, params)]

    return run, engine


def dense_floor_runner(model, chunk: int = 512) -> Runner:
    """Only the dense work every system here does: each layer's projections and MLP and the ``lm_head`` on the
    sampled rows, for the prompts (in chunks of ``chunk`` tokens) and every decode step, on random activations.
    No attention, norms, RoPE, sampling or bookkeeping: its time bounds what any engine computing the same
    fp32 matmuls on this CPU could reach. Gemma 4's KV-sharing layers take only the prompts' last rows, as
    Seawall's fast prefill runs them (transformers runs them over every prompt token)."""
    layers, hidden = model.model.layers, model.config.hidden_size
    tail = model.config.kv_free_tail or len(layers)

    def dense(rows: int, layers=layers) -> None:
        x = torch.randn(rows, hidden)
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            if hasattr(attn, "qkv_proj"):
                x = x + attn.o_proj(attn.qkv_proj(x)[:, : attn.q_size])
            else:  # Gemma 4's KV-sharing layers: a query projection only
                x = x + attn.o_proj(attn.q_proj(x))
            if getattr(layer, "per_layer", False):  # Gemma 4's per-layer inputs
                x = x + layer.per_layer_projection(layer.per_layer_input_gate(x))
            if mlp.gated:
                gate, up = mlp.gate_up_proj(x).split(mlp.intermediate, dim=-1)
                x = x + mlp.down_proj(torch.nn.functional.silu(gate) * up)
            else:  # an MLP without a gate (GPT-NeoX, Falcon, OPT, GPT-2, Arcee)
                x = x + mlp.down_proj(mlp.act(mlp.up_proj(x)))

    @torch.inference_mode()
    def run(prompts: Prompts, output_lens: list[int]) -> list[list[int]]:
        total = sum(len(p) for p in prompts)
        for start in range(0, total, chunk):
            dense(min(chunk, total - start), layers[:tail])
        dense(len(prompts), layers[tail:])
        model.lm_head(torch.randn(len(prompts), hidden))
        for step in range(1, max(output_lens)):
            rows = sum(n > step for n in output_lens)
            dense(rows)
            model.lm_head(torch.randn(rows, hidden))
        return [[0] * n for n in output_lens]

    return run


def load_hf(model_dir: str, attn: str = "sdpa", device: str = "cpu", dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    if ModelConfig.from_dir(model_dir).attention_free:
        attn = "eager"  # an attention-free model has no attention to implement, and transformers refuses sdpa
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation=attn)
    except ValueError:  # no sdpa path in transformers for this architecture (BLOOM, MPT): its eager one
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                     attn_implementation="eager")
    model.to(device).eval()
    # No eos at all: generate() fills unset fields from model.generation_config, so clear it there too.
    model.generation_config.eos_token_id = None
    return model


def hf_batched_runner(model, batch_size: int) -> Runner:
    from transformers import GenerationConfig

    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0

    @torch.inference_mode()
    def run(prompts: Prompts, output_lens: list[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i : i + batch_size]
            lens = output_lens[i : i + batch_size]
            # A static batch runs until its longest request is done; the extra tokens are cut off below.
            config = GenerationConfig(max_new_tokens=max(lens), min_new_tokens=max(lens), do_sample=False,
                                      eos_token_id=None, pad_token_id=pad)
            width = max(len(p) for p in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, p in enumerate(batch):  # left padding
                ids[row, width - len(p):] = torch.tensor(p)
                mask[row, width - len(p):] = 1
            gen = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                 generation_config=config)
            out.extend(row[:n] for row, n in zip(gen[:, width:].tolist(), lens, strict=True))
        return out

    return run


def hf_cb_runner(model, num_requests: int) -> Runner:
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    def run(prompts: Prompts, output_lens: list[int]) -> list[list[int]]:
        longest = max(output_lens)
        config = GenerationConfig(max_new_tokens=longest, do_sample=False, eos_token_id=-1,
                                  pad_token_id=model.config.pad_token_id)
        tokens = sum(len(p) for p in prompts) + sum(output_lens)
        pages = len(prompts) * -(-(max(len(p) for p in prompts) + longest) // HF_CB_PAGE_SIZE)
        cb = ContinuousBatchingConfig(
            page_size=HF_CB_PAGE_SIZE,
            num_blocks=max(pages, -(-tokens // HF_CB_PAGE_SIZE)) + 8,
            max_batch_tokens=HF_CB_MAX_BATCH_TOKENS,
            max_requests_per_batch=num_requests,
            allow_block_sharing=False,  # random prompts share nothing; Seawall has no prefix cache either
        )
        if len(set(output_lens)) == 1:
            results = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb)
            outs = [list(r.generated_tokens) for r in results.values()]
        else:  # generate_batch takes one max_new_tokens for all; add the requests one by one instead
            outs = _hf_cb_per_request(model, prompts, output_lens, config, cb)
        if len(outs) != len(prompts):
            raise RuntimeError(f"continuous batching returned {len(outs)} of {len(prompts)} requests")
        return outs

    return run


def _hf_cb_per_request(model, prompts: Prompts, output_lens: list[int], config, cb) -> list[list[int]]:
    done = {}
    with model.continuous_batching_context_manager(generation_config=config, continuous_batching_config=cb,
                                                   block=True, timeout=5) as manager:
        ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=n)
               for i, (p, n) in enumerate(zip(prompts, output_lens, strict=True))]
        while len(done) < len(ids):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("the continuous batching thread stopped")
                continue
            if result.is_finished():
                done[result.request_id] = list(result.generated_tokens)
    return [done[i] for i in ids]


# ---------------------------------------------------------------------------------------------- measuring


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[int, float]:
    """(rows identical, mean length of the common prefix)."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    prefix = []
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        prefix.append(n)
    return same, statistics.mean(prefix)


def resolve_model(args) -> tuple[str, tempfile.TemporaryDirectory | None]:
    if args.model:
        return args.model, None
    if args.preset == "tiny":
        return str(ensure_default_model("tiny")), None
    tmp = tempfile.TemporaryDirectory(prefix="seawall-bench-")
    return str(init_model(Path(tmp.name) / args.preset, preset=args.preset, seed=0)), tmp


def kv_bytes_for(model_dir: str, num_requests: int, tokens_per_request: int) -> int:
    # As the checkpoint report counts it: the layers that keep KV only (none in an attention-free model).
    per_token = kv_bytes_per_token(ModelConfig.from_dir(model_dir), "float32")
    blocks = num_requests * (-(-tokens_per_request // 16) + 1)
    return max(256 * 2**20, 2 * blocks * 16 * per_token)


def profile_seawall(run: Runner, prompts: Prompts, output_lens: list[int], top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    run(prompts, output_lens)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main() -> int:  # noqa: C901, PLR0915
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="Hugging Face checkpoint directory (default: the built-in model)")
    ap.add_argument("--preset", default="tiny", choices=("tiny", "small"),
                    help="built-in preset when --model is not given; small is initialised into a temp dir")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--mixed-output", action="store_true",
                    help="output lengths uniform in [1, --output-len] per request (seeded) instead of all equal; "
                         "static batches then run to their longest request and count only requested tokens")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds; each system's best time is used")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both systems run there)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--torch-ops", action="store_true",
                    help="also run Seawall's default config without its fused CPU kernels (--no-cpu-kernels)")
    ap.add_argument("--skip-hf-cb", action="store_true", help="leave out transformers' generate_batch")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, cProfile one Seawall (default config) run and print the top N entries")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    quiet_transformers()

    model_dir, tmp = resolve_model(args)
    rng = random.Random(args.seed)
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]

    def draw_prompts() -> Prompts:
        return [[rng.randrange(10, vocab) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]

    # Every round gets prompts of its own (the same for every system in that round): Seawall's prefix cache
    # would otherwise serve all but the last block of each prompt from the previous round.
    round_prompts = [draw_prompts() for _ in range(args.repeats)]
    if args.mixed_output:
        output_lens = [rng.randint(1, args.output_len) for _ in range(args.num_requests)]
    else:
        output_lens = [args.output_len] * args.num_requests
    warm_prompts = [p[: max(1, args.prompt_len // 4)] for p in draw_prompts()[:4]]
    warm_lens = [8, 4, 8, 6][: len(warm_prompts)] if args.mixed_output else [8] * len(warm_prompts)
    out_tokens = sum(output_lens)
    kv = kv_bytes_for(model_dir, args.num_requests, args.prompt_len + args.output_len)
    shape = f"1..{args.output_len}, {out_tokens} in all" if args.mixed_output else f"{args.output_len}"
    print(f"model {model_dir}; {args.num_requests} requests x (prompt {args.prompt_len}, output "
          f"{shape}); {args.dtype} on {args.device}, {torch.get_num_threads()} torch threads, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; {args.repeats} rounds")

    systems: dict[str, Runner] = {}
    notes: dict[str, str] = {}
    run_default, engine = seawall_runner(model_dir, SchedulerConfig(), kv, args.device, args.dtype)
    systems["seawall (default)"] = run_default
    systems["seawall (chunk_size=512)"], _ = seawall_runner(model_dir, SchedulerConfig(chunk_size=512), kv,
                                                                args.device, args.dtype)
    # What `seawall run-batch` runs by default: 8 decode passes per step while nothing waits.
    systems["seawall (decode_steps=8)"], _ = seawall_runner(model_dir, SchedulerConfig(num_decode_steps=8), kv,
                                                              args.device, args.dtype)
    if args.torch_ops and engine.runner.kernels is not None:
        # The same engine without the fused CPU kernels: what they are worth, in this run.
        systems["seawall (torch ops)"], _ = seawall_runner(model_dir, SchedulerConfig(), kv, args.device, args.dtype,
                                                           cpu_kernels=False)
    if engine.runner.model.config.kv_free_tail is not None:  # Gemma 4 E2B/E4B: what its fast prefill is worth
        systems["seawall (every row shared)"], _ = seawall_runner(model_dir, SchedulerConfig(), kv, args.device,
                                                                  args.dtype, kv_sharing_fast_prefill=False)
    if args.device == "cpu" and not engine.runner.checkpoint.config.recurrent:  # the floor is attention layers'
        systems["floor: dense ops only"] = dense_floor_runner(engine.runner.model)
    hf_model = load_hf(model_dir, device=args.device, dtype=args.dtype)
    systems[f"hf-batched (batch {args.num_requests})"] = hf_batched_runner(hf_model, args.num_requests)
    if args.num_requests > 16:
        systems["hf-batched (batch 16)"] = hf_batched_runner(hf_model, 16)
    if not args.skip_hf_cb:
        try:
            cb_model = load_hf(model_dir, device=args.device, dtype=args.dtype)
            if not hasattr(cb_model, "generate_batch"):
                raise AttributeError("this transformers has no generate_batch")
            systems["hf-cb (generate_batch)"] = hf_cb_runner(cb_model, args.num_requests)
        except Exception as exc:  # noqa: BLE001 - report and go on without it
            notes["hf-cb (generate_batch)"] = f"unavailable: {exc!r}"

    for name in list(systems):
        try:
            systems[name](warm_prompts, warm_lens)
        except Exception as exc:  # noqa: BLE001
            notes[name] = f"failed in warm-up: {exc!r}"
            del systems[name]

    times: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list[list[int]]] = {}
    started = time.perf_counter()
    for prompts in round_prompts:
        for name in list(systems):
            try:
                t0 = time.perf_counter()
                out = systems[name](prompts, output_lens)
                times[name].append(time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001
                notes[name] = f"failed: {exc!r}"
                del systems[name], times[name]
                continue
            if [len(o) for o in out] != output_lens:
                notes[name] = "some outputs are not of the requested length"
            if not name.startswith("floor"):  # it generates nothing
                outputs[name] = out
    bench_seconds = time.perf_counter() - started

    rows = []
    for name, ts in times.items():
        best = min(ts)
        rows.append({"system": name, "best_s": best, "median_s": statistics.median(ts), "times_s": ts,
                     "tokens_per_s": out_tokens / best, "tokens_per_s_median": out_tokens / statistics.median(ts)})
    print(f"\n{'system':<28} {'best s':>8} {'median s':>9} {'tok/s (best)':>13} {'tok/s (median)':>15}")
    for r in rows:
        print(f"{r['system']:<28} {r['best_s']:>8.2f} {r['median_s']:>9.2f} {r['tokens_per_s']:>13.0f} "
              f"{r['tokens_per_s_median']:>15.0f}")
    for name, note in notes.items():
        print(f"  note: {name}: {note}")
    noisy = [r["system"] for r in rows if r["median_s"] > 1.5 * r["best_s"]]
    if noisy:
        print(f"  note: median > 1.5x best for {', '.join(noisy)}: the CPU was contended during some rounds "
              "(other processes); the best times are the figures to compare")

    by_name = {r["system"]: r for r in rows}
    floor = by_name.get("floor: dense ops only")
    seawall = [r for r in rows if r["system"].startswith("seawall")]
    hf = [r for r in rows if r["system"].startswith("hf-")]
    summary = {}
    if seawall and hf:
        best_sw = max(seawall, key=lambda r: r["tokens_per_s"])
        best_hf = max(hf, key=lambda r: r["tokens_per_s"])
        sw_default = by_name.get("seawall (default)")
        ratio = best_sw["tokens_per_s"] / best_hf["tokens_per_s"]
        ratio_med = max(r["tokens_per_s_median"] for r in seawall) / max(r["tokens_per_s_median"] for r in hf)
        print(f"\nbest Seawall: {best_sw['system']} {best_sw['tokens_per_s']:.0f} tok/s; best transformers: "
              f"{best_hf['system']} {best_hf['tokens_per_s']:.0f} tok/s")
        print(f"ratio Seawall / transformers = {ratio:.2f}x on best times ({ratio_med:.2f}x on medians); "
              f"target >= {TARGET_RATIO}x -> {'MET' if ratio >= TARGET_RATIO else 'NOT MET'}")
        summary = {"best_seawall": best_sw["system"], "best_transformers": best_hf["system"], "ratio": ratio,
                   "ratio_median": ratio_med, "target": TARGET_RATIO, "target_met": ratio >= TARGET_RATIO}
        if sw_default:
            summary["ratio_default_config"] = sw_default["tokens_per_s"] / best_hf["tokens_per_s"]
        if floor:
            bound = floor["tokens_per_s"] / best_hf["tokens_per_s"]
            summary["ratio_bound_dense_floor"] = bound
            print(f"dense-op floor {floor['best_s']:.2f} s: no engine doing these fp32 matmuls here beats "
                  f"{bound:.2f}x transformers, even with free attention, sampling and scheduling")

    agree = {}
    ref_name = f"hf-batched (batch {args.num_requests})"
    if ref_name in outputs:
        print(f"\ngreedy agreement with {ref_name} (rows identical / mean common prefix; mean output "
              f"{out_tokens / args.num_requests:.1f}):")
        for name, out in outputs.items():
            if name == ref_name:
                continue
            same, prefix = agreement(out, outputs[ref_name])
            agree[name] = {"identical": same, "mean_common_prefix": prefix}
            print(f"  {name:<28} {same:>3}/{len(out)}   {prefix:6.1f}")
    print(f"\ntimed rounds took {bench_seconds:.0f} s")

    profile = None
    if args.profile:
        profile = profile_seawall(run_default, draw_prompts(), output_lens, args.profile)
        print(f"\ncProfile of one Seawall (default config) run, by own time:\n{profile}")

    if args.json:
        args.json.write_text(json.dumps({
            "model": model_dir, "num_requests": args.num_requests, "prompt_len": args.prompt_len,
            "output_len": args.output_len, "mixed_output": args.mixed_output, "output_tokens": out_tokens,
            "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
            "results": rows, "summary": summary, "agreement": agree, "notes": notes,
            "timed_seconds": bench_seconds, "kv_blocks": engine.blocks.num_blocks,
        }, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
