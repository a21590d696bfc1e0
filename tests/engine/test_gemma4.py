"""Gemma 4 (services/engine/gemma4.py, gemma4_layer.py): configs read as transformers reads them (E2B's as published,
the MoE layout, the per-layer config transformers saves) and what is refused. The oracle runs are in
test_architectures.py ("gemma4", "gemma4-e2b": fp32 both paths, bf16), tests/seawall/offline/test_layer_kv_shapes.py
(every scheduling path), test_vision_language.py (the vision-language checkpoint) and
tests/e2e/test_layer_kv_shapes_mesh.py (the disaggregated mesh)."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument, ModelLoadError
from services.common.lora import read_lora
from services.common.step import LoraRef
from services.engine.checkpoint_report import kv_bytes_per_token, report
from services.engine.model_config import ModelConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

_S, _F = "sliding_attention", "full_attention"
# gemma-4-E2B-it's text_config as published (its tokens' and heads' fields; the rest are transformers' defaults).
E2B_TEXT = dict(hidden_size=1536, num_hidden_layers=35, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                global_head_dim=512, num_global_key_value_heads=None, attention_k_eq_v=False, sliding_window=512,
                vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256,
                num_kv_shared_layers=20, use_double_wide_mlp=True, intermediate_size=6144,
                max_position_embeddings=131072, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                layer_types=([_S] * 4 + [_F]) * 7, model_type="gemma4_text")


def _text(**fields) -> tuple[ModelConfig, object]:
    hf = transformers.Gemma4TextConfig(**fields)
    return ModelConfig.from_dict({**hf.to_dict(), "architectures": ["Gemma4ForCausalLM"]}), hf


def _heads(hf, layer: int) -> tuple[int, int]:
    c = hf.per_layer_config[layer]
    return c.num_key_value_heads, c.head_dim


def test_e2b_as_published_reads_as_transformers_reads_it():
    """Its language model: the first 15 layers keep KV, the last 20 read the last sliding (13) and full (14) ones';
    full-attention heads 512 wide; the sharing layers' MLPs twice as wide; per-layer inputs of 256."""
    raw = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "eos_token_id": [1, 106],
           "text_config": E2B_TEXT, "vision_config": {}, "audio_config": {}}
    config = ModelConfig.from_dict(raw)
    hf = transformers.Gemma4TextConfig(**{k: v for k, v in E2B_TEXT.items() if k != "model_type"})
    g = config.gemma4
    assert config.architecture == "Gemma4ForCausalLM" and config.vision_language == "Gemma4ForConditionalGeneration"
    assert config.kv_layers == tuple(range(15))
    modes = hf.kv_sharing_modes
    for i in range(35):
        source = g.kv_source[i]
        if modes[i] == "reuse":  # the last earlier layer of its type that keeps ("stores") its KV
            assert modes[source] == "store" and hf.layer_types[source] == hf.layer_types[i] and source < 15
        else:
            assert source == i
        assert config.layer_heads(i) == _heads(hf, i)
        assert g.mlp_width(i, config.intermediate_size) == 6144 * (2 if i >= 15 else 1)
    assert (g.per_layer_input, g.per_layer_vocab, g.num_experts, g.k_eq_v) == (256, 262144, 0, False)
    assert [config.slides(i) for i in range(35)] == [t == _S for t in hf.layer_types]
    assert config.sliding_window == 512 and config.final_softcap == 30.0 and config.tie_word_embeddings
    assert (config.rope_theta, config.local_rope_theta, config.rope_type) == (1e6, 1e4, "proportional")
    assert config.full_attention.rotary_dim == 512  # proportional RoPE spans the wide head (a quarter rotates)
    assert config.attn_scale == 1.0 and config.embed_scale == 1536**0.5 and not config.norm_unit_offset
    # 15 layers' KV: 12 sliding of 1 x 256 and 3 full of 1 x 512, each of those in two of the pool's slots.
    assert (config.kv_slot, config.kv_slots) == ((1, 256), 18)
    assert kv_bytes_per_token(config, "bfloat16") == (12 * 256 + 3 * 512) * 2 * 2
    assert config.eos_token_ids == (1,)


