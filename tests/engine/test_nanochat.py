"""nanochat (services/engine/nanochat.py) read as transformers reads it. The oracle runs are in
test_architectures.py ("nanochat": fp32 tokens and logprobs both paths, bf16 bit for bit, a LoRA adapter on q, k,
fc1 and fc2 as PEFT applies it)."""

from __future__ import annotations

import pytest
import torch

from services.engine.model_config import ModelConfig
from services.engine.nanochat import rope_rows

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

ARCH = "NanoChatForCausalLM"


def test_named_alone_it_takes_transformers_defaults():
    """nanochat-d12's shape: 12 layers of 6 heads of 128, ReLU² MLPs of 8192 without a gate, weightless norms
    (the embeddings' too), q/k normed after RoPE, logits capped at 15, untied embeddings."""
    config, hf = ModelConfig.from_dict({"architectures": [ARCH]}), transformers.NanoChatConfig()
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.max_position_embeddings,
            config.rms_norm_eps, config.final_softcap, config.tie_word_embeddings, config.hidden_act) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
        hf.num_key_value_heads, hf.hidden_size // hf.num_attention_heads, hf.max_position_embeddings, hf.rms_norm_eps,
        hf.final_logit_softcapping, hf.tie_word_embeddings, hf.hidden_act)
    assert not config.norm_affine and config.embed_norm and config.qk_l2_norm and not config.mlp_gated
    assert not config.fused_blocks  # the fused CPU forward computes weighted norms and SwiGLU only
    uncapped = ModelConfig.from_dict({"architectures": [ARCH], "final_logit_softcapping": None})
    assert uncapped.final_softcap is None


def test_q_and_k_rows_turn_with_its_rope():
    """The second half of each head's q and k rows negated, exactly; v and the rest as they are."""
    config = ModelConfig.from_dict({"architectures": [ARCH], "hidden_size": 8, "num_attention_heads": 2,
                                    "intermediate_size": 16, "num_hidden_layers": 1})
    q, v = torch.arange(32.0).reshape(8, 4), torch.ones(8, 4)
    out = dict(rope_rows(iter([("model.layers.0.self_attn.q_proj.weight", q),
                               ("model.layers.0.self_attn.v_proj.weight", v)]), config))
    heads = out["model.layers.0.self_attn.q_proj.weight"].reshape(2, 4, 4)
    assert torch.equal(heads[:, :2], q.reshape(2, 4, 4)[:, :2]) and torch.equal(heads[:, 2:], -q.reshape(2, 4, 4)[:, 2:])
    assert torch.equal(out["model.layers.0.self_attn.v_proj.weight"], v)
