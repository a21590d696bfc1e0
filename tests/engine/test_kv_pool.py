"""The paged KV pool: layout, swap/copy by block id, and regions a real NIXL agent registers and moves."""

from __future__ import annotations

import time

import pytest
import torch

from services.common.errors import InvalidArgument
from services.engine.kv_pool import KVLayout, PagedKVPool

LAYOUT = KVLayout(num_layers=3, block_size=16, num_kv_heads=2, head_dim=8, dtype=torch.float32)


def _pool(num_blocks=8, host=4, seed=0) -> PagedKVPool:
    pool = PagedKVPool(LAYOUT, num_blocks, host, torch.device("cpu"))
    pool.device_kv.copy_(torch.randn(pool.device_kv.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_pool_swaps_and_copies_its_bytes_exactly(dtype):
    """Every byte value (NaN patterns too) survives a swap out, a swap in and a copy: the pool moves bytes."""
    layout = KVLayout(num_layers=3, block_size=16, num_kv_heads=2, head_dim=8, dtype=dtype)
    pool = PagedKVPool(layout, 8, 4, torch.device("cpu"))
    assert layout.bytes_per_block * 4 == LAYOUT.bytes_per_block
    raw = torch.randint(0, 256, pool.device_kv.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    pool.device_kv.view(torch.uint8).copy_(raw)
    pool.swap_out([(2, 0), (5, 3)])
    pool.device_kv.view(torch.uint8)[[2, 5]] = 0
    pool.swap_in([(0, 6), (3, 7)])
    pool.copy([(6, 1)])
    got = pool.device_kv.view(torch.uint8)
    assert torch.equal(got[[6, 7]], raw[[2, 5]]) and torch.equal(got[1], raw[2])

def test_a_block_is_one_contiguous_region_of_every_layer():
    pool = _pool()
    addr, nbytes = pool.block_region(3)
    assert nbytes == LAYOUT.bytes_per_block == 3 * 2 * 16 * 2 * 8 * 4
    assert addr == pool.device_kv.data_ptr() + 3 * nbytes
    k, v = pool.layer(1)
    assert k.shape == (8, 16, 2, 8) and k[3].data_ptr() > addr and v[3].data_ptr() < addr + nbytes


def test_layers_of_other_widths_fill_runs_of_slots():
    """Gemma 4's full-attention layers are wider than its sliding ones: the pool's slots are the narrowest layer's
    (1 x 8 keys and values), a 2 x 8 layer takes two of them, its K the first half of that run and its V the second;
    each view is contiguous in each block, as attention's kernels read it, and writing one touches nothing else. A
    block is still one region, and to kvcache or a peer the pool is one of 3 equal layers."""
    layout = KVLayout(num_layers=3, block_size=16, num_kv_heads=1, head_dim=8, dtype=torch.float32,
                      layer_shapes=((1, 8), (2, 8)))
    assert layout == KVLayout(3, 16, 1, 8, torch.float32) and layout.bytes_per_block == (8 + 16) * 2 * 16 * 4
    pool = PagedKVPool(layout, 4, 2, torch.device("cpu"))
    (k0, v0), (k1, v1) = pool.layer(0), pool.layer(1)
    assert k0.shape == v0.shape == (4, 16, 1, 8) and k1.shape == v1.shape == (4, 16, 2, 8)
    assert all(view[0].is_contiguous() and view.stride(0) == pool.device_kv.stride(0) for view in (k0, v0, k1, v1))
    flat = pool.device_kv.view(4, -1)  # per block: layer 0's K, its V, then layer 1's K and V
    for i, view in enumerate((k0, v0, k1, v1)):
        view.fill_(i + 1.0)
    assert [torch.unique(part).tolist() for part in flat.split([128, 128, 256, 256], dim=1)] == [[1.0], [2.0], [3.0],
                                                                                                [4.0]]
    with pytest.raises(ValueError, match="must fill 3 slots of 1 x 8"):
        KVLayout(3, 16, 1, 8, torch.float32, layer_shapes=((1, 8), (1, 8)))


def test_swap_out_in_and_copy_move_whole_blocks():
    pool = _pool()
    before = pool.device_kv[[2, 5]].clone()
    pool.swap_out([(2, 0), (5, 3)])
    pool.device_kv[[2, 5]] = 0
    pool.swap_in([(0, 6), (3, 7)])
    assert torch.equal(pool.device_kv[[6, 7]], before)
    pool.copy([(6, 1)])
    assert torch.equal(pool.device_kv[1], before[0])


def test_a_budget_too_small_for_one_block_is_a_clear_error():
    assert LAYOUT.blocks_for_budget(LAYOUT.bytes_per_block * 5 + 1) == 5
    with pytest.raises(InvalidArgument, match="holds no block"):
        PagedKVPool(LAYOUT, 0, 0, torch.device("cpu"))


def test_nixl_agents_register_the_pools_and_write_blocks_by_id():
    nixl = pytest.importorskip("nixl_cu12._api")
    src, dst = _pool(seed=1), _pool(seed=2)
    agents = {}
    for name, pool in (("src", src), ("dst", dst)):
        agent = nixl.nixl_agent(name, nixl.nixl_agent_config(backends=["UCX"]))
        regions = [(r.addr, r.nbytes, r.device_id, "") for r in pool.memory_regions()]
        agent.register_memory(regions, "DRAM")
        agents[name] = agent
    agents["src"].add_remote_agent(agents["dst"].get_agent_metadata())
    pairs = [(1, 5), (3, 6), (4, 0)]  # (src block, dst block): one descriptor per block, all layers at once
    local = agents["src"].get_xfer_descs([(*src.block_region(s), 0) for s, _ in pairs], "DRAM")
    remote = agents["src"].get_xfer_descs([(*dst.block_region(d), 0) for _, d in pairs], "DRAM")
    handle = agents["src"].initialize_xfer("WRITE", local, remote, "dst", b"kv")
    state = agents["src"].transfer(handle)
    deadline = time.monotonic() + 10
    while state not in ("DONE", "ERR") and time.monotonic() < deadline:
        state = agents["src"].check_xfer_state(handle)
    assert state == "DONE"
    agents["src"].release_xfer_handle(handle)
    for s, d in pairs:
        assert torch.equal(dst.device_kv[d], src.device_kv[s])
    assert not torch.equal(dst.device_kv[1], src.device_kv[1])  # untouched blocks stay as they were


def test_a_latent_pool_holds_one_tensor_per_layer_handed_out_as_k_and_v():
    """DeepSeek-V3's latent attention caches one latent per token: half the bytes of a K and V pool."""
    latent = KVLayout(num_layers=3, block_size=16, num_kv_heads=1, head_dim=8, dtype=torch.float32, num_parts=1)
    assert latent.bytes_per_block == 3 * 16 * 8 * 4
    pool = PagedKVPool(latent, 4, 2, torch.device("cpu"))
    k, v = pool.layer(2)
    assert k.data_ptr() == v.data_ptr() and k.shape == (4, 16, 1, 8)
    assert pool.block_region(1)[1] == latent.bytes_per_block
