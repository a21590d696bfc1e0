"""A real model runner behind a worker's gRPC server, in-process on a free port: the endpoint peers (another
worker, kvcache) read KV blocks and recurrent states from, or write them into."""

from __future__ import annotations

import contextlib

import grpc

from seawall.v1 import common_pb2
from services.common.grpc_kv import add_worker_servicer
from services.common.kv_transport import kv_layout_proto
from services.common.sampling_params import SamplingParams
from services.common.step import NewSequence, StepPlan
from services.engine.config import EngineConfig
from services.engine.runner import ModelRunner
from services.worker.config import WorkerConfig
from services.worker.servicer import WorkerServicer


class CallContext:
    """What a servicer method called directly (not over gRPC) reads of its context."""

    def invocation_metadata(self):
        return ()


def small_runner(model_dir) -> ModelRunner:
    """A float32 runner of ``model_dir`` with a 64-block pool (of the tiny models' 4 KiB blocks)."""
    return ModelRunner(EngineConfig(model=str(model_dir), dtype="float32", kv_cache_bytes=64 * 4096))


@contextlib.asynccontextmanager
async def served(runner: ModelRunner):
    """``runner`` behind a worker's gRPC server on a free port; yields its endpoint (gRPC address, no NIXL)."""
    server = grpc.aio.server()
    add_worker_servicer(WorkerServicer(WorkerConfig(), runner, None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield common_pb2.KVEndpoint(kv_layout=kv_layout_proto(runner.layout), grpc_address=f"127.0.0.1:{port}")
    finally:
        await server.stop(None)


def assert_resumes_like_the_source(src: ModelRunner, dst: ModelRunner, prompt: list[int], token_id: int,
                                   src_blocks: list[int]) -> None:
    """``prompt``'s last 8 tokens after its first 32 (two blocks): on ``dst`` as sequences "t" and "v" (blocks 5
    and 6, each arrived there with its state), and on ``src`` from its checkpoint slot 3 (in ``src_blocks``).
    Each samples ``token_id``, what ``src`` sampled after the whole prompt, with the same logprob."""
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
    mine = src.execute(StepPlan(2, new=[NewSequence("u", prompt, 40, 32, src_blocks, params, state_checkpoint=3)],
                                num_scheduled_tokens={"u": 8}))
    theirs = dst.execute(StepPlan(1, new=[NewSequence("t", prompt, 40, 32, [5, 6, 7], params),
                                          NewSequence("v", prompt, 40, 32, [5, 6, 8], params)],
                                  num_scheduled_tokens={"t": 8, "v": 8}))
    assert not theirs.errors and not mine.errors
    (t,), (v,), (u,) = theirs.sampled["t"], theirs.sampled["v"], mine.sampled["u"]
    assert t.token_id == v.token_id == u.token_id == token_id
    assert abs(t.logprob - u.logprob) < 1e-5  # two sequences in a batch round a little apart
