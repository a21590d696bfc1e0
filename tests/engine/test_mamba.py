"""Attention-free state space models (Mamba, Falcon Mamba, Mamba-2) against transformers: greedy tokens and
logprobs on checkpoints transformers saved, their configs read as transformers reads them, and a KV pool that
holds nothing (its blocks only count tokens). Their scheduling paths: tests/seawall/offline/test_linear_attention.py."""

from __future__ import annotations

import json

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.errors import ModelLoadError
from services.common.sampling_params import SamplingParams
from services.engine.checkpoint_report import report
from services.engine.config import EngineConfig
from services.engine.kv_pool import ATTENTION_FREE_MAX_BLOCKS
from services.engine.linear_attention_config import Mamba1Shape, Mamba2Shape
from services.engine.model_config import ModelConfig
from services.scheduler.core.scheduler import SchedulerConfig
from tests.engine.test_architectures import (
    MAX_TOKENS,
    assert_matches_transformers,
    greedy_matches_transformers,
    save_checkpoint,
)

pytestmark = pytest.mark.oracle

transformers = pytest.importorskip("transformers")

_COMMON = dict(vocab_size=4096, hidden_size=64, num_hidden_layers=3, bos_token_id=1, eos_token_id=2)
CASES = {
    # Mamba with biases on its projections, no norms inside the mixer.
    "mamba": lambda: transformers.MambaConfig(state_size=8, time_step_rank=8, use_bias=True, **_COMMON),
    # Falcon Mamba: dt, B and C RMS-normed without weights (mixer_rms_eps).
    "falcon-mamba": lambda: transformers.FalconMambaConfig(state_size=8, time_step_rank=8, mixer_rms_eps=1e-5,
                                                           **_COMMON),
    # Mamba-2: heads sharing B and C in 2 groups, its output gated and normed in those groups.
    "mamba2": lambda: transformers.Mamba2Config(num_heads=8, head_dim=16, state_size=16, n_groups=2, chunk_size=16,
                                                **_COMMON),
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp(request.param)
    model = save_checkpoint(CASES[request.param](), out, tiny_model_dir)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (1, 17, 40, 150)]
    return out, model, prompts


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_greedy_tokens_and_logprobs_match_transformers(checkpoint, cpu_kernels):
    engine = greedy_matches_transformers(*checkpoint, cpu_kernels)
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_configs_are_read_as_transformers_reads_them(checkpoint):
    path, model, _ = checkpoint
    config, hf = ModelConfig.from_dir(path), model.config
    assert config.attention_free and config.kv_layers == () and config.linear_layers == (0, 1, 2)
    assert config.sublayers == ("mixer",) * 3 and not any(config.has_mlp(i) for i in range(3))
    assert config.rms_norm_eps == hf.layer_norm_epsilon and config.tie_word_embeddings == hf.tie_word_embeddings
    shape = config.linear_attention
    if hf.model_type == "mamba2":
        assert isinstance(shape, Mamba2Shape)
        assert (shape.num_heads, shape.head_dim, shape.state_size, shape.n_groups) == (8, 16, 16, 2)
        assert shape.intermediate == hf.expand * hf.hidden_size and shape.gated_norm == "gate_then_norm"
    else:
        assert isinstance(shape, Mamba1Shape)
        assert (shape.intermediate, shape.state_size, shape.dt_rank) == (hf.intermediate_size, 8, 8)
        assert shape.proj_bias == hf.use_bias
        assert shape.bcdt_norms == ("unweighted" if hf.model_type == "falcon_mamba" else "none")
        if hf.model_type == "falcon_mamba":
            assert shape.bcdt_norm_eps == hf.mixer_rms_eps
    # `seawall model check`'s report: no heads, no MLP, no KV, a state per sequence.
    facts = report(path)
    assert facts["served"] and "query_heads" not in facts and facts["mlp"] == "none"
    assert facts["attention"].startswith("none; Mamba") and facts["attention"].endswith("in every layer")
    assert facts["kv_cache_bytes_per_token"] == {"bfloat16": 0, "float32": 0}
    assert facts["recurrent_state_bytes_per_sequence"]["float32"] > 0


