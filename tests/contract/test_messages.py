"""Contract tests of the seawall.v1 messages and services: round trips, oneof and optional presence, the RPC
table the design needs, and a real gRPC server answering through the generated stubs."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import descriptor_pool

from seawall.v1 import common_pb2, kvcache_pb2, scheduler_pb2, worker_pb2, worker_pb2_grpc

UNARY, SERVER_STREAM, CLIENT_STREAM, BIDI = (False, False), (False, True), (True, False), (True, True)

# Every RPC of DESIGN.md §2-3, with its (client_streaming, server_streaming) shape.
EXPECTED_SERVICES = {
    "seawall.v1.Scheduler": {
        "Generate": SERVER_STREAM,
        "GenerateBatch": SERVER_STREAM,
        "Embed": UNARY,
        "Classify": UNARY,
        "BeamSearch": UNARY,
        "Abort": UNARY,
        "GetStats": UNARY,
        "RegisterWorker": UNARY,
        "DrainWorker": UNARY,
    },
    "seawall.v1.Worker": {
        "Describe": UNARY,
        "Step": UNARY,
        "StepStream": BIDI,
        "PushKV": UNARY,
        "PullKV": UNARY,
        "Abort": UNARY,
        "Free": UNARY,
        "ReadKV": SERVER_STREAM,
        "WriteKV": CLIENT_STREAM,
        "ReadState": SERVER_STREAM,
        "WriteState": CLIENT_STREAM,
        "MeetPeers": UNARY,
    },
    "seawall.v1.KVCache": {
        "Lookup": UNARY,
        "Load": UNARY,
        "Store": UNARY,
        "Stats": UNARY,
        "MeetPeers": UNARY,
    },
}


def make_sampling(**overrides) -> common_pb2.SamplingParams:
    fields = dict(
        max_tokens=64,
        temperature=0.0,
        top_k=40,
        top_p=0.95,
        min_p=0.05,
        seed=1234,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        stop=["\n\n", "</s>"],
        stop_token_ids=[2, 32000],
        ignore_eos=False,
        min_tokens=4,
        logprobs=3,
    )
    fields.update(overrides)
    return common_pb2.SamplingParams(**fields)


def make_step_plan(**overrides) -> worker_pb2.StepPlan:
    """A plan with one new sequence (a prompt chunk with a prefix hit), two continuing ones and block ops."""
    fields = dict(
        step_id=42,
        scheduler_id="sched-0",
        new_sequences=[
            worker_pb2.NewSequence(
                seq_id="req-a",
                token_ids=list(range(100, 140)),
                num_prompt_tokens=40,
                num_computed_tokens=16,
                block_ids=[7, 8, 9],
                sampling=make_sampling(),
                trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            )
        ],
        # req-c also runs, with nothing changed since its last step: it is only in scheduled_seq_ids.
        continuing=[worker_pb2.ContinuingSequence(seq_id="req-b", new_block_ids=[12], num_computed_tokens=48)],
        scheduled_seq_ids=["req-a", "req-b", "req-c"],
        num_scheduled_tokens=[16, 1, 1],
        finished_seq_ids=["req-old"],
        swap_out=[worker_pb2.BlockMove(src_block_id=3, dst_block_id=0)],
        swap_in=[worker_pb2.BlockMove(src_block_id=5, dst_block_id=4)],
        copy=[worker_pb2.BlockMove(src_block_id=10, dst_block_id=11)],
        trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"},
    )
    fields.update(overrides)
    return worker_pb2.StepPlan(**fields)


def roundtrip(message):
    wire = message.SerializeToString(deterministic=True)
    parsed = type(message).FromString(wire)
    assert parsed == message
    assert parsed.SerializeToString(deterministic=True) == wire
    return parsed


def test_step_plan_roundtrip_new_continuing_and_block_ops():
    plan = roundtrip(make_step_plan())

    assert plan.step_id == 42
    (new,) = plan.new_sequences
    assert list(new.token_ids) == list(range(100, 140))
    assert (new.num_prompt_tokens, new.num_computed_tokens, list(new.block_ids)) == (40, 16, [7, 8, 9])
    assert new.sampling.HasField("temperature") and new.sampling.temperature == 0.0
    assert new.trace_context["traceparent"].startswith("00-")
    assert [(c.seq_id, list(c.new_block_ids), c.num_computed_tokens) for c in plan.continuing] == [
        ("req-b", [12], 48),
    ]
    assert dict(zip(plan.scheduled_seq_ids, plan.num_scheduled_tokens, strict=True)) == {"req-a": 16, "req-b": 1, "req-c": 1}
    assert list(plan.finished_seq_ids) == ["req-old"]
    assert [(m.src_block_id, m.dst_block_id) for m in plan.swap_out] == [(3, 0)]
    assert [(m.src_block_id, m.dst_block_id) for m in plan.swap_in] == [(5, 4)]
    assert [(m.src_block_id, m.dst_block_id) for m in plan.copy] == [(10, 11)]


def test_continuing_sequence_is_much_smaller_than_its_first_sight():
    new = make_step_plan().new_sequences[0]
    diff = worker_pb2.ContinuingSequence(seq_id=new.seq_id, num_computed_tokens=new.num_computed_tokens + 16)
    assert diff.ByteSize() * 10 < new.ByteSize()


def test_step_result_roundtrip_with_logprobs_and_errors():
    top = [
        common_pb2.TokenLogprob(token_id=t, logprob=-0.1 * (r + 1), rank=r + 1) for r, t in enumerate([5, 9])
    ]
    result = roundtrip(
        worker_pb2.StepResult(
            step_id=42,
            # req-b sampled one token with logprobs; req-d ran a 2-token multi-step decode without them;
            # req-a, a prompt chunk short of its prompt's end, sampled nothing and is not listed.
            sampled_seq_ids=["req-b", "req-d"],
            num_sampled_tokens=[1, 2],
            sampled_token_ids=[5, 7, 8],
            logprobs=[common_pb2.TokenLogprobs(sampled=top[0], top=top), common_pb2.TokenLogprobs(),
                      common_pb2.TokenLogprobs()],
            errors=[
                worker_pb2.SequenceError(
                    seq_id="req-c", code=grpc.StatusCode.INTERNAL.value[0], message="NaN logits"
                )
            ],
            forward_time_ms=12.5,
            step_time_ms=14.0,
            num_tokens=18,
            num_seqs=3,
            num_sampled=2,
            num_blocks_moved=3,
        )
    )
    assert list(result.sampled_token_ids) == [5, 7, 8]
    assert result.logprobs[0].sampled.rank == 1
    assert not result.logprobs[1].HasField("sampled")
    assert result.errors[0].code == grpc.StatusCode.INTERNAL.value[0]


def test_generate_request_prompt_oneof():
    by_text = roundtrip(
        scheduler_pb2.GenerateRequest(model="builtin", text="Hello", sampling=make_sampling())
    )
    assert by_text.WhichOneof("prompt") == "text"
    assert not by_text.HasField("token_ids")

    by_ids = roundtrip(
        scheduler_pb2.GenerateRequest(
            request_id="client-1",
            token_ids=scheduler_pb2.TokenIds(ids=[1, 15043, 29871]),
            session_id="chat-7",
            stream_options=scheduler_pb2.StreamOptions(return_token_ids=True),
            priority=-1,
        )
    )
    assert by_ids.WhichOneof("prompt") == "token_ids"
    assert list(by_ids.token_ids.ids) == [1, 15043, 29871]
    assert by_ids.text == ""

    by_ids.text = "switched"  # setting one member clears the other
    assert by_ids.WhichOneof("prompt") == "text"
    assert not by_ids.HasField("token_ids")

    assert scheduler_pb2.GenerateRequest().WhichOneof("prompt") is None
    assert not scheduler_pb2.GenerateRequest().HasField("stream_options")  # unset = both on


def test_sampling_optional_fields_have_presence():
    defaults = common_pb2.SamplingParams()
    for name in ("temperature", "seed", "logprobs"):
        assert not defaults.HasField(name), name
    greedy = roundtrip(make_sampling(temperature=0.0, logprobs=0, seed=0))
    for name in ("temperature", "seed", "logprobs"):
        assert greedy.HasField(name), name  # an explicit zero survives the wire


def test_generate_response_and_stats_roundtrip():
    final = roundtrip(
        scheduler_pb2.GenerateResponse(
            request_id="client-1",
            token_ids=[2],
            finish_reason=common_pb2.FINISH_REASON_STOP,
            finish_detail="</s>",
            usage=common_pb2.Usage(prompt_tokens=40, completion_tokens=12, cached_prompt_tokens=32),
            queue_delay_ms=3.25,
        )
    )
    assert final.usage.cached_prompt_tokens == 32
    stats = roundtrip(
        scheduler_pb2.GetStatsResponse(
            policy="fastserve",
            queue_lengths=[3, 0, 7],
            num_running=8,
            num_waiting=10,
            num_swapped=2,
            workers=[
                scheduler_pb2.WorkerStats(
                    worker_id="w0",
                    role=worker_pb2.WORKER_ROLE_HYBRID,
                    num_device_blocks=1024,
                    num_device_blocks_used=700,
                    num_host_blocks=4096,
                    num_host_blocks_used=64,
                )
            ],
        )
    )
    assert list(stats.queue_lengths) == [3, 0, 7]


def test_kv_messages_roundtrip_full_width_hashes():
    hashes = [0, 1, 2**63, 2**64 - 1]  # chained hashes use all 64 bits
    endpoint = common_pb2.KVEndpoint(
        agent_name="decode-0",
        agent_metadata=common_pb2.NixlAgentMetadata(
            agent_name="decode-0",
            agent_metadata=b"\x00opaque\xff",
            regions=[
                common_pb2.MemoryRegion(
                    addr=0x7F0000000000, length=1 << 30, device_id=0, mem_type=common_pb2.MEMORY_TYPE_VRAM
                )
            ],
        ),
        kv_layout=common_pb2.KVLayout(
            block_size=16,
            num_layers=2,
            num_kv_heads=4,
            head_dim=64,
            dtype=common_pb2.KV_DTYPE_FLOAT32,
            bytes_per_block=65536,
            regions_per_block=1,
            region_block_bytes=65536,
        ),
        grpc_address="127.0.0.1:50052",
    )
    load = roundtrip(
        kvcache_pb2.LoadRequest(
            transfer_id="t-1",
            block_hashes=hashes,
            target=endpoint,
            target_block_ids=[4, 5, 6, 7],
            notification_key="t-1/done",
            timeout_ms=500,
            transport=common_pb2.KV_TRANSPORT_NIXL,
            path=kvcache_pb2.KV_READ_PATH_DE_READ,
        )
    )
    assert list(load.block_hashes) == hashes
    assert load.target.agent_metadata.regions[0].addr == 0x7F0000000000
    layout = load.target.kv_layout
    assert layout.bytes_per_block == layout.regions_per_block * layout.region_block_bytes

    pull = roundtrip(
        worker_pb2.PullKVRequest(
            transfer_id="t-2",
            src=endpoint,
            src_block_ids=[1, 2],
            dst_block_ids=[9, 10],
            notification_key="t-2/done",
            timeout_ms=1000,
        )
    )
    assert len(pull.src_block_ids) == len(pull.dst_block_ids)
    assert roundtrip(kvcache_pb2.LookupResponse(num_cached_blocks=3, num_dram_blocks=2, num_disk_blocks=1))


def test_services_have_the_rpcs_the_design_needs():
    pool = descriptor_pool.Default()
    files = [pb.DESCRIPTOR for pb in (common_pb2, scheduler_pb2, worker_pb2, kvcache_pb2)]
    services = {svc.full_name: svc for f in files for svc in f.services_by_name.values()}
    assert set(services) == set(EXPECTED_SERVICES)
    for full_name, expected in EXPECTED_SERVICES.items():
        service = pool.FindServiceByName(full_name)
        shapes = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
        assert shapes == expected, full_name
    step, stream = (pool.FindMethodByName(f"seawall.v1.Worker.{n}") for n in ("Step", "StepStream"))
    assert (step.input_type, step.output_type) == (stream.input_type, stream.output_type)


class _DescribeAndEcho(worker_pb2_grpc.WorkerServicer):
    """A worker that only describes itself and answers each plan with an empty result."""

    async def Describe(self, request, context):
        return worker_pb2.WorkerInfo(
            role=worker_pb2.WORKER_ROLE_DECODE,
            model="builtin",
            num_device_blocks=128,
            kv_layout=common_pb2.KVLayout(block_size=16),
            device="cpu",
            max_model_len=2048,
        )

    async def StepStream(self, request_iterator, context):
        async for plan in request_iterator:
            yield worker_pb2.StepResult(
                step_id=plan.step_id, num_tokens=sum(plan.num_scheduled_tokens)
            )


async def _call_real_server() -> None:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(_DescribeAndEcho(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)

            info = await stub.Describe(worker_pb2.DescribeRequest(), timeout=10)
            assert (info.role, info.model, info.kv_layout.block_size) == (
                worker_pb2.WORKER_ROLE_DECODE,
                "builtin",
                16,
            )

            plans = [make_step_plan(step_id=i) for i in range(3)]
            results = [r async for r in stub.StepStream(iter(plans), timeout=10)]
            assert [(r.step_id, r.num_tokens) for r in results] == [(0, 18), (1, 18), (2, 18)]

            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await stub.Step(make_step_plan(), timeout=10)
            assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(grace=None)


@pytest.mark.timeout(60)
def test_generated_stubs_work_over_a_real_server():
    asyncio.run(_call_real_server())
