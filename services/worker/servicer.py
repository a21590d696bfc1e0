"""The Worker gRPC service: runs step plans on the engine and moves KV blocks by id.

A thin shell (STYLE §1): protos are converted at the edge; steps run one at a time, in the order their plans
came, on the process's torch thread, and sequence state changes (Free, Abort) run there too, after the steps
queued before them. A CPU worker's torch thread is its event-loop thread (``InlineTorch``; torch_thread.py says
why): health checks and KV transfer requests then wait for the step running, at most one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import grpc
from opentelemetry import trace
from prometheus_client import CollectorRegistry, Gauge, Histogram, Info

from seawall.v1 import common_pb2, worker_pb2
from services.common import grpc_kv
from services.common import tracing as tr
from services.common.convert import plan_from_proto, result_to_proto
from services.common.errors import FailedPrecondition, InvalidArgument, SeawallError
from services.common.grpc_server import abort_with
from services.common.grpc_state import collect_state, pull_state, state_messages, state_nbytes
from services.common.kv_transport import (
    NixlKVAgent,
    TransferOutcome,
    TransferState,
    kv_layout_proto,
    meeting_metadata,
)
from services.common.metrics import LATENCY_BUCKETS, StepMetrics, TransferMetrics
from services.common.shaper import COMPUTE, EGRESS, INGRESS, Shaper, TokenBucket
from services.common.tracing import Tracing
from services.common.version import VERSION
from services.engine.runner import ModelRunner
from services.engine.step_profile import StepTimeFit
from services.engine.torch_thread import InlineTorch, TorchThread
from services.worker.config import WorkerConfig
from services.worker.seq_traces import SequenceTraces

log = logging.getLogger(__name__)

_ROLES = {"prefill": worker_pb2.WORKER_ROLE_PREFILL, "decode": worker_pb2.WORKER_ROLE_DECODE,
          "hybrid": worker_pb2.WORKER_ROLE_HYBRID}


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.steps = StepMetrics(registry)
        self.transfers = TransferMetrics(registry)
        self.forward_seconds = Histogram("seawall_forward_seconds", "Forward pass and sampling of one step",
                                         registry=registry, buckets=LATENCY_BUCKETS)
        # As vLLM's cache_config_info: what the KV pool holds, for dashboards to tell a float8 pool from another.
        self.nixl_peers = Gauge("seawall_nixl_peers", "NIXL peers this worker met (connections open)",
                                registry=registry)
        self.kv_cache = Info("seawall_kv_cache", "The worker's KV pool: element type, block size and counts",
                             registry=registry)


class WorkerServicer(grpc_kv.KVBytesServicer):
    """ReadKV/WriteKV (the gRPC KV fallback) come from ``KVBytesServicer`` over the runner's pool."""

    def __init__(self, config: WorkerConfig, runner: ModelRunner, agent: NixlKVAgent | None,
                 metrics: WorkerMetrics | None = None, tracing: Tracing | None = None,
                 torch_thread: TorchThread | InlineTorch | None = None, step_time: StepTimeFit | None = None) -> None:
        super().__init__(runner.kv)
        self.config = config
        self.metrics = metrics or WorkerMetrics(CollectorRegistry())
        for direction in ("out", "in"):  # both series exported from the start, at 0 until a swap
            self.metrics.steps.swap_bytes.labels(direction)
        self.tracing = tracing or Tracing(trace.NoOpTracer())
        self._traces = SequenceTraces(self.tracing.tracer, f"{config.role}@{config.name or config.host}")
        self.runner = runner
        layout = runner.kv.layout
        self.metrics.kv_cache.info({
            "dtype": str(layout.dtype).removeprefix("torch."), "block_size": str(layout.block_size),
            "bytes_per_block": str(layout.bytes_per_block), "num_device_blocks": str(runner.kv.num_blocks),
            "num_host_blocks": str(runner.kv.num_host_blocks)})
        self.step_time = step_time  # the fit of this worker's step times, reported in info()
        # Steps, and the sequence state changes between them (Free, Abort), run on the process's torch thread
        # (torch_thread.py says why), one at a time in the order they came: that thread owns the runner's
        # state, so nothing else needs a lock, and a step queued behind another starts the moment it ends.
        self._torch = torch_thread or TorchThread.plain()
        self.agent = agent
        if agent is not None:
            self.metrics.nixl_peers.set_function(lambda: len(agent.met))
        self._scheduler_id = ""
        self._closing = False
        self._readers: set[asyncio.Task] = set()  # one per open step stream: close_streams cancels them
        # Set when a step stream ends while this worker serves: its scheduler went away or dropped it, and knows
        # nothing of it from then on unless it registers again (main.stay_registered).
        self.stream_lost = asyncio.Event()

    def info(self) -> worker_pb2.WorkerInfo:
        r = self.runner
        msg = worker_pb2.WorkerInfo(
            role=_ROLES[self.config.role], model=str(r.checkpoint.path), num_device_blocks=r.kv.num_blocks,
            num_host_blocks=r.kv.num_host_blocks, kv_layout=kv_layout_proto(r.kv.layout), device=str(r.device),
            max_model_len=r.max_model_len, eos_token_ids=r.checkpoint.eos_token_ids, version=VERSION,
            sliding_window=r.checkpoint.config.uniform_window or 0, recurrent_state=r.checkpoint.config.recurrent,
            state_checkpoints=r.state_checkpoints, host_state_checkpoints=r.host_state_checkpoints)
        if self.agent is not None:
            msg.nixl.CopyFrom(self.agent.metadata())
        if self.step_time is not None:
            fit = self.step_time
            msg.step_time.CopyFrom(worker_pb2.StepTimeProfile(
                base_ms=fit.base_s * 1e3, per_token_ms=fit.per_token_s * 1e3, per_seq_ms=fit.per_seq_s * 1e3))
        return msg

    async def Describe(self, request, context):
        return self.info()

    async def Step(self, request, context):
        return await self._step(request, context)

    async def StepStream(self, request_iterator, context):
        # Each plan queues its step as soon as it is read (steps run one at a time, in order, on the torch thread):
        # a plan the scheduler sent ahead then runs right behind the step before it, instead of after that
        # step's result is written and the next plan read, which left the forward pass idle ~1 ms a step.
        steps: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()
        reader = asyncio.ensure_future(self._read_plans(context, steps))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        try:
            while (step := await steps.get()) is not None:
                yield await step
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise reader.exception()
        finally:
            reader.cancel()  # steps already read still run (_step): the scheduler may count on their KV
            if not self._closing:
                self.stream_lost.set()

    async def _read_plans(self, context, steps: asyncio.Queue) -> None:
        """Starts a step per plan read; None once the stream ends. Reads with context.read() rather than the
        iterator, so that shutdown can cancel a pending read (close_streams): a worker told to stop (SIGTERM)
        ends the stream cleanly while the scheduler still holds it open."""
        try:
            while not self._closing:
                plan = await context.read()
                if plan is grpc.aio.EOF:
                    return
                step = asyncio.ensure_future(self._step(plan, context))
                # A step whose stream ended (its caller gone) still finishes: read its outcome so that
                # asyncio does not log it as never retrieved.
                step.add_done_callback(lambda f: f.cancelled() or f.exception())
                steps.put_nowait(step)
        except asyncio.CancelledError:
            pass  # closing, or the stream's caller went away: the steps already read still run
        finally:
            steps.put_nowait(None)

    def close_streams(self) -> None:
        """Ends every open step stream after the steps it has already read (called on shutdown)."""
        self._closing = True
        for reader in list(self._readers):
            reader.cancel()

    async def _step(self, msg: worker_pb2.StepPlan, context) -> worker_pb2.StepResult:
        try:
            plan = plan_from_proto(msg)
        except SeawallError as exc:
            await abort_with(context, exc)
        # Queued before the first await, so steps run in the order their plans were read; never abandoned
        # halfway because the caller went away.
        try:
            result, seconds = await self._torch.run_in_order(self._run_step, msg, plan)
        except SeawallError as exc:
            await abort_with(context, exc)
        except KeyError as exc:  # the plan names a sequence this worker never saw: a scheduler bug
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        self._observe_step(plan, result, seconds)
        return result_to_proto(result, seconds)

    def _run_step(self, msg: worker_pb2.StepPlan, plan) -> tuple:
        """On the torch thread: one step, with the state changes and spans around it."""
        if msg.scheduler_id != self._scheduler_id:
            # A new scheduler (or a reconnect after a failure) knows nothing of what we hold.
            self.runner.drop_all()
            self._traces.drop_all()
            self._scheduler_id = msg.scheduler_id
        started = time.perf_counter()
        if self.tracing.enabled:
            start_ns, traced = self._traces.begin_step(msg, self.runner.seqs)
        result = self.runner.execute(plan)
        seconds = time.perf_counter() - started
        if self.tracing.enabled:
            self._traces.end_step(start_ns, traced, msg.step_id)
        return result, seconds

    def _observe_step(self, plan, result, seconds: float) -> None:
        m = self.metrics
        m.steps.step_seconds.observe(seconds)
        m.steps.step_tokens.observe(plan.total_tokens)
        m.forward_seconds.observe(result.forward_seconds)
        # Most steps move nothing: skip the labelled lookups (each takes a lock) unless they do.
        if plan.swap_out or plan.swap_in:
            block_bytes = self.runner.kv.layout.bytes_per_block
            m.steps.swap_bytes.labels("out").inc(len(plan.swap_out) * block_bytes)
            m.steps.swap_bytes.labels("in").inc(len(plan.swap_in) * block_bytes)

    async def PullKV(self, request, context):
        if request.src_block_ids or not request.state_seq_id:
            outcome = await self._transfer(request, request.src, "read", context)
        else:  # a state alone: every block of the prefix it resumes is cached here already
            outcome = TransferOutcome(request.transfer_id, TransferState.DONE, 0, 0.0)
        if outcome.ok and request.state_seq_id:
            outcome = await self._pull_state(request, outcome)
        return worker_pb2.PullKVResponse(**outcome.response_fields())

    async def _pull_state(self, request, blocks: TransferOutcome) -> TransferOutcome:
        """After a sequence's blocks, its recurrent state from the same source (common/grpc_state.py), kept until
        the plan that adds the sequence; the transfer fails as a whole when the state does not come."""
        started = time.perf_counter()
        timeout_s = (request.timeout_ms / 1e3 if request.timeout_ms else 60.0) - blocks.seconds
        seq_id, states = request.state_seq_id, self.runner.states
        try:
            if states is None:
                raise InvalidArgument("this worker's model has no linear-attention layers")
            checkpoint = request.state_checkpoint if request.HasField("state_checkpoint") else None
            num_computed, layers, nbytes = await pull_state(request.src.grpc_address, seq_id, timeout_s, checkpoint)
            if checkpoint is not None:
                num_computed = request.state_checkpoint_tokens
            await self._torch.run(states.stash, seq_id, num_computed, layers)
        except (grpc.aio.AioRpcError, ValueError, SeawallError) as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            return replace(blocks, status=TransferState.FAILED, bytes=0, error=f"recurrent state of {seq_id}: {detail}",
                           seconds=blocks.seconds + time.perf_counter() - started)
        return replace(blocks, bytes=blocks.bytes + nbytes, seconds=blocks.seconds + time.perf_counter() - started)

    async def ReadState(self, request, context):
        try:
            if request.HasField("checkpoint"):
                num_computed, layers = 0, await self._torch.run(self.runner.export_checkpoint, request.checkpoint)
            else:
                num_computed, layers = await self._torch.run(self.runner.export_state, request.seq_id)
        except SeawallError as exc:
            await abort_with(context, exc)
        for msg in state_messages(num_computed, layers):
            yield msg

    async def WriteState(self, request_iterator, context):
        try:
            seq_id, num_computed, layers = await collect_state(request_iterator)
            if self.runner.states is None:
                raise InvalidArgument("this worker's model has no linear-attention layers")
            await self._torch.run(self.runner.states.stash, seq_id, num_computed, layers)
        except ValueError as exc:
            await abort_with(context, InvalidArgument(str(exc)))
        except SeawallError as exc:
            await abort_with(context, exc)
        return worker_pb2.WriteStateResponse(bytes=state_nbytes(layers))

    async def PushKV(self, request, context):
        outcome = await self._transfer(request, request.dst, "write", context)
        return worker_pb2.PushKVResponse(**outcome.response_fields())

    async def MeetPeers(self, request, context):
        if self.agent is None:
            await abort_with(context, FailedPrecondition("this worker has no NIXL agent (NIXL unavailable here): it "
                                                         "has no peers to meet; its transfers go over gRPC"))
        timeout_s = request.timeout_ms / 1e3 if request.timeout_ms else 10.0
        met = []
        try:
            for peer in request.peers:
                meta = meeting_metadata(peer)
                if await self.agent.meet(meta, peer.kv_layout, timeout_s):
                    met.append(meta.agent_name)
        except SeawallError as exc:
            await abort_with(context, exc)
        return common_pb2.MeetPeersResponse(agent_names=met)

    def _observe_transfer(self, path: str, outcome: TransferOutcome) -> TransferOutcome:
        self.metrics.transfers.bytes.labels(path, outcome.status.name.lower()).inc(outcome.bytes)
        self.metrics.transfers.seconds.labels(path).observe(outcome.seconds)
        return outcome

    async def _transfer(self, request, peer: common_pb2.KVEndpoint, direction: str, context) -> TransferOutcome:
        """``read``: the peer's ``src_block_ids`` into our ``dst_block_ids``; ``write``: the other way."""
        parent = tr.from_grpc_metadata(context.invocation_metadata())
        with self.tracing.tracer.start_as_current_span(tr.SPAN_WORKER_TRANSFER, context=parent) as span:
            path, outcome = await self._move(request, peer, direction, context)
            if outcome is not None:
                span.set_attributes({tr.KV_PATH: path, tr.KV_BYTES: outcome.bytes,
                                     tr.KV_BLOCKS: len(request.dst_block_ids), tr.KV_STATUS: outcome.status.name,
                                     tr.KV_GBPS: outcome.bytes / max(outcome.seconds, 1e-9) / 1e9})
            return outcome

    async def _move(self, request, peer: common_pb2.KVEndpoint, direction: str,
                    context) -> tuple[str, TransferOutcome]:
        timeout_s = request.timeout_ms / 1e3 if request.timeout_ms else 60.0
        src, dst = list(request.src_block_ids), list(request.dst_block_ids)
        use_nixl = (request.transport != common_pb2.KV_TRANSPORT_GRPC and self.agent is not None
                    and peer.HasField("agent_metadata") and peer.agent_metadata.agent_name)
        bucket = self._compute_bucket(INGRESS if direction == "read" else EGRESS)
        try:
            if use_nixl:
                self.agent.add_peer(peer.agent_metadata, peer.kv_layout)
                name = peer.agent_metadata.agent_name
                move = self.agent.read if direction == "read" else self.agent.write
                return "nixl", self._observe_transfer("nixl", await move(request.transfer_id, name, src, dst,
                                                                         timeout_s, bucket=bucket))
            if not peer.grpc_address:
                raise InvalidArgument("the peer endpoint has neither NIXL metadata this worker can use nor a "
                                      "grpc_address for the gRPC fallback")
            move = grpc_kv.pull_blocks if direction == "read" else grpc_kv.push_blocks
            outcome = await move(peer.grpc_address, self.runner.kv, src, dst, request.transfer_id, timeout_s,
                                 bucket=bucket)
            return "grpc", self._observe_transfer("grpc", outcome)
        except SeawallError as exc:
            await abort_with(context, exc)
        return "", None

    def _compute_bucket(self, direction: str) -> TokenBucket | None:
        """This node's compute-NIC bucket in ``direction`` (``--compute-gbps``); None when not shaped (the
        default). The shaper is made on the first transfer."""
        if not self.config.compute_gbps:
            return None
        shaper = self.__dict__.get("_shaper")
        if shaper is None:
            shaper = self._shaper = Shaper(compute_gbps=self.config.compute_gbps)
        return shaper.bucket(COMPUTE, self.config.name or self.config.host, direction)

    async def Abort(self, request, context):
        unknown_transfers = [t for t in request.transfer_ids if self.agent is None or not self.agent.abort(t)]
        unknown = await self._drop(request.seq_ids)
        return worker_pb2.WorkerAbortResponse(unknown_seq_ids=unknown, unknown_transfer_ids=unknown_transfers)

    async def Free(self, request, context):
        return worker_pb2.FreeResponse(unknown_seq_ids=await self._drop(request.seq_ids))

    async def _drop(self, seq_ids) -> list[str]:
        return await self._torch.run(self._drop_now, list(seq_ids))

    def _drop_now(self, seq_ids: list[str]) -> list[str]:
        """On the torch thread, after the steps queued before it."""
        self._traces.drop(seq_ids)
        return [s for s in seq_ids if not self.runner.drop(s)]
