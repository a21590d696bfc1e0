"""``seawall model check DIR``: whether a checkpoint is served and as what, from its config, safetensors headers and
tokenizer alone; the reason and exit status 1 where it is refused."""

from __future__ import annotations

import json
import shutil

import pytest

from seawall.cli import main
from services.engine.checkpoint_report import kv_bytes_per_token, report
from services.engine.model_config import ModelConfig
from tests.engine.test_aliases import GEMMA_7B, LFM2_1_2B, NEMOTRON_NANO_2, QWEN3_NEXT
from tests.engine.test_architectures import DEEPSEEK_V3


def _dir(tmp_path, config: dict, tokenizer_from=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    if tokenizer_from is not None:
        shutil.copy(tokenizer_from / "tokenizer.json", tmp_path / "tokenizer.json")
    return tmp_path


def test_the_built_in_model_is_served_with_its_parameters_counted_from_the_headers(tiny_model_dir, capsys):
    assert main(["model", "check", str(tiny_model_dir)]) == 0
    text = capsys.readouterr().out
    assert ": served" in text and "LlamaForCausalLM" in text and "tokenizer.json, with a chat template" in text
    assert main(["model", "check", str(tiny_model_dir), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    config = ModelConfig.from_dir(tiny_model_dir)
    # Parameters: embeddings (tied head) + per layer q, k, v, o, gate, up, down and two norms + the final norm.
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.num_attention_heads, config.num_key_value_heads
    d = config.head_dim
    per_layer = h * q * d * 2 + h * kv * d * 2 + 3 * h * i + 2 * h
    assert facts["weights"]["parameters"] == config.vocab_size * h + config.num_hidden_layers * per_layer + h
    assert facts["kv_cache_bytes_per_token"]["float32"] == config.num_hidden_layers * 2 * kv * d * 4
    assert facts["kv_cache_bytes_per_token"]["fp8"] == config.num_hidden_layers * 2 * kv * d  # --kv-cache-dtype fp8
    assert facts["served_as"] == "LlamaForCausalLM" and facts["output"] == "text"


def test_an_alias_says_what_it_is_served_as_and_latent_attention_its_one_latent(tmp_path, tiny_model_dir):
    gemma = report(_dir(tmp_path / "gemma", GEMMA_7B, tiny_model_dir))
    assert gemma["served"] and (gemma["architecture"], gemma["served_as"]) == ("GemmaForCausalLM", "Gemma2ForCausalLM")
    assert gemma["attention"] == "full" and gemma["weights"]["files"] == 0
    deepseek = report(_dir(tmp_path / "deepseek", DEEPSEEK_V3))
    assert deepseek["attention"].startswith("latent (MLA): one 576-wide latent")
    assert deepseek["kv_cache_bytes_per_token"]["bfloat16"] == 61 * 576 * 2
    assert deepseek["kv_cache_bytes_per_token"]["fp8"] == 61 * 576  # a float8 latent
    assert "256 routed (8 a token" in deepseek["experts"] and "in 58 of 61 layers" in deepseek["experts"]
    assert deepseek["quantization"] == "FP8 weights, dequantized as they load"
    assert deepseek["tokenizer"].startswith("missing")
    assert kv_bytes_per_token(ModelConfig.from_dict(GEMMA_7B), "bfloat16") == 28 * 2 * 16 * 256 * 2


def test_a_hybrid_counts_kv_in_its_attention_layers_and_a_state_per_sequence(tmp_path, capsys):
    """Qwen3-Next: KV in 12 of 48 layers; 36 linear layers of 32 value heads' 128 x 128 fp32 states beside a
    3-wide window of 8192 channels. Granite 4.0-H: Mamba-2's heads of 40 channels with a 256-wide state each."""
    facts = report(_dir(tmp_path, QWEN3_NEXT))
    assert facts["kv_cache_bytes_per_token"]["bfloat16"] == 12 * 2 * 2 * 256 * 2
    assert facts["recurrent_state_bytes_per_sequence"]["bfloat16"] == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    assert facts["attention"].startswith("full in 12 of 48 layers; Gated DeltaNet linear attention (32 value heads")
    assert main(["model", "check", str(tmp_path)]) == 0
    assert "state         73.7 MiB a sequence in bfloat16" in capsys.readouterr().out
    granite_h = report(_dir(tmp_path / "granite-h", {
        "architectures": ["GraniteMoeHybridForCausalLM"], "layer_types": ["mamba", "attention", "mamba", "mamba"],
        "num_hidden_layers": 4, "hidden_size": 2560, "num_attention_heads": 40, "num_key_value_heads": 8,
        "num_local_experts": 0, "shared_intermediate_size": 8192}))
    assert granite_h["attention"].startswith("full in 1 of 4 layers; Mamba-2 (128 heads of 40, a 256-wide state")
    assert granite_h["recurrent_state_bytes_per_sequence"]["float32"] == 3 * ((5120 + 512) * 3 * 4 + 128 * 40 * 256 * 4)
    lfm2 = report(_dir(tmp_path / "lfm2", LFM2_1_2B))
    assert lfm2["attention"].startswith("full in 6 of 16 layers; gated short convolution (3 tokens wide, a recurrent")
    assert lfm2["recurrent_state_bytes_per_sequence"]["bfloat16"] == 10 * 2048 * 2 * 2  # the window alone


def test_nemotron_h_counts_kv_in_its_attention_layers_only(tmp_path):
    """Nemotron Nano 2: 4 attention layers of 56 keep KV (its MLP layers keep none), 27 Mamba-2 layers of 128 heads
    of 80 channels a 128-wide state each beside a 3-wide window of 10240 + 2 x 8 x 128 channels; no RoPE."""
    facts = report(_dir(tmp_path, NEMOTRON_NANO_2))
    assert facts["kv_cache_bytes_per_token"]["bfloat16"] == 4 * 2 * 8 * 128 * 2
    assert facts["recurrent_state_bytes_per_sequence"]["bfloat16"] == 27 * (
        (10240 + 2048) * 3 * 2 + 128 * 80 * 128 * 4)
    assert facts["attention"] == ("full in 4 of 56 layers; Mamba-2 (128 heads of 80, a 128-wide state per channel, "
                                  "a recurrent state per sequence) in 27")
    assert facts["sublayers"] == "one a layer: a mixer in 31, an MLP in 25 of 56"
    assert facts["positions"].startswith("none")


def test_a_refused_checkpoint_says_why_and_exits_1(tmp_path, capsys):
    hybrid = {"architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 100, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "layer_types": ["mamba", "cross_attention"]}
    assert main(["model", "check", str(_dir(tmp_path / "granite", hybrid))]) == 1
    text = capsys.readouterr().out
    assert "not served (GraniteMoeHybridForCausalLM)" in text
    assert "layer_types must name each of the 2 layers attention or mamba; got cross_attention" in text


@pytest.mark.parametrize("missing", ["dir", "config"])
def test_a_directory_that_is_not_a_checkpoint_is_named(tmp_path, capsys, missing):
    target = tmp_path / "nowhere" if missing == "dir" else tmp_path
    code = main(["model", "check", str(target)])
    out = capsys.readouterr()
    assert code != 0 and ("is not a directory" in out.err + out.out or "has no config.json" in out.err + out.out)


def test_architectures_lists_every_served_name_and_how(capsys):
    from services.engine.aliases import ALIASES
    from services.engine.model_config import SUPPORTED_ARCHITECTURES

    assert main(["model", "architectures"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert set(SUPPORTED_ARCHITECTURES) | set(ALIASES) <= set(names) and names == sorted(names)
    assert any(line.startswith("GemmaForCausalLM") and "served as Gemma2ForCausalLM" in line for line in lines)
    assert any(line.startswith("LlavaForConditionalGeneration") and "its language model" in line for line in lines)


def test_init_where_the_model_cannot_be_written_says_so_in_one_line(tmp_path, capsys):
    # A parent that is a file (or a place this user cannot write) raised the OSError as a traceback.
    (tmp_path / "a-file").write_text("")
    assert main(["model", "init", str(tmp_path / "a-file" / "model")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the model to" in err and "Traceback" not in err


def test_a_checkpoint_with_calibrated_kv_scales_says_when_they_apply(tmp_path, tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "dense", "kv_cache_scheme": kv}
    facts = report(_dir(tmp_path, config, tiny_model_dir))
    assert facts["served"] and facts["quantization"] == "calibrated FP8 KV scales (used with --kv-cache-dtype fp8)"


def test_a_ternary_checkpoint_says_how_it_is_served(tmp_path, tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitnet", "linear_class": "bitlinear"}
    facts = report(_dir(tmp_path, config, tiny_model_dir))
    assert facts["quantization"] == ("BitNet ternary weights (packed), dequantized as they load; each projection's "
                                     "input rounded to 8 bits per token")
