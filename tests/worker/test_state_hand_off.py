"""A hybrid model's hand-off between two real workers (services/common/grpc_state.py): the destination pulls a
sequence's KV blocks over the gRPC fallback, then its recurrent state with ReadState from the source's server,
and continues it exactly as the source would have; a state the source does not hold fails the pull, naming it."""

from __future__ import annotations

import pytest
import torch

from seawall.v1 import common_pb2, worker_pb2
from services.common.sampling_params import SamplingParams
from services.common.step import ContinuingSequence, NewSequence, StepPlan
from services.worker.config import WorkerConfig
from services.worker.servicer import WorkerServicer
from tests.common.served_worker import CallContext, assert_resumes_like_the_source, served, small_runner

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

PARAMS = SamplingParams(max_tokens=8, temperature=0, logprobs=0)


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_a_pulled_state_continues_the_sequence_as_its_source_would(hybrid_model_dir):
    src, dst = small_runner(hybrid_model_dir), small_runner(hybrid_model_dir)
    prompt = torch.randint(3, 4096, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    first = src.execute(StepPlan(1, new=[NewSequence("s", prompt, 40, 0, [0, 1, 2], PARAMS)],
                                 num_scheduled_tokens={"s": 40})).sampled["s"][0]
    async with served(src) as endpoint:
        receiver = WorkerServicer(WorkerConfig(), dst, None)

        def pull(seq_id: str) -> worker_pb2.PullKVRequest:
            return worker_pb2.PullKVRequest(transfer_id=f"t-{seq_id}", src=endpoint, src_block_ids=[0, 1, 2],
                                            dst_block_ids=[5, 6, 7], timeout_ms=20_000,
                                            transport=common_pb2.KV_TRANSPORT_GRPC, state_seq_id=seq_id)

        reply = await receiver.PullKV(pull("s"), CallContext())
        state_bytes = src.states.nbytes_per_slot()
        assert (reply.status, reply.bytes) == (common_pb2.TRANSFER_STATUS_DONE, 3 * 4096 + state_bytes), reply.error
        missing = await receiver.PullKV(pull("nope"), CallContext())
        assert missing.status == common_pb2.TRANSFER_STATUS_FAILED and missing.bytes == 0
        assert "recurrent state of nope: this worker holds no recurrent state for sequence 'nope'" in missing.error
    # The source's own next token, and the destination's from the pulled blocks and state: the same.
    mine = src.execute(StepPlan(2, continuing=[ContinuingSequence("s", [])], num_scheduled_tokens={"s": 1}))
    theirs = dst.execute(StepPlan(1, new=[NewSequence("s", [*prompt, first.token_id], 40, 40, [5, 6, 7], PARAMS)],
                                  num_scheduled_tokens={"s": 1}))
    assert not theirs.errors
    assert theirs.sampled["s"] == mine.sampled["s"]
    # Without its state, the same sequence fails alone, by name.
    lost = dst.execute(StepPlan(2, new=[NewSequence("t", [*prompt, first.token_id], 40, 40, [8, 9, 10], PARAMS)],
                                num_scheduled_tokens={"t": 1}))
    assert "arrived with 40 tokens computed elsewhere and no recurrent state" in str(lost.errors["t"])


async def test_a_state_checkpoint_read_from_a_peer_resumes_the_prefix_there(hybrid_model_dir):
    """A prefix read from another worker's prefix cache (services/scheduler/peer_prefix.py): its blocks, then
    the state the source saved where they end (ReadState of a checkpoint slot), kept under the sequence that
    arrives with that prefix; the sequence goes on exactly as one started from the checkpoint on the source."""
    src, dst = small_runner(hybrid_model_dir), small_runner(hybrid_model_dir)
    prompt = torch.randint(3, 4096, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    # The source runs the prompt, saving its state after 32 tokens (two blocks) into checkpoint slot 3.
    first = src.execute(StepPlan(1, new=[NewSequence("s", prompt, 40, 0, [0, 1, 2], PARAMS)],
                                 num_scheduled_tokens={"s": 40}, state_saves={"s": (32, 3)})).sampled["s"][0]
    async with served(src) as endpoint:
        receiver = WorkerServicer(WorkerConfig(), dst, None)

        def pull(seq_id: str, checkpoint: int, src_blocks: list[int], dst_blocks: list[int]):
            return worker_pb2.PullKVRequest(transfer_id=f"t-{seq_id}", src=endpoint, src_block_ids=src_blocks,
                                            dst_block_ids=dst_blocks, timeout_ms=20_000,
                                            transport=common_pb2.KV_TRANSPORT_GRPC, state_seq_id=seq_id,
                                            state_checkpoint=checkpoint, state_checkpoint_tokens=32)

        reply = await receiver.PullKV(pull("t", 3, [0, 1], [5, 6]), CallContext())
        state_bytes = src.states.nbytes_per_slot()
        assert (reply.status, reply.bytes) == (common_pb2.TRANSFER_STATUS_DONE, 2 * 4096 + state_bytes), reply.error
        # The blocks cached here already: the state alone comes.
        alone = await receiver.PullKV(pull("v", 3, [], []), CallContext())
        assert (alone.status, alone.bytes) == (common_pb2.TRANSFER_STATUS_DONE, state_bytes), alone.error
        missing = await receiver.PullKV(pull("w", 7, [], []), CallContext())
        assert missing.status == common_pb2.TRANSFER_STATUS_FAILED and missing.bytes == 0
        assert "state checkpoint 7 was never saved on this worker" in missing.error
    # The rest of the prompt from the pulled prefix, and on the source from its checkpoint: the prompt's token.
    assert_resumes_like_the_source(src, dst, prompt, first.token_id, src_blocks=[0, 1, 3])
