"""Models whose layers' KV differ in shape through the live disaggregated mesh: Gemma 4 (E2B's layout: a
full-attention layer fills two of the pool's slots, a sliding one one, and its last layers keep no KV, reading
earlier layers' blocks) and MiMo-V2-Flash (its sliding layers twice the KV heads, values cached padded to the keys'
width). Blocks still move whole: the prefill worker sends them to the decode worker over NIXL, and the kvcache
service stores and loads them for a session's next turn, with no code of its own. Greedy output equals
transformers' for every request."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import assert_blocks_move_through_kvcache, random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 16
PROMPTS = random_prompts([3, 17, 40, 90], seed=44)


@pytest.fixture(scope="module", params=["gemma4-e2b", "mimo-v2-flash"])
def checkpoint(request, tiny_model_dir, tmp_path_factory):
    from tests.engine.test_architectures import CASES, save_checkpoint

    out = tmp_path_factory.mktemp(request.param)
    return out, save_checkpoint(CASES[request.param](), out, tiny_model_dir)


@pytest.fixture(scope="module")
def mesh(checkpoint, tmp_path_factory):
    m = start_mesh(checkpoint[0], tmp_path_factory.mktemp("logs"), http=False,
                   scheduler_args=["--chunk-size", "16", "--kv-transport", "nixl"], kvcache_args=[])
    yield m
    assert all(code == 0 for code in m.stop().values())


async def test_blocks_move_between_workers_and_through_kvcache(mesh, checkpoint):
    await assert_blocks_move_through_kvcache(mesh, checkpoint[1], PROMPTS, MAX_TOKENS, "s-shapes")
