"""The SDK: Python-friendly shapes for sampling options, validated before sending; its calls' errors as
Seawall's exceptions, and its calls inside anyio timeouts."""

from __future__ import annotations

import socket

import anyio
import grpc
import pytest

from seawall import AsyncClient, Client
from seawall.client import build_batch, build_embed, build_request
from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.errors import InvalidArgument, SeawallError, Unavailable


def test_stop_takes_a_string_or_a_list_as_the_openai_api_does():
    one = build_request([1, 2], "r", {"stop": "END", "stop_token_ids": [7, 8]})
    many = build_request([1, 2], "r", {"stop": ["END", "\n\n"]})
    assert list(one.sampling.stop) == ["END"] and list(one.sampling.stop_token_ids) == [7, 8]
    assert list(many.sampling.stop) == ["END", "\n\n"]


def test_sampling_left_out_is_left_unset_for_the_models_generation_config():
    unset = build_request([1, 2], "r", {"max_tokens": 4}).sampling
    assert not any(unset.HasField(f) for f in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty"))
    given = build_request([1, 2], "r", {"temperature": 0, "top_k": 0, "top_p": 1.0}).sampling
    assert all(given.HasField(f) for f in ("temperature", "top_k", "top_p"))  # "off", said so: kept
    assert not given.HasField("min_p")


def test_bad_sampling_is_refused_before_anything_is_sent():
    with pytest.raises(InvalidArgument, match="stop must contain only non-empty strings"):
        build_request([1, 2], "r", {"stop": [""]})


def test_a_batch_takes_a_list_of_prompts_each_sent_final_only_with_the_same_sampling():
    msg = build_batch(["hello", [1, 2, 3]], {"max_tokens": 4, "session_id": "s"})
    assert [r.WhichOneof("prompt") for r in msg.requests] == ["text", "token_ids"]
    assert all(r.final_only and r.sampling.max_tokens == 4 and r.session_id == "s" for r in msg.requests)
    for bad in ("one string", []):
        with pytest.raises(ValueError, match="non-empty list of prompts"):
            build_batch(bad, {})


def test_embed_takes_one_input_or_a_list_of_them_as_the_openai_api_does():
    assert [i.text for i in build_embed("hello", None, None, 0).inputs] == ["hello"]
    assert [list(i.token_ids.ids) for i in build_embed([5, 6], None, None, 0).inputs] == [[5, 6]]
    msg = build_embed(["a", [1, 2]], "lora-a", 16, -1)
    assert [i.WhichOneof("prompt") for i in msg.inputs] == ["text", "token_ids"]
    assert (msg.model, msg.dimensions, msg.priority) == ("lora-a", 16, -1)
    with pytest.raises(ValueError, match="non-empty list"):
        build_embed([], None, None, 0)


def test_prompts_and_fields_the_wire_cannot_carry_are_refused_in_seawall_words():
    # protobuf refused these with a bare TypeError or ValueError ("Value out of range: -1") naming no field,
    # and took bytes for a list of token ids.
    cases = [(None, {}, "prompt must be a text or a list of token ids"),
             (7, {}, "prompt must be a text or a list of token ids"),
             (b"hi", {}, "prompt must be a text or a list of token ids"),
             ([1, True], {}, "got an item True"),
             ([1, 2.0], {}, "got an item 2.0"),
             ([-1], {}, "token id -1 is out of range"),
             ([2**32], {}, "token id 4294967296 is out of range"),
             ([1], {"priority": "high"}, "priority must be an integer"),
             ([1], {"priority": 2**40}, "priority must be an integer"),
             ([1], {"session_id": 5}, "session_id must be a string"),
             ([1], {"model": 5}, "model must be a string"),
             ([1], {"cache_salt": 5}, "cache_salt must be a string")]
    for prompt, extra, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            build_request(prompt, None, dict(extra))
    with pytest.raises(InvalidArgument, match="request_id must be a string"):
        build_request([1], 5, {})
    with pytest.raises(InvalidArgument, match=r"inputs\[1\] token id -3 is out of range"):
        build_embed(["a", [-3]], None, None, 0)
    with pytest.raises(InvalidArgument, match="dimensions must be an integer"):
        build_embed("a", None, -1, 0)
    # token ids of any integer kind still go through
    assert list(build_request(range(3), None, {}).token_ids.ids) == [0, 1, 2]


def test_a_generator_of_inputs_is_taken_whole():
    # embed() tested a generator for "one list of token ids" by consuming its first item, which was then lost;
    # generate_batch() could not size its completions from one.
    msg = build_embed((t for t in ["a", "b", [1, 2]]), None, None, 0)
    assert [i.WhichOneof("prompt") for i in msg.inputs] == ["text", "text", "token_ids"]
    assert [r.text for r in build_batch((p for p in ["x", "y"]), {}).requests] == ["x", "y"]


class _HungScheduler(scheduler_pb2_grpc.SchedulerServicer):
    async def GetStats(self, request, context):
        await anyio.sleep_forever()

    async def Abort(self, request, context):
        await anyio.sleep_forever()

    async def Generate(self, request, context):
        await anyio.sleep_forever()
        yield scheduler_pb2.GenerateResponse()


async def _hung_scheduler() -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(_HungScheduler(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_a_timeout_around_a_pending_call_ends_inside_its_own_scope():
    # gRPC ends a unary call cancelled by a cancel scope with a blank CancelledError, which the scope took for
    # someone else's and let escape (services/common/rpc.py).
    async def main() -> list[bool]:
        server, address = await _hung_scheduler()
        caught = []
        try:
            async with AsyncClient(address) as client:
                for call in (client.stats, lambda: client.abort("r")):
                    with anyio.move_on_after(0.3) as scope:
                        await call()
                    caught.append(scope.cancelled_caught)
        finally:
            await server.stop(None)
        return caught

    assert anyio.run(main) == [True, True]


def test_closing_the_client_fails_its_pending_calls_and_leaves_their_task_group_running():
    # gRPC ends the calls of a closed channel with a blank CancelledError, which in a task group cancelled
    # the whole group; each call now fails with an error of its own.
    async def main() -> dict[str, str]:
        server, address = await _hung_scheduler()
        errors: dict[str, str] = {}
        try:
            client = AsyncClient(address)
            calls = {"stream": lambda: anext(client.stream([1, 2])), "generate": lambda: client.generate([1, 2]),
                     "stats": client.stats}
            async with anyio.create_task_group() as tg:
                async def call(name: str) -> None:
                    with pytest.raises(SeawallError) as err:
                        await calls[name]()
                    errors[name] = str(err.value)

                for name in calls:
                    tg.start_soon(call, name)
                await anyio.sleep(0.3)
                await client.close()
        finally:
            await server.stop(None)
        return errors

    errors = anyio.run(main)
    assert sorted(errors) == ["generate", "stats", "stream"]
    assert all("its channel was closed" in e for e in errors.values()), errors


def test_a_scheduler_that_is_not_there_is_unavailable_for_every_call():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"

    async def calls() -> None:
        async with AsyncClient(address) as client:
            for call in (client.stats, lambda: client.abort("r")):
                with pytest.raises(Unavailable):
                    await call()

    anyio.run(calls)
    with Client(address) as client:
        for call in (client.stats, lambda: client.abort("r")):
            with pytest.raises(Unavailable):
                call()


def test_a_closed_client_says_so_in_seawall_words():
    """A call on a closed ``Client`` raises a ``SeawallError`` naming the cause (grpc's own is a bare ValueError)."""
    client = Client("127.0.0.1:9")
    client.close()
    for call in (lambda: client.generate("hi"), lambda: list(client.stream("hi")), client.stats,
                 lambda: client.abort("r")):
        with pytest.raises(SeawallError, match="this Client is closed"):
            call()