def test_the_kv_pool_holds_nothing_and_its_blocks_count_tokens(checkpoint):
    """No layer keeps KV: a block is 0 bytes, and there are enough of them for state_slots sequences of the
    served context (the scheduler's token accounting and prefix cache keys), however many KV bytes are given."""
    path, _, _ = checkpoint
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32", state_slots=3, max_model_len=1000,
                                        kv_cache_bytes=1, swap_bytes=0), SchedulerConfig())
    assert engine.runner.layout.num_layers == 0 and engine.runner.layout.bytes_per_block == 0
    assert engine.blocks.num_blocks == 3 * 63 and engine.runner.kv.num_host_blocks == 0  # ceil(1000 / 16) each
    default = OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig())
    assert default.blocks.num_blocks == ATTENTION_FREE_MAX_BLOCKS == default.runner.kv.num_host_blocks
    assert default.runner.max_model_len == 1 << 20  # no max_position_embeddings: a state has no length limit


def test_what_an_attention_free_config_cannot_be_is_refused(tmp_path):
    base = dict(_COMMON, architectures=["Mamba2ForCausalLM"], num_heads=8, head_dim=16, n_groups=2, expand=2)
    with pytest.raises(ModelLoadError, match=r"must fill expand \* hidden_size \(128\)"):
        ModelConfig.from_dict({**base, "head_dim": 8})
    with pytest.raises(ModelLoadError, match="groups that divide the heads"):
        ModelConfig.from_dict({**base, "n_groups": 3})
    with pytest.raises(ModelLoadError, match="convolve through silu"):
        ModelConfig.from_dict({**base, "hidden_act": "gelu"})
    mamba = dict(_COMMON, architectures=["MambaForCausalLM"], state_size=8)
    assert ModelConfig.from_dict(mamba).linear_attention.dt_rank == 4  # "auto": ceil(hidden / 16)
    with pytest.raises(ModelLoadError, match="convolution of at least 2"):
        ModelConfig.from_dict({**mamba, "conv_kernel": 1})
    falcon = dict(mamba, architectures=["FalconMambaForCausalLM"])
    with pytest.raises(ModelLoadError, match="mixer_rms_eps must be > 0"):
        ModelConfig.from_dict({**falcon, "mixer_rms_eps": -1.0})
    (tmp_path / "config.json").write_text(json.dumps(dict(mamba, intermediate_size=999)))
    assert ModelConfig.from_dir(tmp_path).linear_attention.intermediate == 128  # expand * hidden, as transformers sets it


@pytest.mark.parametrize("name", ["falcon-mamba", "mamba2"])
def test_bf16_rounds_as_transformers_does(name, tmp_path, tiny_model_dir):
    """residual_in_fp32 (the default): in bf16 the layers' outputs add up in a float32 stream that each norm reads
    cast to bf16, and the final norm reads whole; a config without it keeps the model's dtype. Prompt chunks of one
    token run in the prefill form, as transformers runs every prompt token (the decode form rounds ``x * D``
    otherwise), and Mamba-2's prompt chunks reach the gated norm in fp32, decodes in bf16, as transformers' do.
    Then bf16 tokens and logprobs equal transformers' (without the fp32 stream, or with the norm's input rounded,
    they diverged within a few tokens)."""
    model = save_checkpoint(CASES[name](), tmp_path, tiny_model_dir).to(torch.bfloat16)
    assert ModelConfig.from_dir(tmp_path).residual_in_fp32
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (1, 2, 40, 150)]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="bfloat16"), SchedulerConfig(chunk_size=16))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)] * len(prompts))
    assert_matches_transformers(model, prompts, got)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert not ModelConfig.from_dict({**raw, "residual_in_fp32": False}).residual_in_fp32


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_a_mamba2_prompt_chunk_of_one_token_clamps_its_time_step(tmp_path, tiny_model_dir, cpu_kernels):
    """time_step_limit clamps dt in transformers' prefill form (every prompt token), never in a decode: prompt
    chunks of 1 token (a 1-token prompt, chunks of 1 of the others) clamp it here as well."""
    config = CASES["mamba2"]()
    config.time_step_limit = (0.0, 0.5)
    model = save_checkpoint(config, tmp_path, tiny_model_dir)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (1, 5, 33)]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32", cpu_kernels=cpu_kernels),
                           SchedulerConfig(chunk_size=1))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)] * len(prompts))
    assert_matches_transformers(model, prompts, got)

