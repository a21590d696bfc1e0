"""The scheduler's view of one registered worker: its channel, its scheduler core and its wake-up signal."""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import grpc

from seawall.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.common.block_hash import extend_hashes, hash_seed
from services.common.grpc_server import CHANNEL_OPTIONS
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.request import Request
from services.scheduler.core.scheduler import Scheduler, SchedulerConfig, StepTimeModel

if TYPE_CHECKING:
    from services.scheduler.worker_drain import Drain

ROLE_NAMES = {worker_pb2.WORKER_ROLE_PREFILL: "prefill", worker_pb2.WORKER_ROLE_DECODE: "decode",
              worker_pb2.WORKER_ROLE_HYBRID: "hybrid"}


@dataclass
class Arrival:
    """A request handed off by ``src`` (its KV held in ``src_blocks``) waiting for blocks on the receiver."""

    request: Request
    src: WorkerLink
    src_blocks: list[int]


@dataclass(eq=False)
class WorkerLink:
    worker_id: str
    address: str
    info: worker_pb2.WorkerInfo
    core: Scheduler
    channel: grpc.aio.Channel
    stub: worker_pb2_grpc.WorkerStub
    # Names this scheduler's session with the worker: plans carry it, and a new one makes the worker drop
    # every sequence it holds (after a reconnect, or a new scheduler).
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex)
    alive: bool = True
    drain: Drain | None = None  # leaving on purpose (worker_drain.py): it takes no new request
    num_steps: int = 0
    last_result_at: float = 0.0  # scheduler clock: when the worker's latest step result came back
    arrivals: deque[Arrival] = field(default_factory=deque)
    # Step ids of the plans committed to the worker (scheduled to be sent) whose results are not back: see
    # plans_done.
    in_flight: deque[int] = field(default_factory=deque)
    _fences: list[tuple[int, anyio.Event]] = field(default_factory=list)
    _wake: anyio.Event = field(default_factory=anyio.Event)

    @classmethod
    def connect(cls, worker_id: str, address: str, info: worker_pb2.WorkerInfo, config: SchedulerConfig) -> WorkerLink:
        block_size = info.kv_layout.block_size
        if info.max_model_len and info.max_model_len != config.max_model_len:
            # Requests move between workers (hand-offs, failures), and a LongRoPE model rotates by the context
            # served: every worker must serve the scheduler's.
            raise ValueError(f"max_model_len {info.max_model_len} is the worker's context and the scheduler's is "
                             f"{config.max_model_len}: start both with the same value")
        # The mesh's clock is real: each core corrects its step-time model from the steps it measures.
        core_config = replace(config, calibrate_step_time=True, sliding_window=info.sliding_window or None,
                              recurrent_state=info.recurrent_state, state_checkpoints=info.state_checkpoints,
                              host_state_checkpoints=info.host_state_checkpoints)
        if info.HasField("step_time"):  # the worker's own step times (services/engine/step_profile.py)
            fit = info.step_time
            core_config = replace(core_config, step_time=StepTimeModel(
                base_s=fit.base_ms / 1e3, per_token_s=fit.per_token_ms / 1e3, per_seq_s=fit.per_seq_ms / 1e3,
                tile_tokens=config.step_time.tile_tokens))
        host = BlockManager(info.num_host_blocks, block_size) if info.num_host_blocks else None
        # Every worker's core hashes with the same seed (model name and block size, not a path that differs
        # between hosts), so a request's block hashes stay valid when it moves between workers.
        device = BlockManager(info.num_device_blocks, block_size, reserve_null=bool(info.sliding_window))
        core = Scheduler(core_config, device, host,
                         hash_seed=hash_seed(Path(info.model).name, block_size))
        channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        return cls(worker_id, address, info, core, channel, worker_pb2_grpc.WorkerStub(channel))

    @property
    def serving(self) -> bool:
        """Whether it takes new requests: alive, and not draining."""
        return self.alive and self.drain is None

    @property
    def role(self) -> str:
        return ROLE_NAMES.get(self.info.role, "hybrid")

    def cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` whose KV this worker's prefix cache holds (cache-aware routing)."""
        bs = self.core.blocks.block_size
        tokens = req.all_token_ids
        hashes = extend_hashes(req.block_hashes, tokens, bs, self.core.seed_of(req))
        # At least one token must run (its logits give the next token), as the core's admission does.
        cached = len(self.core.blocks.cached_prefix(hashes[: (len(tokens) - 1) // bs]))
        if self.core.config.recurrent_state:  # only as far as a state the worker saved (state_checkpoints.py)
            cached = self.core.checkpoints.covered(hashes[:cached])
        return cached * bs

    def endpoint(self) -> common_pb2.KVEndpoint:
        """Where peers read this worker's KV blocks."""
        ep = common_pb2.KVEndpoint(kv_layout=self.info.kv_layout, grpc_address=self.address)
        if self.info.HasField("nixl"):
            ep.agent_name = self.info.nixl.agent_name
            ep.agent_metadata.CopyFrom(self.info.nixl)
        return ep

    def wake(self) -> None:
        self._wake.set()

    async def plans_done(self, upto: int) -> None:
        """Returns once the worker ran every plan it was sent up to step ``upto`` (or the worker is gone).

        The worker runs plans in order, but nothing orders them with writers from outside the step stream: a
        transfer into blocks that a plan still in flight copies out (their previous owner's swap-out) or
        writes (its last decode) waits for that plan first (``upto`` from ``Scheduler.reuse_fence``), or the
        plan would copy the new bytes out as the old owner's KV, or overwrite them."""
        if not self._pending(upto):
            return
        event = anyio.Event()
        self._fences.append((upto, event))
        await event.wait()

    def _pending(self, upto: int) -> bool:
        return self.alive and bool(self.in_flight) and self.in_flight[0] <= upto

    def note_sent(self, step_id: int) -> None:
        self.in_flight.append(step_id)

    def note_done(self, step_id: int) -> None:
        while self.in_flight and self.in_flight[0] <= step_id:
            self.in_flight.popleft()
        self.release_fences()

    def release_fences(self) -> None:
        """Wakes the ``plans_done`` callers whose plans ran, or all of them once the worker is gone."""
        waiting = []
        for upto, event in self._fences:
            if self._pending(upto):
                waiting.append((upto, event))
            else:
                event.set()
        self._fences = waiting

    async def wait_for_work(self) -> None:
        await self._wake.wait()
        self._wake = anyio.Event()
