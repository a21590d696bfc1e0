"""Shared fixtures: built-in-format checkpoints made once per test session (random weights, fixed seeds)."""

from __future__ import annotations

import pytest

from services.engine.builtin_model import PRESETS, init_model, with_sliding_window, without_attention_output

# The oracle's second model: different head counts, GQA ratio 3, llama3 RoPE scaling, untied embeddings,
# and weights split over shards with an index.
SECOND_MODEL_OVERRIDES = {
    "hidden_size": 96,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
    # The small preset's llama3 scaling with a short original context: more of the 8 frequency pairs fall
    # in the scaled and smoothed bands, so the test exercises all three branches of the scaling.
    "rope_scaling": {**PRESETS["small"]["rope_scaling"], "original_max_position_embeddings": 256},
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return init_model(tmp_path_factory.mktemp("models") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="session")
def second_model_dir(tmp_path_factory):
    return init_model(tmp_path_factory.mktemp("models") / "second", preset="tiny", seed=7,
                      overrides=SECOND_MODEL_OVERRIDES, num_shards=2)


@pytest.fixture(scope="session")
def looping_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model without attention output: its greedy output soon loops, which speculative decoding's
    n-gram drafts predict (``without_attention_output``)."""
    return without_attention_output(tiny_model_dir, tmp_path_factory.mktemp("models") / "looping")


# The sliding-window model's window: shorter than most test prompts, not a multiple of the block size.
WINDOW = 40


@pytest.fixture(scope="session")
def windowed_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model's weights as a Mistral checkpoint whose every layer attends within ``WINDOW`` keys."""
    return with_sliding_window(tiny_model_dir, tmp_path_factory.mktemp("models") / "windowed", WINDOW)


@pytest.fixture(scope="session")
def lora_dirs(tiny_model_dir, tmp_path_factory):
    """Adapters for the tiny model by name (tests/lora_adapters.py), written by peft."""
    pytest.importorskip("peft")
    from tests.lora_adapters import ADAPTERS, make_adapter

    root = tmp_path_factory.mktemp("loras")
    return {name: make_adapter(tiny_model_dir, root / name, seed, **cfg)
            for seed, (name, cfg) in enumerate(ADAPTERS.items())}


@pytest.fixture(scope="session")
def hybrid_model_dir(tiny_model_dir, tmp_path_factory):
    """A Qwen3-Next checkpoint saved by transformers (tests/engine/test_architectures.py's case): Gated DeltaNet
    linear attention in two layers of three, whose recurrent state per sequence lives beside the paged KV."""
    pytest.importorskip("transformers")
    from tests.engine.test_architectures import CASES, save_checkpoint

    out = tmp_path_factory.mktemp("models") / "qwen3-next"
    save_checkpoint(CASES["qwen3-next"](), out, tiny_model_dir)
    return out