def test_named_alone_it_takes_transformers_defaults():
    config = ModelConfig.from_dict({"architectures": ["Gemma4ForCausalLM"]})
    hf = transformers.Gemma4TextConfig()
    saved = hf.to_dict()
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.max_position_embeddings,
            config.rms_norm_eps, config.sliding_window, config.hidden_act, config.tie_word_embeddings) == tuple(
        saved[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                           "rms_norm_eps", "sliding_window", "hidden_activation", "tie_word_embeddings"))
    assert [config.slides(i) for i in range(30)] == [t == _S for t in hf.layer_types]
    assert all(config.layer_heads(i) == _heads(hf, i) for i in range(30))
    g = config.gemma4
    assert (g.per_layer_input, g.per_layer_vocab) == (hf.hidden_size_per_layer_input, hf.vocab_size_per_layer_input)
    assert config.kv_layers == tuple(range(30)) and not g.num_experts and config.final_softcap is None


def test_model_check_says_what_its_layers_keep(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma4ForConditionalGeneration"],
                                                      "text_config": E2B_TEXT}))
    facts = report(tmp_path)
    assert facts["served"] and facts["served_as"] == "Gemma4ForCausalLM"
    assert facts["attention"] == ("window of 512 in 28 of 35 layers, full in the rest; the full layers' 1 KV head of "
                                  "512; the last 20 layers read earlier layers' KV")
    assert facts["positions"] == ("RoPE: sliding layers' base 10000 over all 256 features; full layers' proportional "
                                  "(base 1e+06) over 128 of their 512")
    assert facts["kv_cache_bytes_per_token"]["bfloat16"] == (12 * 256 + 3 * 512) * 2 * 2


def test_the_moe_layout_and_keys_as_values():
    """26B-A4B's kind: fewer, wider KV heads in the full layers (their values are their keys' projection), experts
    beside each dense MLP, no per-layer inputs, every layer keeping KV."""
    config, hf = _text(hidden_size=2816, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=256, global_head_dim=512, num_global_key_value_heads=2, attention_k_eq_v=True,
                       enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
                       intermediate_size=2112, hidden_size_per_layer_input=0, sliding_window=1024)
    g = config.gemma4
    assert (g.num_experts, g.top_k, g.moe_intermediate, g.k_eq_v, g.per_layer_input) == (128, 8, 704, True, 0)
    assert config.kv_layers == tuple(range(12)) and g.kv_source == tuple(range(12))
    assert [config.slides(i) for i in range(12)] == [t == _S for t in hf.layer_types]  # every sixth full, the last
    shapes = config.kv_layer_shapes
    assert shapes == tuple(_heads(hf, i) for i in range(12)) and set(shapes) == {(8, 256), (2, 512)}
    # Slots of the full layers' 2 x 512; a sliding layer's 8 x 256 fill two.
    assert (config.kv_slot, config.kv_slots) == ((2, 512), 10 * 2 + 2)
    assert not config.is_moe(0)  # the experts are Gemma 4's own block, beside the MLP (gemma4_layer.py)


def test_the_per_layer_config_transformers_saves_reads_alike():
    """transformers 5 saves the full layers' widths as per_layer_config (no global_head_dim)."""
    fields = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                  layer_types=[_S, _F, _S, _F])
    config, hf = _text(**fields)
    saved = hf.to_dict()
    assert "global_head_dim" not in saved and saved["per_layer_config"]
    assert config.kv_layer_shapes == ((2, 16), (1, 32), (2, 16), (1, 32))
    legacy = ModelConfig.from_dict({**{k: v for k, v in saved.items() if k != "per_layer_config"},
                                    "architectures": ["Gemma4ForCausalLM"], "global_head_dim": 32,
                                    "num_global_key_value_heads": 1})
    assert legacy == config
    uneven = {**saved, "architectures": ["Gemma4ForCausalLM"], "per_layer_config": {"1": {"head_dim": 32}}}
    with pytest.raises(ModelLoadError, match="every full_attention layer the same head_dim"):
        ModelConfig.from_dict(uneven)


def test_widths_the_narrowest_does_not_divide_share_slots_of_their_common_width():
    config, _ = _text(num_hidden_layers=2, hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=16,
                      global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, layer_types=[_S, _F])
    assert config.kv_layer_shapes == ((3, 16), (1, 32))
    assert (config.kv_slot, config.kv_slots) == ((1, 16), 3 + 2)


