"""Moving a sequence's recurrent state (linear-attention layers; services/engine/recurrent_state.py) from the
worker it is handed off from to the one that pulls its KV blocks (or a saved state checkpoint, with a prefix
read from the holder's prefix cache).

The state is small next to a long prompt's KV (one fixed size per sequence) and is read once per hand-off, so it
travels over gRPC whatever plane carried the blocks: ``ReadState`` streams it a layer per message (a layer of
Qwen3-Next-80B is ~2 MiB, the whole state ~75 MiB, past one message's limit)."""

from __future__ import annotations

import grpc

from seawall.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpc_server import CHANNEL_OPTIONS


def state_messages(num_computed: int, layers: list[tuple[bytes, bytes]]) -> list[worker_pb2.RecurrentStateLayer]:
    return [worker_pb2.RecurrentStateLayer(index=i, num_computed_tokens=num_computed, conv=conv, ssm=ssm)
            for i, (conv, ssm) in enumerate(layers)]


async def pull_state(address: str, seq_id: str, timeout_s: float,
                     checkpoint: int | None = None) -> tuple[int, list[tuple[bytes, bytes]], int]:
    """(tokens the state took in, each layer's bytes, bytes moved) of ``seq_id`` on the worker at ``address``,
    or of its state checkpoint ``checkpoint`` (whose tokens come back as 0: the worker does not know them).
    Raises ``grpc.aio.AioRpcError`` when it cannot be read, ``ValueError`` on layers out of order."""
    request = worker_pb2.ReadStateRequest(seq_id=seq_id, checkpoint=checkpoint)
    what = seq_id if checkpoint is None else f"checkpoint {checkpoint}"
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        layers, num_computed, nbytes = [], 0, 0
        async for msg in stub.ReadState(request, timeout=max(timeout_s, 0.001)):
            if msg.index != len(layers):
                raise ValueError(f"recurrent state of {what}: layer {msg.index} came where {len(layers)} was due")
            layers.append((msg.conv, msg.ssm))
            num_computed = msg.num_computed_tokens
            nbytes += len(msg.conv) + len(msg.ssm)
    return num_computed, layers, nbytes
