"""The raw-bytes ReadKV/WriteKV handlers (``add_worker_servicer``): the bytes on the wire are exactly the
KVChunk contract, so generated stubs and the raw client both work against them, and errors keep their status."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
import torch

from seawall.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpc_kv import (
    _READ_KV,
    _WRITE_KV,
    GRPC_KV_OPTIONS,
    KVBytesServicer,
    add_worker_servicer,
    pull_blocks,
    push_blocks,
)
from tests.common.kv_helpers import SMALL_LAYOUT as LAYOUT
from tests.common.kv_helpers import kv_bytes_server, random_pool

BPB = LAYOUT.bytes_per_block


def _rows(pool, ids) -> bytes:
    return pool.device_kv[ids].numpy().tobytes()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_bytes_survive_a_push_and_a_pull_through_the_raw_server():
    server_pool, src, back = random_pool(LAYOUT, 32, 2), random_pool(LAYOUT, 32, 1), random_pool(LAYOUT, 32, 3)
    src_ids, server_ids, back_ids = [3, 4, 5, 0, 31, 17, 9], [10, 11, 12, 30, 1, 2, 20], [0, 1, 2, 3, 4, 5, 6]
    async with kv_bytes_server(server_pool) as address:
        out = await push_blocks(address, src, src_ids, server_ids, "rt-push", timeout_s=10, max_chunk_bytes=3 * BPB)
        assert out.ok, out
        out = await pull_blocks(address, back, server_ids, back_ids, "rt-pull", timeout_s=10, max_chunk_bytes=2 * BPB)
        assert out.ok, out
    assert _rows(server_pool, server_ids) == _rows(src, src_ids)
    assert _rows(back, back_ids) == _rows(src, src_ids)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_generated_stub_reads_and_writes_the_raw_server():
    pool, other = random_pool(LAYOUT, 32, 2), random_pool(LAYOUT, 32, 5)
    async with kv_bytes_server(pool) as address, grpc.aio.insecure_channel(address, options=GRPC_KV_OPTIONS) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        ids = [7, 8, 9, 1, 2]
        chunks = [c async for c in stub.ReadKV(worker_pb2.ReadKVRequest(block_ids=ids, max_chunk_bytes=2 * BPB))]
        assert [list(c.block_ids) for c in chunks] == [[7, 8], [9, 1], [2]]
        assert b"".join(c.data for c in chunks) == _rows(pool, ids)
        assert all(c.transfer_id == "" for c in chunks)

        async def requests():
            yield worker_pb2.KVChunk(block_ids=[20, 21], data=_rows(other, [0, 1]), transfer_id="gen")
            yield worker_pb2.KVChunk(block_ids=[5], data=_rows(other, [2]))

        reply = await stub.WriteKV(requests(), timeout=10)
        assert reply == worker_pb2.WriteKVResponse(bytes=3 * BPB, num_blocks=3)
        assert _rows(pool, [20, 21, 5]) == _rows(other, [0, 1, 2])

        # A chunk the raw server sends is byte for byte what the generated code serializes.
        read_raw = ch.unary_stream(_READ_KV, request_serializer=worker_pb2.ReadKVRequest.SerializeToString,
                                   response_deserializer=None)
        wire = [m async for m in read_raw(worker_pb2.ReadKVRequest(block_ids=[4, 3], max_chunk_bytes=BPB))]
        assert wire == [worker_pb2.KVChunk(block_ids=[4], data=_rows(pool, [4])).SerializeToString(),
                        worker_pb2.KVChunk(block_ids=[3], data=_rows(pool, [3])).SerializeToString()]


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_bad_ids_and_malformed_chunks_are_invalid_argument_with_the_reason():
    pool = random_pool(LAYOUT, 32, 2)
    before = pool.device_kv.clone()
    async with kv_bytes_server(pool) as address, grpc.aio.insecure_channel(address, options=GRPC_KV_OPTIONS) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.ReadKV(worker_pb2.ReadKVRequest(block_ids=[0, 99, 32]), timeout=10):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "block ids [99, 32] are outside the pool of 32 blocks"

        async def out_of_range():
            yield worker_pb2.KVChunk(block_ids=[40], data=b"\0" * BPB)

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.WriteKV(out_of_range(), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "destination block ids [40] are outside the pool of 32 blocks"

        write_raw = ch.stream_unary(_WRITE_KV, request_serializer=None,
                                    response_deserializer=worker_pb2.WriteKVResponse.FromString)

        async def truncated():
            yield worker_pb2.KVChunk(block_ids=[1], data=b"\1" * BPB).SerializeToString()[:-10]

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await write_raw(truncated(), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed KVChunk" in err.value.details()
    assert torch.equal(pool.device_kv, before)  # none of the refused chunks wrote a byte


class _Described(KVBytesServicer):
    async def Describe(self, request, context):
        return worker_pb2.WorkerInfo(model="m", num_device_blocks=self.pool.num_blocks)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_the_other_worker_methods_keep_their_generated_handlers():
    server = grpc.aio.server(options=GRPC_KV_OPTIONS)
    add_worker_servicer(_Described(random_pool(LAYOUT, 8)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            assert await stub.Describe(worker_pb2.DescribeRequest(), timeout=10) == worker_pb2.WorkerInfo(
                model="m", num_device_blocks=8)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Free(worker_pb2.FreeRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(grace=None)
