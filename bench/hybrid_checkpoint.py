"""Writes a random-weight hybrid checkpoint (Qwen3.5's text model: Gated DeltaNet linear attention in three layers
of four, gated attention in the fourth) with the built-in model's tokenizer, for the benchmarks that take
``--model DIR``:

    .venv/bin/python bench/hybrid_checkpoint.py /tmp/qwen3.5-small
    .venv/bin/python bench/engine_throughput.py --model /tmp/qwen3.5-small

The shape is the small preset's scale (hidden 256, 8 layers, heads of 64), with 8 value heads of 32 on 4 key
heads in the linear layers; ``--moe`` gives Qwen3.5-MoE's experts (8, 2 a token) instead of the dense MLP.
Weights are drawn as transformers initializes them, then the norms near 1 (they store 1 + w), so outputs are
decisive rather than near-ties. ``--arch granite4-h`` writes Granite 4.0-H's shape instead (Mamba-2 in three
layers of four: 8 heads of 64 channels, a state of 128 per channel as the released models have; its dense MLP,
its multipliers). ``--arch falcon-h1`` writes Falcon-H1's (attention and Mamba-2 side by side in all 8 layers:
6 heads of 64 channels over a 384-wide mixer, a state of 128, Falcon-H1-0.5B's µP multipliers); ``--arch lfm3``
LFM3's (convolutions 7 wide in 5 layers of 8, sliding attention with a window of 256 in two, full attention in
one; heads gated, sandwich norms); ``--arch kimi-linear`` Kimi Linear's (Kimi Delta Attention in 6 layers of 8: 4 heads
of 64; latent attention without positions in two; 16 experts, 4 a token, beside a shared MLP from layer 1);
``--arch mamba`` the attention-free Mamba's (8 layers of a 512-wide mixer, a state of 16 per channel, as
state-spaces' checkpoints have), ``--arch mamba2`` Mamba-2's (8 layers of 8 heads of 64, a state of 128 in 8
groups, as Mamba-Codestral has) and ``--arch zamba2`` Zamba2's (Mamba-2 in all 8 layers, 8 heads of 64 with a
state of 64; two shared blocks taking turns over three of them, attention of 8 heads of 64 over 512 features with
RoPE, adapters of rank 64 on q, k, v and the MLP). ``--arch gemma4`` writes Gemma 4 E2B's layout at that scale (no
linear layers: sliding attention with a window of 256 in three layers of four, 4 heads of 64 on 1 KV head, the full
layers' heads 128 wide; the last 3 layers reading earlier layers' KV with MLPs twice as wide; per-layer inputs of 64).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.engine.builtin_model import ensure_default_model  # noqa: E402

SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
             linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="directory to write (must not exist)")
    p.add_argument("--moe", action="store_true", help="Qwen3.5-MoE's experts instead of the dense MLP")
    p.add_argument("--arch", choices=("qwen3.5", "granite4-h", "falcon-h1", "lfm3", "kimi-linear", "mamba", "mamba2",
                                      "zamba2", "gemma4"), default="qwen3.5")
    args = p.parse_args()
    import transformers

    if args.out.exists():
        p.error(f"{args.out} exists")
    if args.arch == "granite4-h":
        common = {k: v for k, v in SHAPE.items() if not k.startswith("linear_") and k != "intermediate_size"}
        config = transformers.GraniteMoeHybridConfig(
            layer_types=(["mamba"] * 3 + ["attention"]) * 2, num_local_experts=0, shared_intermediate_size=768,
            mamba_n_heads=8, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_chunk_size=256,
            embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0156, logits_scaling=4.0,
            position_embedding_type="rope", **common)
    elif args.arch == "falcon-h1":
        common = {k: v for k, v in SHAPE.items() if not k.startswith("linear_")}
        config = transformers.FalconH1Config(
            mamba_d_ssm=384, mamba_n_heads=6, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1,
            mamba_chunk_size=128, embedding_multiplier=5.656854249492381, lm_head_multiplier=0.0390625,
            key_multiplier=0.390625, attention_out_multiplier=0.9375, ssm_in_multiplier=1.25,
            ssm_out_multiplier=0.23570226039551587, mlp_multipliers=[0.8838834764831844, 0.5859375],
            ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738], **common)
    elif args.arch == "lfm3":
        common = {k: v for k, v in SHAPE.items() if not k.startswith("linear_")}
        config = transformers.Lfm3Config(
            layer_types=["conv", "conv", "full_attention", "conv", "sliding_attention", "conv", "sliding_attention",
                         "conv"], pad_token_id=0, **common)
    elif args.arch == "kimi-linear":
        common = {k: v for k, v in SHAPE.items()
                  if not k.startswith("linear_") and k not in ("num_key_value_heads", "head_dim")}
        config = transformers.KimiLinearConfig(
            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2, linear_num_heads=4, linear_head_dim=64,
            kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, num_experts=16,
            num_experts_per_token=4, moe_intermediate_size=128, num_shared_experts=1, pad_token_id=0, **common)
    elif args.arch in ("mamba", "mamba2"):
        common = {k: SHAPE[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "bos_token_id", "eos_token_id")}
        config = (transformers.MambaConfig(state_size=16, **common) if args.arch == "mamba" else
                  transformers.Mamba2Config(num_heads=8, head_dim=64, state_size=128, n_groups=8, chunk_size=256, **common))
    elif args.arch == "zamba2":
        common = {k: SHAPE[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                        "max_position_embeddings", "bos_token_id", "eos_token_id")}
        config = transformers.Zamba2Config(
            layers_block_type=["mamba", "mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba", "hybrid"],
            num_mem_blocks=2, use_shared_attention_adapter=True, adapter_rank=64, use_mem_rope=True,
            num_attention_heads=8, n_mamba_heads=8, mamba_d_state=64, chunk_size=256, **common)
    elif args.arch == "gemma4":
        common = {k: SHAPE[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                        "num_attention_heads", "head_dim", "max_position_embeddings", "bos_token_id",
                                        "eos_token_id")}
        config = transformers.Gemma4TextConfig(
            layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2, sliding_window=256, num_key_value_heads=1,
            global_head_dim=128, num_kv_shared_layers=3, use_double_wide_mlp=True, hidden_size_per_layer_input=64,
            vocab_size_per_layer_input=SHAPE["vocab_size"], final_logit_softcapping=30.0, **common)
    elif args.moe:
        config = transformers.Qwen3_5MoeTextConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                                                   shared_expert_intermediate_size=512,
                                                   **{k: v for k, v in SHAPE.items() if k != "intermediate_size"})
    else:
        config = transformers.Qwen3_5TextConfig(**SHAPE)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if args.arch == "qwen3.5" and name.endswith("norm.weight") and "linear_attn" not in name:
                param.normal_(0.0, 0.1)  # scales of 1 + w
    model.save_pretrained(args.out)
    tokenizer_dir = ensure_default_model()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, args.out / name)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
