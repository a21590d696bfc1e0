"""gRPC KV fallback: a real grpc.aio server on 127.0.0.1 serves ReadKV/WriteKV over a real pool."""

from __future__ import annotations

import socket
import time

import anyio
import grpc
import grpc.aio
import numpy as np
import pytest
import torch

from seawall.v1 import worker_pb2, worker_pb2_grpc
from services.common.errors import InvalidArgument
from services.common.grpc_kv import (
    _READ_KV,
    _WRITE_KV,
    GRPC_KV_OPTIONS,
    _decode_chunk,
    _encode_chunk,
    iter_chunks,
    pull_blocks,
    push_blocks,
    write_chunk,
)
from services.common.kv_transport import TransferState
from services.engine.kv_pool import KVLayout, PagedKVPool
from tests.common.kv_helpers import SMALL_LAYOUT as LAYOUT
from tests.common.kv_helpers import kv_bytes_server, random_pool

BPB = LAYOUT.bytes_per_block


def _pool(num_blocks=32, seed=0, layout=LAYOUT) -> PagedKVPool:
    return random_pool(layout, num_blocks, seed)


@pytest.fixture
async def server():
    """(address, the server's pool)."""
    pool = _pool(seed=2)
    async with kv_bytes_server(pool) as address:
        yield address, pool


def test_chunks_hold_whole_blocks_in_id_order():
    pool = _pool()
    ids = [5, 6, 7, 1, 30, 2, 3]
    chunks = list(iter_chunks(pool, ids, max_chunk_bytes=3 * BPB + 100, transfer_id="t"))
    assert [list(c.block_ids) for c in chunks] == [[5, 6, 7], [1, 30, 2], [3]]
    assert [c.transfer_id for c in chunks] == ["t", "", ""]
    assert b"".join(c.data for c in chunks) == pool.device_kv[ids].numpy().tobytes()
    assert [len(c.block_ids) for c in iter_chunks(pool, [1, 2], max_chunk_bytes=1)] == [1, 1]  # ≥ 1 block

    other = _pool(seed=9)
    for chunk in chunks:
        assert write_chunk(other, chunk) == len(chunk.block_ids) * BPB
    assert torch.equal(other.device_kv[ids], pool.device_kv[ids])


def test_the_client_wire_encoding_is_the_kvchunk_message():
    data = bytes(range(256)) * 3
    ids = [0, 1, 127, 128, 300, 70000, 2**32 - 1]  # one- to five-byte varints
    wire = _encode_chunk(ids, [data[:100], memoryview(data)[100:]], len(data), "t-1")
    assert worker_pb2.KVChunk.FromString(wire) == worker_pb2.KVChunk(block_ids=ids, data=data, transfer_id="t-1")
    message = worker_pb2.KVChunk(block_ids=ids, data=data, transfer_id="t-2").SerializeToString()
    got_ids, got_data = _decode_chunk(message + b"\x20\x05")  # plus an unknown varint field 4
    assert got_ids == ids and bytes(got_data) == data
    assert _decode_chunk(worker_pb2.KVChunk().SerializeToString()) == ([], b"")
    with pytest.raises(InvalidArgument, match="malformed"):
        _decode_chunk(message[:-10])
    service = worker_pb2.DESCRIPTOR.services_by_name["Worker"]
    assert _WRITE_KV == "/" + service.methods_by_name["WriteKV"].full_name.replace(".WriteKV", "/WriteKV")
    assert _READ_KV == "/" + service.methods_by_name["ReadKV"].full_name.replace(".ReadKV", "/ReadKV")