@pytest.mark.parametrize(("fields", "message"), [
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention is 'all'"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 8},
     "top_k_experts in 1..num_experts"),
    ({"num_kv_shared_layers": 4}, "num_kv_shared_layers must be in 0..3"),
    ({"layer_types": [_S, "chunked_attention", _S, _F]}, "layer_types must name each of the 4 layers"),
    ({"num_kv_shared_layers": 2, "layer_types": [_S, _S, _F, _F]}, "layer 2 \\(full_attention\\) shares KV"),
    ({"rope_parameters": {_S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                          _F: {"rope_type": "default", "rope_theta": 1e6}}}, "sliding layers are served with default"),
    ({"hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 256}, "must cover vocab_size \\(512\\)"),
    ({"global_head_dim": 32, "num_global_key_value_heads": 3, "attention_k_eq_v": True},
     "full-attention layers' 3 KV heads must divide"),
])
def test_what_cannot_run_is_refused_saying_why(fields, message):
    raw = {"architectures": ["Gemma4ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
           "num_hidden_layers": 4, "layer_types": [_S, _F, _S, _F], **fields}
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(raw)


def test_a_lora_adapter_is_refused_saying_why(tmp_path):
    config, _ = _text(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, head_dim=16)
    with pytest.raises(InvalidArgument, match="Gemma4ForCausalLM takes no LoRA adapters"):
        read_lora(LoraRef("sql", str(tmp_path)), config.lora_shape, 64)


def _engine(path, fast: bool, dtype: str = "float32", **scheduler):
    from seawall.offline.engine import OfflineEngine
    from services.engine.config import EngineConfig
    from services.scheduler.core.scheduler import SchedulerConfig

    return OfflineEngine(EngineConfig(model=str(path), dtype=dtype, kv_sharing_fast_prefill=fast),
                         SchedulerConfig(**scheduler))


def _rows_through(layer) -> list[int]:
    """The rows each call of ``layer`` is given, as it runs."""
    rows: list[int] = []
    layer.register_forward_hook(lambda _module, _args, out: rows.append(out.shape[0]))
    return rows


def test_kv_sharing_layers_run_only_the_rows_sampled_from(tmp_path, tiny_model_dir):
    """The fast prefill (default): the KV-sharing layers, which write no KV, run the rows logits are taken from
    and no other: a token sampled, one row. Tokens, logprobs and prompt logprobs are those of every row run
    (through chunks of 7, a prompt scored, drafts verified); bf16's first token bit for bit as transformers'
    generate computes it (which slices to the last row before those layers too)."""
    import torch

    from services.common.sampling_params import SamplingParams
    from tests.engine.test_architectures import CASES, save_checkpoint

    model = save_checkpoint(CASES["gemma4-e2b"](), tmp_path, tiny_model_dir)
    g = torch.Generator().manual_seed(50)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (40, 150)]
    rows = {}
    for fast in (True, False):
        engine = _engine(tmp_path, fast, chunk_size=7)
        layers = engine.runner.model.model.layers
        first, last = _rows_through(layers[0]), _rows_through(layers[-1])
        engine.generate(prompts, [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)] * 2)
        rows[fast] = [sum(first), sum(last)]
    assert rows == {True: [204, 16], False: [204, 204]}  # 190 prompt tokens and 14 decodes; 16 tokens sampled

    repeating = [*range(10, 30)] * 3  # n-gram drafts find matches in it
    params = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=2),
              SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3)]
    runs = [_engine(tmp_path, fast, chunk_size=7, num_speculative_tokens=3).generate([repeating, prompts[1]], params)
            for fast in (True, False)]
    for on, off in zip(*runs, strict=True):
        assert on.token_ids == off.token_ids
        for a, b in zip(on.logprobs + on.prompt_logprobs, off.logprobs + off.prompt_logprobs, strict=True):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-5)
    assert len(runs[0][0].prompt_logprobs) == len(repeating) - 1

    bf16 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    got = _engine(tmp_path, True, "bfloat16").generate(
        prompts, [SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=5)] * 2)
    for prompt, comp in zip(prompts, got, strict=True):
        with torch.no_grad():  # as generate runs it: the KV-sharing layers over the last row only
            want = torch.log_softmax(bf16(torch.tensor([prompt]), logits_to_keep=1).logits[0, -1].float(), -1)
        top = comp.logprobs[0].top_logprobs
        assert [lp for _, lp in top] == pytest.approx([want[t].item() for t, _ in top], abs=1e-6)
    del model
