"""Roofline cost model: monotonicity, tensor parallelism, KV pool sizing, calibration anchors, measured tables."""

from __future__ import annotations

import json

import pytest

from seawall.sim.calibration import ANCHORS, evaluate
from seawall.sim.cost_model import (
    MEASURED_FORMAT,
    MeasuredCostModel,
    RooflineCostModel,
    StepShape,
    kv_pool_blocks,
)
from seawall.sim.hardware import GPUS, get_gpu
from seawall.sim.models import MODELS, get_model, with_kv_cache_dtype
from services.common.errors import InvalidArgument


def _cost(model="Mistral-7B", gpu="A100-80GB", tp=1):
    return RooflineCostModel(get_model(model), get_gpu(gpu), tp)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_step_time_grows_with_tokens_and_context(model, gpu):
    tp = 4 if model in ("llama-2-70b", "yi-34b", "qwen2.5-32b") else 1
    cost = RooflineCostModel(MODELS[model], GPUS[gpu], tp)
    prefill = [cost.step_time(StepShape.of([(n, 0)])) for n in (1, 16, 128, 512, 2048, 8192)]
    assert all(a < b for a, b in zip(prefill, prefill[1:], strict=False))
    decode = [cost.step_time(StepShape.of(decodes=[ctx] * 32)) for ctx in (128, 1024, 8192)]
    assert all(a < b for a, b in zip(decode, decode[1:], strict=False))
    assert cost.step_time(StepShape()) == 0.0


def test_a_later_chunk_costs_more_than_the_first():
    cost = _cost()
    assert cost.step_time(StepShape.of([(512, 16384)])) > 1.5 * cost.step_time(StepShape.of([(512, 0)]))


def test_tensor_parallelism_halves_compute_bound_work():
    one, two = _cost("Llama-2-7B", "A100-80GB", 1), _cost("Llama-2-7B", "A100-80GB", 2)
    # A long prefill is compute bound: twice the GPUs take about half the time (plus all-reduces).
    big = StepShape.of([(8192, 0)])
    assert 0.45 < two.step_time(big) / one.step_time(big) < 0.6
    # A small decode batch is bound by reading the weights, which are split too; the fixed per-step costs
    # and the all-reduce latencies are not (so TP barely helps a 7B model decode, and does help a 70B one).
    small = StepShape.of(decodes=[512] * 8)
    assert 0.8 < two.step_time(small) / one.step_time(small) < 1.0
    tp4, tp8 = _cost("Llama-2-70B", "H100", 4), _cost("Llama-2-70B", "H100", 8)
    assert 0.5 < tp8.step_time(small) / tp4.step_time(small) < 0.75
    with pytest.raises(InvalidArgument):
        _cost("Llama-2-7B", "A100-80GB", 3)


def test_faster_gpus_are_faster():
    shape = StepShape.of([(1024, 0)], [2048] * 64)
    times = [_cost("Llama-2-7B", g).step_time(shape) for g in ("A40", "A100-40GB", "H100")]
    assert times == sorted(times, reverse=True)
    dec = StepShape.of(decodes=[4096] * 32)
    assert _cost("Llama-2-7B", "H200").step_time(dec) < _cost("Llama-2-7B", "H100").step_time(dec)


def test_swap_time_is_bytes_over_pcie():
    cost = _cost("Llama-2-7B", "A100-40GB")
    block_bytes = 16 * get_model("Llama-2-7B").kv_bytes_per_token
    assert cost.swap_time(100) == pytest.approx(100 * block_bytes / 25e9, rel=0.05)
    assert cost.swap_time(0) == 0.0


def test_kv_pool_from_memory_minus_weights():
    # vLLM SOSP'23: OPT-13B on one A100-40GB leaves ~12 GB of KV, 15.7K token slots.
    slots = kv_pool_blocks(get_model("OPT-13B"), get_gpu("A100-40GB")) * 16
    assert slots == pytest.approx(15_700, rel=0.05)
    one = kv_pool_blocks(get_model("Llama-2-70B"), get_gpu("A100-80GB"), tp=4)
    two = kv_pool_blocks(get_model("Llama-2-70B"), get_gpu("A100-80GB"), tp=8)
    assert two > 2 * one  # twice the memory, the same weights
    with pytest.raises(InvalidArgument, match="does not fit"):
        kv_pool_blocks(get_model("Llama-2-70B"), get_gpu("A100-80GB"), tp=1)


@pytest.mark.parametrize("anchor", [a for a in ANCHORS if a.tolerance is not None], ids=lambda a: a.id)
def test_calibration_anchor_within_tolerance(anchor):
    ratio = anchor.ours() / anchor.measured
    assert abs(ratio - 1) <= anchor.tolerance, f"{anchor.id}: ours/measured = {ratio:.3f}"


def test_known_mismatches_are_explained():
    for row in evaluate():
        if row["ok"] is None:
            assert row["note"].startswith("not matched")