def test_bad_chunks_and_ids_raise_invalid_argument():
    pool = _pool()
    with pytest.raises(InvalidArgument, match=r"4095 bytes for 1 block\(s\); this pool needs 4096"):
        write_chunk(pool, worker_pb2.KVChunk(block_ids=[1], data=b"\0" * (BPB - 1)))
    with pytest.raises(InvalidArgument, match=r"destination block ids \[32\]"):
        write_chunk(pool, worker_pb2.KVChunk(block_ids=[32], data=b"\0" * BPB))
    with pytest.raises(InvalidArgument, match=r"block ids \[-1\]"):
        list(iter_chunks(pool, [0, -1]))


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_push_and_pull_move_blocks_by_id(server):
    address, remote = server
    local = _pool(seed=1)
    before = remote.device_kv.clone()
    src, dst = [0, 1, 2, 9, 4], [20, 21, 22, 3, 31]
    out = await push_blocks(address, local, src, dst, transfer_id="p1", timeout_s=10, max_chunk_bytes=2 * BPB)
    assert out.status is TransferState.DONE and out.ok and out.bytes == 5 * BPB and out.transfer_id == "p1"
    assert torch.equal(remote.device_kv[dst], local.device_kv[src])
    untouched = [i for i in range(32) if i not in dst]
    assert torch.equal(remote.device_kv[untouched], before[untouched])

    async with grpc.aio.insecure_channel(address, options=GRPC_KV_OPTIONS) as channel:  # a caller's channel
        out = await pull_blocks(channel, local, [5, 6, 17], [10, 11, 12], transfer_id="p2", timeout_s=10,
                                max_chunk_bytes=BPB)
        assert out.ok and out.bytes == 3 * BPB
        assert torch.equal(local.device_kv[[10, 11, 12]], remote.device_kv[[5, 6, 17]])
        empty = await pull_blocks(channel, local, [], [], transfer_id="p3", timeout_s=10)
        assert empty.ok and empty.bytes == 0


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_wrong_size_chunk_is_invalid_argument(server):
    address, _ = server
    async with grpc.aio.insecure_channel(address, options=GRPC_KV_OPTIONS) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)

        async def chunks():
            yield worker_pb2.KVChunk(block_ids=[1, 2], data=b"\0" * BPB, transfer_id="bad")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.WriteKV(chunks(), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "4096 bytes for 2 block(s)" in err.value.details()

        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.ReadKV(worker_pb2.ReadKVRequest(block_ids=[0, 99]), timeout=10):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "[99]" in err.value.details()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_peer_refusing_the_blocks_is_a_failed_outcome(server):
    address, _ = server
    bigger = _pool(layout=KVLayout(2, 32, 2, 16, torch.float16))  # 8 KiB blocks against the server's 4 KiB
    out = await push_blocks(address, bigger, [1], [1], transfer_id="x", timeout_s=10)
    assert out.status is TransferState.FAILED and out.bytes == 0
    assert out.error.startswith("INVALID_ARGUMENT") and "same KV layout" in out.error
    with pytest.raises(InvalidArgument, match=r"destination block ids \[40\]"):  # local mistakes raise
        await pull_blocks(address, _pool(), [1], [40], transfer_id="y", timeout_s=10)
    with pytest.raises(InvalidArgument, match="2 source block ids but 1 destination"):
        await push_blocks(address, _pool(), [1, 2], [3], transfer_id="z", timeout_s=10)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_an_unreachable_peer_is_a_failed_outcome_within_the_timeout():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    out = await push_blocks(f"127.0.0.1:{port}", _pool(), [1], [1], transfer_id="u", timeout_s=3)
    assert out.status is TransferState.FAILED and "UNAVAILABLE" in out.error, out
    assert time.monotonic() - start < 3.5
    out = await pull_blocks(f"127.0.0.1:{port}", _pool(), [1], [1], transfer_id="v", timeout_s=3)
    assert out.status is TransferState.FAILED and time.monotonic() - start < 7


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_deadline_shorter_than_the_transfer_is_timed_out(server):
    address, _ = server
    start = time.monotonic()
    out = await push_blocks(address, _pool(), np.arange(32), np.arange(32), transfer_id="d", timeout_s=0)
    assert out.status is TransferState.TIMED_OUT and out.bytes == 0 and time.monotonic() - start < 1


class _HungPeer(worker_pb2_grpc.WorkerServicer):
    """Takes pushed chunks and pull requests and never answers either."""

    async def WriteKV(self, request_iterator, context):
        async for _ in request_iterator:
            pass
        await anyio.sleep_forever()

    async def ReadKV(self, request, context):
        await anyio.sleep_forever()
        yield worker_pb2.KVChunk()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_transfers_whose_channel_is_closed_under_them_are_aborted_and_their_task_group_goes_on():
    # gRPC ends a call on a closed channel by raising a blank CancelledError in the awaiting task, which in a
    # task group cancels the whole group (services/common/rpc.py): the scheduler closes a dropped worker's
    # channel while calls to it are pending.
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(_HungPeer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_KV_OPTIONS)
    outcomes = {}
    try:
        async with anyio.create_task_group() as tg:
            async def transfer(move) -> None:
                outcomes[move.__name__] = await move(channel, _pool(), [1, 2], [3, 4], transfer_id=move.__name__,
                                                     timeout_s=20)

            tg.start_soon(transfer, push_blocks)
            tg.start_soon(transfer, pull_blocks)
            await anyio.sleep(0.5)
            await channel.close()
        assert {name: o.status for name, o in outcomes.items()} == {"push_blocks": TransferState.ABORTED,
                                                                    "pull_blocks": TransferState.ABORTED}
        assert all("its channel was closed" in o.error for o in outcomes.values())
    finally:
        await server.stop(None)
