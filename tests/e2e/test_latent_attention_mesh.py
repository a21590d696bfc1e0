"""DeepSeek-V3's latent attention (services/engine/mla.py) through the live disaggregated mesh: the cache holds
one latent per token (one KV "head" of kv_lora_rank + qk_rope_head_dim), which the prefill worker sends to the
decode worker over NIXL and the kvcache service stores and loads for a session's next turn, with no code of
its own. Greedy output equals transformers' (which expands the latents per head) for every request, and with a
LoRA adapter of every projection, the routed experts' too, transformers + peft's."""

from __future__ import annotations

import anyio
import pytest

from seawall import AsyncClient
from tests.e2e.conftest import assert_blocks_move_through_kvcache, random_prompts, start_mesh
from tests.lora_adapters import make_adapter, peft_greedy

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 16
PROMPTS = random_prompts([3, 17, 40, 90], seed=43)


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    from tests.engine.test_architectures import CASES, save_checkpoint

    out = tmp_path_factory.mktemp("deepseek-v3")
    return out, save_checkpoint(CASES["deepseek-v3"](), out, tiny_model_dir)


@pytest.fixture(scope="module")
def adapter(checkpoint, tmp_path_factory):
    """Of latent attention's projections, the dense and shared MLPs' and the routed experts'."""
    pytest.importorskip("peft")
    return make_adapter(checkpoint[0], tmp_path_factory.mktemp("adapter"), seed=5, r=4, lora_alpha=16,
                        target_modules=["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                                        "gate_proj", "up_proj", "down_proj"],
                        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])


@pytest.fixture(scope="module")
def mesh(checkpoint, adapter, tmp_path_factory):
    m = start_mesh(checkpoint[0], tmp_path_factory.mktemp("logs"),
                   scheduler_args=["--chunk-size", "16", "--lora-modules", f"ds={adapter}"], kvcache_args=[])
    yield m
    assert all(code == 0 for code in m.stop().values())


async def test_latents_move_between_workers_and_through_kvcache(mesh, checkpoint):
    await assert_blocks_move_through_kvcache(mesh, checkpoint[1], PROMPTS, MAX_TOKENS, "s-mla")


async def test_an_adapter_of_every_projection_and_expert_equals_peft_beside_the_base_model(mesh, checkpoint, adapter):
    models = ["ds", "", "ds", ""]
    outs = [None] * len(PROMPTS)
    async with AsyncClient(mesh.grpc_address) as client:
        async def one(i: int) -> None:
            outs[i] = await client.generate(PROMPTS[i], model=models[i], max_tokens=MAX_TOKENS, temperature=0)

        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
    for prompt, model, out in zip(PROMPTS, models, outs, strict=True):
        want = peft_greedy(checkpoint[0], adapter if model else None, [prompt], MAX_TOKENS)[0]
        assert out.token_ids == want, f"the {len(prompt)}-token prompt ({model or 'base'}) diverged"
    assert outs[0].token_ids != peft_greedy(checkpoint[0], None, PROMPTS[:1], MAX_TOKENS)[0]  # the adapter matters
