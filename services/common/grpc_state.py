"""Moving a sequence's recurrent state (linear-attention layers; services/engine/recurrent_state.py) between
processes: out of a worker with ``Worker.ReadState`` (a sequence's state, handed off with its KV blocks, or a
saved state checkpoint, read with a prefix from the holder's prefix cache or stored by kvcache), into one with
``Worker.WriteState`` (kvcache loading a state it stored with a prefix's blocks).

The state is small next to a long prompt's KV (one fixed size per sequence) and moves once per hand-off or load,
so it travels over gRPC whatever plane carried the blocks, a layer per message (a layer of Qwen3-Next-80B is
~2 MiB, the whole state ~75 MiB, past one message's limit)."""

from __future__ import annotations

import grpc

from seawall.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpc_server import CHANNEL_OPTIONS

# Each layer's bytes as (conv, ssm), in layer order.
Layers = list[tuple[bytes, bytes]]


def state_messages(num_computed: int, layers: Layers) -> list[worker_pb2.RecurrentStateLayer]:
    return [worker_pb2.RecurrentStateLayer(index=i, num_computed_tokens=num_computed, conv=conv, ssm=ssm)
            for i, (conv, ssm) in enumerate(layers)]


def state_nbytes(layers: Layers) -> int:
    return sum(len(conv) + len(ssm) for conv, ssm in layers)


async def pull_state(address: str, seq_id: str, timeout_s: float,
                     checkpoint: int | None = None) -> tuple[int, Layers, int]:
    """(tokens the state took in, each layer's bytes, bytes moved) of ``seq_id`` on the worker at ``address``,
    or of its state checkpoint ``checkpoint`` (whose tokens come back as 0: the worker does not know them).
    Raises ``grpc.aio.AioRpcError`` when it cannot be read, ``ValueError`` on layers out of order."""
    request = worker_pb2.ReadStateRequest(seq_id=seq_id, checkpoint=checkpoint)
    what = seq_id if checkpoint is None else f"checkpoint {checkpoint}"
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        layers, num_computed = [], 0
        async for msg in stub.ReadState(request, timeout=max(timeout_s, 0.001)):
            if msg.index != len(layers):
                raise ValueError(f"recurrent state of {what}: layer {msg.index} came where {len(layers)} was due")
            layers.append((msg.conv, msg.ssm))
            num_computed = msg.num_computed_tokens
    return num_computed, layers, state_nbytes(layers)


async def push_state(address: str, seq_id: str, num_computed: int, layers: Layers, timeout_s: float) -> int:
    """Writes ``layers``, a state of ``num_computed`` tokens, to the worker at ``address`` for its sequence
    ``seq_id`` still to arrive; the bytes it kept. Raises ``grpc.aio.AioRpcError`` when it refuses or fails."""
    messages = [worker_pb2.StateWrite(seq_id=seq_id, layer=layer) for layer in state_messages(num_computed, layers)]
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        reply = await stub.WriteState(iter(messages), timeout=max(timeout_s, 0.001))
    return reply.bytes


async def collect_state(messages) -> tuple[str, int, Layers]:
    """A WriteState stream's (sequence, tokens, layers); ``ValueError`` saying what is wrong with it."""
    seq_id, num_computed, layers = "", None, []
    async for msg in messages:
        seq_id = seq_id or msg.seq_id
        if msg.seq_id and msg.seq_id != seq_id:
            raise ValueError(f"a WriteState stream names one sequence; it named {seq_id!r} and then {msg.seq_id!r}")
        if msg.layer.index != len(layers):
            raise ValueError(f"layer {msg.layer.index} came where {len(layers)} was due; send layers in order")
        if num_computed is not None and msg.layer.num_computed_tokens != num_computed:
            raise ValueError(f"layer {msg.layer.index} took in {msg.layer.num_computed_tokens} tokens, the layers "
                             f"before it {num_computed}; one state has one token count")
        num_computed = msg.layer.num_computed_tokens
        layers.append((msg.layer.conv, msg.layer.ssm))
    if not seq_id or not layers:
        raise ValueError("a WriteState stream needs a seq_id on its first message and at least one layer")
    return seq_id, num_computed, layers