def test_measured_table_interpolates_and_extrapolates(tmp_path):
    # A synthetic engine: 5 ms + 0.1 ms/token + 0.01 ms/sequence + 1 us per context row.
    def truth(t, s, c):
        return 0.005 + 1e-4 * t + 1e-5 * s + 1e-6 * c

    samples = [{"num_tokens": t, "num_seqs": s, "context": c, "seconds": truth(t, s, c)}
               for t in (1, 64, 256, 1024) for s in (1, 8) for c in (t, 4 * t + 100)]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"format": MEASURED_FORMAT, "samples": samples, "block_bytes": 1e6,
                                "swap_bytes_per_s": 1e9}))
    model = MeasuredCostModel.from_file(path)
    shape = StepShape.of([(500, 300)], [200] * 7)
    assert model.step_time(shape) == pytest.approx(truth(shape.num_tokens, shape.num_seqs, shape.context),
                                                   rel=0.02)
    big = StepShape.of([(4096, 0)])
    assert model.step_time(big) == pytest.approx(truth(4096, 1, 4096), rel=0.02)
    assert model.swap_time(10) == pytest.approx(0.01)


def test_measured_table_errors_name_the_problem(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": "nope", "samples": []}))
    with pytest.raises(InvalidArgument, match="format"):
        MeasuredCostModel.from_file(path)
    path.write_text(json.dumps({"format": MEASURED_FORMAT, "samples": [{"num_tokens": 1}]}))
    with pytest.raises(InvalidArgument, match="seconds"):
        MeasuredCostModel.from_file(path)


# GPT-OSS's published active counts (3.61B, 5.13B) leave out the embedding table (0.58B); these add it back.
@pytest.mark.parametrize("model, total, active", [("Mixtral-8x7B", 46.7e9, 12.9e9), ("Qwen3-30B-A3B", 30.5e9, 3.3e9),
                                                  ("gpt-oss-20b", 20.9e9, 4.19e9), ("gpt-oss-120b", 116.8e9, 5.71e9)])
def test_mixtures_of_experts_have_their_published_sizes(model, total, active):
    m = get_model(model)
    assert m.num_params == pytest.approx(total, rel=0.01) and m.active_params == pytest.approx(active, rel=0.02)
    assert get_model("Llama-3-8B").active_params == get_model("Llama-3-8B").num_params


def test_a_decode_reads_only_the_experts_its_tokens_route_to():
    m, gpu = get_model("Qwen3-30B-A3B"), get_gpu("H100")
    cost = RooflineCostModel(m, gpu)
    eff = cost.eff
    # One token touches exactly k experts: the layer's experts cost k experts' weights at memory speed.
    assert cost._experts_time(1) == pytest.approx(
        (8 * m.expert_params + 8 * 2 * (m.hidden_size + m.expert_size)) * 2 / (gpu.hbm_bandwidth * eff.memory))
    # A large batch touches every expert: the read is all 128 experts, no more, however many tokens.
    assert cost._experts_time(256) < 128 / 8 * cost._experts_time(1) * 1.1
    # So a step of 64 decodes costs far less than 64 single-token steps, and a long prompt is compute bound.
    one, batch = cost.step_time(StepShape.of(decodes=[1024])), cost.step_time(StepShape.of(decodes=[1024] * 64))
    assert batch < 8 * one
    assert cost._experts_time(8192) > 2 * 8192 * 8 * m.expert_params / gpu.peak_flops
    with pytest.raises(InvalidArgument, match="does not fit on 1 x H100"):
        kv_pool_blocks(get_model("Mixtral-8x7B"), gpu)  # 93 GB of weights
    assert kv_pool_blocks(get_model("Mixtral-8x7B"), gpu, tp=2) > 0


def test_a_float8_kv_cache_halves_the_bytes_a_token_keeps_reads_and_swaps():
    """--kv-cache-dtype fp8: one byte a KV element. Twice the blocks in the memory left after the weights, a decode's
    attention reads half the bytes (a memory-bound step is faster), swaps move half; weights are unchanged."""
    model, gpu = get_model("Llama-3-8B"), get_gpu("A100-80GB")
    fp8 = with_kv_cache_dtype(model, "fp8")
    assert with_kv_cache_dtype(model, "auto") is model and with_kv_cache_dtype(model, "fp8_e5m2") == fp8
    assert 2 * fp8.kv_bytes_per_token == model.kv_bytes_per_token and fp8.weight_bytes == model.weight_bytes
    blocks = kv_pool_blocks(model, gpu)
    assert kv_pool_blocks(fp8, gpu) in (2 * blocks, 2 * blocks + 1)
    decodes = StepShape.of([(1, 4096)] * 64)
    wide, narrow = RooflineCostModel(model, gpu), RooflineCostModel(fp8, gpu)
    assert narrow.step_time(decodes) < 0.8 * wide.step_time(decodes)
    assert narrow.swap_time(10) < wide.swap_time(10)
    with pytest.raises(InvalidArgument, match="--kv-cache-dtype must be one of auto, fp8"):
        with_kv_cache_dtype(model, "int8")
