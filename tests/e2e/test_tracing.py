"""One trace per request across every service, exported over OTLP/gRPC to a real receiver (as Jaeger's 4317)."""

from __future__ import annotations

import time

import grpc
import httpx
import pytest

from seawall.commands.trace import waterfall
from seawall.trace_receiver import TraceReceiver
from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import tracing as t
from tests.e2e.conftest import random_prompts, start_mesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def traced_mesh(tiny_model_dir, tmp_path_factory):
    receiver = TraceReceiver().start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        # Workers cache no prefixes: a session's next turn reads its prefix from kvcache.
        mesh = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"),
                          scheduler_args=["--chunk-size", "32", "--no-prefix-caching"], kvcache_args=[])
    yield mesh, receiver
    mesh.stop()
    receiver.stop()


def _wait_for(receiver: TraceReceiver, trace_id: str, names: set[str], timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spans = receiver.trace(trace_id)
        if names <= {s.name for s in spans}:
            return spans
        time.sleep(0.1)
    raise AssertionError(f"missing spans {names - {s.name for s in receiver.trace(trace_id)}}")


def test_a_grpc_request_is_one_trace_across_scheduler_prefill_and_decode(traced_mesh):
    mesh, receiver = traced_mesh
    with grpc.insecure_channel(mesh.grpc_address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        request = scheduler_pb2.GenerateRequest(request_id="traced-1", token_ids=scheduler_pb2.TokenIds(
            ids=random_prompts([100], seed=11)[0]))
        request.sampling.max_tokens = 6
        request.sampling.temperature = 0
        replies = list(stub.Generate(request, metadata=(("traceparent", TRACEPARENT),)))
    assert replies[-1].finish_reason
    spans = _wait_for(receiver, CLIENT_TRACE, {
        t.SPAN_REQUEST, t.SPAN_QUEUE, t.SPAN_PREFILL_CHUNK, t.SPAN_KV_TRANSFER, t.SPAN_DECODE,
        t.SPAN_WORKER_PREFILL, t.SPAN_WORKER_TRANSFER, t.SPAN_WORKER_DECODE})
    services = {s.service for s in spans}
    assert {t.SCHEDULER, t.PREFILL, t.DECODE, t.KVCACHE} <= services  # kvcache: the (missed) lookup
    root = next(s for s in spans if s.name == t.SPAN_REQUEST)
    assert root.parent_span_id == "00f067aa0ba902b7"  # the client's span
    assert root.attributes[t.REQUEST_ID] == "traced-1" and root.attributes[t.GEN_AI_OUTPUT_TOKENS] == 6
    chunks = [s for s in spans if s.name == t.SPAN_PREFILL_CHUNK]
    assert sum(s.attributes[t.CHUNK_TOKENS] for s in chunks) == 100 and len(chunks) == 4  # 32-token chunks
    transfer = next(s for s in spans if s.name == t.SPAN_WORKER_TRANSFER)
    assert transfer.service == t.DECODE and transfer.attributes[t.KV_PATH] == "nixl"
    assert transfer.attributes[t.KV_BYTES] > 0 and transfer.attributes[t.KV_BLOCKS] == 7
    decode = next(s for s in spans if s.name == t.SPAN_WORKER_DECODE)
    assert decode.attributes[t.DECODE_TOKENS] == 5  # the first token came from the prefill worker
    ids = {s.span_id for s in spans}
    assert all(s.parent_span_id in ids or s is root for s in spans)  # one tree
    lines = waterfall(spans)
    assert len(lines) == len(spans) + 1 and "seawall.request" in lines[1]


def test_an_http_request_joins_the_callers_trace_from_traceparent(traced_mesh):
    mesh, receiver = traced_mesh
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    response = httpx.post(f"{mesh.http_url}/v1/completions", json={"prompt": "Hello", "max_tokens": 3},
                          headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}, timeout=60)
    assert response.status_code == 200
    spans = _wait_for(receiver, trace_id, {t.SPAN_REQUEST, t.SPAN_WORKER_PREFILL})
    assert {s.trace_id for s in spans} == {trace_id}


def test_a_turn_whose_prefix_comes_from_kvcache_has_kvcache_spans_in_its_trace(traced_mesh):
    mesh, receiver = traced_mesh
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4799"
    prompt = random_prompts([80], seed=12)[0]
    with grpc.insecure_channel(mesh.grpc_address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        def turn(tokens, metadata=()):
            request = scheduler_pb2.GenerateRequest(token_ids=scheduler_pb2.TokenIds(ids=tokens), session_id="t")
            request.sampling.max_tokens = 4
            request.sampling.temperature = 0
            return list(stub.Generate(request, metadata=metadata))

        first = turn(prompt)
        second = prompt + [t for r in first for t in r.token_ids] + [5, 6, 7]
        replies = turn(second, metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),))
    assert replies[-1].usage.cached_prompt_tokens > 0
    spans = _wait_for(receiver, trace_id, {t.SPAN_REQUEST, "seawall.kvcache.lookup", "seawall.kvcache.load",
                                           "seawall.kvcache.store"})
    load = next(s for s in spans if s.name == "seawall.kvcache.load")
    assert load.service == t.KVCACHE and load.attributes[t.KV_BYTES] > 0
    ids = {s.span_id for s in spans}
    assert load.parent_span_id in ids  # a child of the request's span, across processes


def test_a_beam_search_is_one_trace_whose_steps_are_children_of_its_span(traced_mesh):
    mesh, receiver = traced_mesh
    trace_id = "7cf92f3577b34da6a3ce929d0e0e4712"
    response = httpx.post(f"{mesh.http_url}/v1/completions",
                          json={"prompt": random_prompts([20], seed=3)[0], "max_tokens": 4, "n": 3,
                                "use_beam_search": True, "ignore_eos": True},
                          headers={"traceparent": f"00-{trace_id}-c7ad6b7169203332-01"}, timeout=60)
    assert response.status_code == 200 and len(response.json()["choices"]) == 3
    spans = _wait_for(receiver, trace_id, {t.SPAN_BEAM_SEARCH, t.SPAN_REQUEST, t.SPAN_WORKER_PREFILL})
    (search,) = [s for s in spans if s.name == t.SPAN_BEAM_SEARCH]
    assert search.parent_span_id == "c7ad6b7169203332"
    assert search.attributes[t.BEAM_WIDTH] == 3 and search.attributes[t.BEAM_STEPS] == 4
    deadline = time.monotonic() + 20
    while len(requests := [s for s in spans if s.name == t.SPAN_REQUEST]) < 10 and time.monotonic() < deadline:
        time.sleep(0.1)  # spans leave each service in batches
        spans = receiver.trace(trace_id)
    assert len(requests) == 1 + 3 + 3 + 3  # the prompt, then three beams a step
    assert {s.parent_span_id for s in requests} == {search.span_id}
