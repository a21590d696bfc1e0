"""DeepSeek-V3.2's sparse attention (services/engine/dsa.py): its selection under other prompt chunks and a cached
prefix (the indexer's keys read back from the pool's rows), and its config fields' checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.errors import ModelLoadError
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.engine.model_config import ModelConfig
from services.scheduler.core.scheduler import SchedulerConfig
from tests.engine.test_architectures import CASES, MAX_TOKENS, assert_matches_transformers, save_checkpoint

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")


def test_top_keys_are_chosen_alike_under_small_chunks_and_a_cached_prefix(tmp_path, tiny_model_dir):
    """Prompt chunks of 5 tokens, and a request whose first 48 tokens' latents and indexer keys come from the cache:
    each query attends the same 12 keys as transformers' (the same tokens and logprobs). (Both batch layouts, the
    torch groups' and the fused kernels', are in test_architectures.)"""
    model = save_checkpoint(CASES["deepseek-v3.2"](), tmp_path, tiny_model_dir)
    g = torch.Generator().manual_seed(9)
    shared = torch.randint(3, 4096, (50,), generator=g).tolist()
    prompts = [shared + torch.randint(3, 4096, (n,), generator=g).tolist() for n in (3, 61)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=0)
    engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32", cpu_kernels=False),
                           SchedulerConfig(chunk_size=5))
    first = engine.generate(prompts[:1], [params])
    second = engine.generate(prompts[1:], [params])
    assert second[0].num_cached_prompt_tokens >= 48
    assert_matches_transformers(model, prompts, first + second)


def test_the_indexer_widens_the_cached_latent_and_its_fields_are_checked():
    config = ModelConfig.from_dict({"architectures": ["DeepseekV32ForCausalLM"], "num_hidden_layers": 4,
                                    "index_topk": 1024, "index_head_dim": 64, "index_n_heads": 16})
    assert (config.head_dim, config.num_key_value_heads, config.index_topk, config.index_n_heads) == (
        512 + 64 + 64, 1, 1024, 16)
    assert config.moe_layers == (3,) and config.rope_interleaved  # 3 dense layers first, as transformers lays them
    with pytest.raises(ModelLoadError, match="index_head_dim >= qk_rope_head_dim"):
        ModelConfig.from_dict({"architectures": ["DeepseekV32ForCausalLM"], "index_head_dim": 32})
    with pytest.raises(ModelLoadError, match="sparse attention needs .* a q_lora_rank"):
        ModelConfig.from_dict({"architectures": ["DeepseekV32ForCausalLM"], "q_lora_rank": None})
    with pytest.raises(ModelLoadError, match="set index_topk too"):
        dataclasses.replace(config, index_topk=0)
    plain = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 64,
                                   "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                                   "max_position_embeddings": 64})
    with pytest.raises(ModelLoadError, match="sparse attention .* is latent attention's"):
        dataclasses.replace(plain, index_topk=8)


def test_glm5_reads_which_layers_share_a_choice_of_keys_as_transformers_derives_them():
    def shared(**raw):
        return ModelConfig.from_dict({"architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": 6, **raw})

    assert shared().index_shared_layers == () and shared().index_rope_interleaved  # every layer indexes by default
    for raw in ({"index_topk_freq": 2, "index_skip_topk_offset": 1}, {"index_topk_pattern": "FSFSFS"},
                {"indexer_types": ["full", "shared"] * 3}):
        want = transformers.GlmMoeDsaConfig(num_hidden_layers=6, **raw).indexer_types
        assert shared(**raw).index_shared_layers == tuple(i for i, t in enumerate(want) if t == "shared") == (1, 3, 5)
    with pytest.raises(ModelLoadError, match="indexer_types must name each of the 6 layers full or shared"):
        shared(indexer_types=["full"] * 5)
    with pytest.raises(ModelLoadError, match=r"sharing an earlier layer's choice of keys \(0,\)"):
        shared(indexer_types=["shared"] + ["full"] * 5)


def test_deepseek_v32_reads_its_released_config():
    """DeepSeek-V3.2's config.json as released (FP8 weights with ue8m0 scales, one multi-token-prediction layer,
    which is skipped, YaRN)."""
    config = ModelConfig.from_dict({
        "architectures": ["DeepseekV32ForCausalLM"], "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3,
        "hidden_size": 7168, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v32",
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 4,
        "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280})
    assert (config.head_dim, config.index_topk, config.index_n_heads, config.moe_layers[0], config.mtp_layers,
            config.fp8_block, config.rope_type, config.moe_groups) == (704, 2048, 64, 3, 1, (128, 128), "yarn", 8)


def test_axk2_lays_out_its_experts_as_transformers_derives_them_and_takes_no_adapters(tmp_path):
    from services.common.errors import InvalidArgument
    from services.common.lora import read_lora
    from services.common.step import LoraRef

    raw = {"architectures": ["AXK2ForCausalLM"], "num_hidden_layers": 6, "first_k_dense_replace": 2,
           "moe_layer_freq": 2}
    want = transformers.AXK2Config(num_hidden_layers=6, first_k_dense_replace=2, moe_layer_freq=2).mlp_layer_types
    config = ModelConfig.from_dict(raw)
    assert config.moe_layers == tuple(i for i, kind in enumerate(want) if kind == "sparse") == (2, 4)
    assert (config.mla_query_gate, config.self_gated_norm_rank, config.head_dim) == (True, 16, 128 + 32 + 128)
    with pytest.raises(InvalidArgument, match="AXK2ForCausalLM takes no LoRA adapters here yet: its query"):
        read_lora(LoraRef("sql", str(tmp_path)), config.lora_shape, 64)
    with pytest.raises(ModelLoadError, match="n_group and topk_group must be set together"):
        ModelConfig.from_dict({**raw, "n_group": 2})
    with pytest.raises(ModelLoadError, match="A.X K2 needs a q_lora_rank"):
        ModelConfig.from_dict({**raw, "q_lora_rank": None})
