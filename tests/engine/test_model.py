"""``LlamaForCausalLM``: its fused-kernel forward gives the logits of its torch-op forward."""

from __future__ import annotations

import pytest
import torch

from services.common.sampling_params import SamplingParams
from services.engine import cpu_kernels
from services.engine.inputs import SequenceState, prepare_inputs
from services.engine.kv_pool import KVLayout, PagedKVPool
from services.engine.model import LlamaForCausalLM
from services.engine.model_config import ModelConfig

CPU = torch.device("cpu")
BLOCK = 4


@pytest.fixture(scope="module")
def kernels():
    k = cpu_kernels.load()
    if k is None:
        pytest.skip("no C compiler here: the fused kernels cannot be built")
    return k


def _model(bias: bool, tied: bool) -> LlamaForCausalLM:
    config = ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         rms_norm_eps=1e-5, tie_word_embeddings=tied, attention_bias=bias,
                         rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def _seq(name: str, known: int, computed: int, first_block: int) -> SequenceState:
    blocks = list(range(first_block, first_block + -(-known // BLOCK)))
    ids = [(7 * i + len(name)) % 97 for i in range(known)]
    return SequenceState(name, ids, known, computed, blocks, SamplingParams())


def _run(model, pool, steps, kernels):
    """Runs the steps in order (each a list of (sequence, tokens)) and returns every step's logits."""
    out = []
    for step in steps:
        inputs = prepare_inputs(step, BLOCK, CPU, kernels)
        with torch.inference_mode():
            out.append(model(inputs.input_ids, inputs.positions, inputs.attention, pool, inputs.logits_index))
        for seq, n in step:
            seq.num_computed += n
    return out


@pytest.mark.parametrize(("bias", "tied"), [(False, True), (True, False)])
def test_fused_forward_gives_the_torch_path_logits(kernels, bias, tied):
    model = _model(bias, tied)
    layout = KVLayout(3, BLOCK, 2, 16, torch.float32)
    results = []
    for k in (None, kernels):
        pool = PagedKVPool(layout, 64, 0, CPU)
        a, b, c = _seq("a", 23, 0, 0), _seq("bb", 9, 0, 10), _seq("ccc", 30, 0, 20)
        # Fresh prompts, then a decode beside a chunk after a cached prefix, then decodes only.
        steps = [[(a, 22), (b, 8)], [(a, 1), (c, 17), (b, 1)], [(c, 13)]]
        results.append(_run(model, pool, steps, k))
    for torch_logits, fused_logits in zip(*results, strict=True):
        torch.testing.assert_close(fused_logits, torch_logits, atol=1e-4, rtol=1e-4)
