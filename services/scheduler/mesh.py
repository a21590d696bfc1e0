"""The step driver: one scheduler core per registered worker, a step loop per worker, and the hand-offs.

Each worker gets a loop: schedule a plan on its core, send it over the worker's step stream, apply the
result, stream tokens to clients. In disaggregated mode a request runs its prompt on a prefill worker; once
the first token is sampled, the request is handed to a decode worker: blocks are reserved there, the decode
worker pulls the KV from the prefill worker's blocks (NIXL, or the gRPC fallback), and decoding continues.

Failures never lose a request: a failed transfer recomputes the prompt on the decode worker; a dead worker's
requests are placed on live workers with the tokens they already produced (``Scheduler.drain``), so their
streams continue without a repeated or missing token.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass

import anyio
import grpc
from opentelemetry import trace

from seawall.v1 import common_pb2, worker_pb2
from services.common import tracing as tr
from services.common.convert import plan_to_proto, result_from_proto
from services.common.errors import InvalidArgument, ResourceExhausted, SeawallError
from services.common.metrics import priority_class
from services.common.rpc import rpc
from services.common.sampling_params import FinishReason
from services.common.step import StepPlan
from services.common.tracing import Tracing
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.dual_path import DualPath
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.migrator import Migrator
from services.scheduler.peer_meeting import meet_peers
from services.scheduler.peer_prefix import PeerPrefix
from services.scheduler.placement import EngineLoad, pick_decode, pick_prefill
from services.scheduler.rebalance import priority_reserve
from services.scheduler.tracked import TrackedRequest
from services.scheduler.worker_drain import WorkerDrains
from services.scheduler.worker_link import Arrival, WorkerLink

log = logging.getLogger(__name__)

# Plans a worker holds at most: the one it runs and one queued behind it.
_PIPELINE_DEPTH = 2


class WorkerLeft(ConnectionError):
    """A worker ended its step stream itself (OK status or end of stream): it stopped, rather than failed."""


@dataclass
class _InFlight:
    plan: StepPlan
    sent: float  # scheduler clock
    traced: list  # (request trace, prompt tokens) of the prompt chunks in the plan
    start_ns: int
    expected: bool  # applied to the core when sent (Scheduler.expect), so the next plan need not wait


class Mesh:
    def __init__(self, config: SchedulerServiceConfig, metrics: SchedulerMetrics | None = None,
                 tracing: Tracing | None = None) -> None:
        self.config = config
        self.metrics = metrics or SchedulerMetrics()
        self.tracing = tracing or Tracing(trace.NoOpTracer())
        self.dual_path: DualPath | None = None  # set when a kvcache service is configured
        self.peer = PeerPrefix(self)
        self.migrator = Migrator(self)
        self.drains = WorkerDrains(self)
        self.decode_for: dict[str, WorkerLink] = {}  # request id -> the decode worker whose cache its prefix came from
        self.links: dict[str, WorkerLink] = {}
        # Failed links whose channels are closing: close() closes them too, should the mesh stop first (a
        # channel left open fires its poller into a loop that ended).
        self._closing: dict[int, WorkerLink] = {}
        self.tracked: dict[str, TrackedRequest] = {}
        self.where: dict[str, WorkerLink] = {}  # the core each live request is in (absent while arriving)
        self.unplaced: deque[Request] = deque()  # submitted before any worker registered
        self.num_finished = 0
        self.num_preemptions_gone = 0  # preemptions counted by cores of workers that died
        self._ids = itertools.count()
        self._tg: anyio.abc.TaskGroup | None = None
        self._depth = 1 if config.step_pipelining == "off" else _PIPELINE_DEPTH

    async def run(self) -> None:
        """Drives every worker until cancelled from outside. A task group that ends by itself was cancelled by
        one of its tasks raising a stray CancelledError (services/common/rpc.py has how gRPC does that): no
        worker is driven any more, so the process stops instead of answering every call with an error."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await anyio.sleep_forever()
        raise RuntimeError("the mesh's task group ended by itself (a task raised a stray CancelledError): no "
                           "worker is driven any more")

    async def close(self) -> None:
        for link in [*self.links.values(), *self._closing.values()]:
            await link.channel.close()

    def spawn(self, fn, *args) -> None:
        """Runs ``fn(*args)`` in the mesh's task group (a transfer, a copy ahead)."""
        self._tg.start_soon(fn, *args)

    # --- workers ---

    def register(self, address: str, info: worker_pb2.WorkerInfo) -> WorkerLink:
        for old in [link for link in self.links.values() if link.address == address]:
            self._fail(old, "re-registered (restarted)")
        link = WorkerLink.connect(f"worker-{next(self._ids)}", address, info, self.config.core)
        self.links[link.worker_id] = link
        log.info("worker %s (%s) joined at %s with %d blocks", link.worker_id, link.role, address,
                 info.num_device_blocks)
        self._tg.start_soon(self._drive, link)
        if self.config.kv_transport == "nixl" and self.config.peer_meeting:
            self._tg.start_soon(meet_peers, link, self.live_links(), self.config.transfer_timeout_s,
                                self.dual_path.client if self.dual_path is not None else None)
        while self.unplaced:
            self.place(self.unplaced.popleft())
        return link

    def live_links(self, *roles: str) -> list[WorkerLink]:
        return [link for link in self.links.values() if link.alive and (not roles or link.role in roles)]

    def serving_links(self, *roles: str) -> list[WorkerLink]:
        """The live workers that take new requests (not draining), of ``roles`` (none: all)."""
        return [link for link in self.live_links(*roles) if link.serving]

    # --- requests ---

    def submit(self, tracked: TrackedRequest) -> None:
        rid = tracked.request_id
        if rid in self.tracked:
            raise InvalidArgument(f"request id {rid!r} is already in use by a live request; choose another")
        if self.num_waiting >= self.config.max_queue_len:
            raise ResourceExhausted(f"{self.num_waiting} requests are queued (the limit is "
                                    f"{self.config.max_queue_len}); retry later")
        self.tracked[rid] = tracked
        req = tracked.request
        # A request scoring its prompt computes all of it: no prefix from kvcache (nor, then, a turn to store).
        if self.dual_path is not None and self.live_links() and req.params.prompt_logprobs is None:
            if tracked.session_id:
                req.hold_blocks_on_finish = True  # its KV is stored for the session's next turn
            self._tg.start_soon(self.dual_path.admit, req)
            return
        link = self.pick_prompt_worker(req)
        if link is None:
            self.unplaced.append(req)
        elif req.params.prompt_logprobs is None and self.peer.holder(req, link) is not None:
            self._tg.start_soon(self._admit_with_peer_prefix, req, link)
        else:
            self.place_on(link, req)

    async def _admit_with_peer_prefix(self, req: Request, link: WorkerLink) -> None:
        """Places ``req`` on ``link`` with the prefix a decode worker caches (peer_prefix.py)."""
        if req.request_id not in self.tracked:
            return  # aborted before this task ran
        if not link.serving:
            self.place(req)
        elif not await self.peer.admit(req, link):
            self.place_on(link, req)

    def abort(self, request_id: str, reason: str = FinishReason.ABORT, error: SeawallError | None = None) -> bool:
        """Ends a request wherever it is (queued, running, its KV in flight) and frees what it holds. ``error``:
        it failed (finish reason "error"), and its client is told why."""
        tracked = self.tracked.get(request_id)
        if tracked is None:
            return False
        link = self.where.pop(request_id, None)
        if link is not None:
            link.core.finish(request_id, reason)
            link.wake()  # the next plan tells the worker to drop the sequence
        for dst in self.links.values():
            for arrival in [a for a in dst.arrivals if a.request.request_id == request_id]:
                dst.arrivals.remove(arrival)
                self._release_source(arrival)
        self.unplaced = deque(r for r in self.unplaced if r.request_id != request_id)
        if error is not None:
            tracked.fail(error)
        else:
            tracked.end(reason)
        self._forget(request_id)
        return True

    @property
    def num_waiting(self) -> int:
        return len(self.unplaced) + sum(len(link.core.waiting) for link in self.live_links())

    def pick_prompt_worker(self, req: Request) -> WorkerLink | None:
        """The worker to run ``req``'s prompt, by token load (``placement.pick_prefill``): the fewest tokens of
        unfinished requests, less what its prefix cache holds of this prompt, preferring nodes whose storage
        reads drain soon. No token cap (the paper's β): a request is queued on a worker at once, there is no
        shared queue a later fetch would take it from."""
        roles = ("prefill",) if self.config.mode == "disaggregated" and self.serving_links("prefill") else ()
        links = {link.worker_id: link for link in self.serving_links(*roles)}
        if len(links) == 1:  # nothing to weigh; a load sums every request the worker holds
            return next(iter(links.values()))
        pick = pick_prefill([self.engine_load(link, req) for link in links.values()])
        return links[pick.name] if pick is not None else None

    def pick_decode_worker(self, req: Request, roles: tuple[str, ...] = ("decode", "hybrid")) -> WorkerLink | None:
        """The worker to decode ``req``, by token load (``placement.pick_decode``); when none has room for it
        now, the one with the fewest tokens (the request waits there for blocks)."""
        links = {link.worker_id: link for link in self.serving_links(*roles)}
        if not links:
            return None
        loads = [self.engine_load(link) for link in links.values()]
        pick = pick_decode(loads, req.num_tokens) or min(loads, key=lambda e: e.tokens)
        return links[pick.name]

    def engine_load(self, link: WorkerLink, req: Request | None = None) -> EngineLoad:
        """``link`` as placement sees it: its requests (queued, running, arriving, being admitted to it) and its
        node's storage reads; with ``req``, also how much of that prompt its prefix cache holds."""
        bound = [a.request for a in link.arrivals]
        reqs = [*link.core.requests.values(), *bound]
        # Tokens kept for its high-priority requests count as used (Llumnix's virtual usage, --priority-headroom).
        tokens = sum(r.num_tokens for r in reqs) + priority_reserve(link.core, bound, self.config.priority_headroom)
        queued, queued_s = 0, None
        if self.dual_path is not None:
            tokens += self.dual_path.admitting_tokens(link)
            meter = self.dual_path.reads.get(link.worker_id)
            if meter is not None:
                queued, queued_s = meter.queued, meter.queue_s(anyio.current_time())
        return EngineLoad(link.worker_id, tokens, seqs=len(reqs), read_queue=queued, read_queue_s=queued_s,
                          free_tokens=link.core.blocks.num_free * link.core.blocks.block_size,
                          cached_tokens=link.cached_prefix_tokens(req) if req is not None else 0)

    def place(self, req: Request) -> None:
        """Queues a request on the best worker for its prompt, or until one registers."""
        link = self.pick_prompt_worker(req)
        if link is None:
            self.unplaced.append(req)
        else:
            self.place_on(link, req)

    def place_on(self, link: WorkerLink, req: Request) -> None:
        log.debug("placing %s (%d tokens) on %s", req.request_id, req.num_tokens, link.worker_id)
        link.core.add(req)
        self.where[req.request_id] = link
        link.wake()

    @property
    def transport(self) -> int:
        return common_pb2.KV_TRANSPORT_GRPC if self.config.kv_transport == "grpc" else common_pb2.KV_TRANSPORT_NIXL

    def trace_metadata(self, req: Request) -> tuple:
        tracked = self.tracked.get(req.request_id)
        if tracked is None or tracked.trace is None:
            return ()
        return tr.to_grpc_metadata(tracked.trace.context)

    def _forget(self, request_id: str) -> None:
        tracked = self.tracked.pop(request_id, None)
        if tracked is not None:
            m = self.metrics.requests
            m.finished.labels(tracked.finish_reason or "abort").inc()
            if not tracked.request.params.pooling:  # an embedding's one "token" stands in for its vector
                m.request_prompt_tokens.observe(len(tracked.request.prompt_token_ids))
                m.request_generation_tokens.observe(tracked.num_emitted)
            if tracked.trace is not None:
                tracked.trace.finish(tracked.request, tracked.finish_reason)
        self.where.pop(request_id, None)
        self.decode_for.pop(request_id, None)
        self.num_finished += 1

    # --- the step loop ---

    async def _drive(self, link: WorkerLink) -> None:
        """Plans steps for ``link`` and applies their results, in order.

        Each plan is applied to the core as it is sent (``Scheduler.expect``: its tokens count as computed,
        tokens it samples are pending), and the next plan is sent right behind it, so the worker finds its
        next step waiting when it finishes one, without a round trip to the scheduler. At most two plans
        are in flight. Results fill the pending tokens in and stream them; a request that stopped has one
        wasted decode in the plan behind, whose sample is discarded. A prefill worker's sampling plan is
        the exception: its token hands the request off, so the next plan waits for it.
        """
        call = link.stub.StepStream()
        # A worker that dies while idle ends the stream with no read pending: wake the loop to notice it.
        call.add_done_callback(lambda _: link.wake())
        in_flight: deque[_InFlight] = deque()
        try:
            while link.alive:
                if link.drain is not None and self.drains.step(link):
                    break  # drained and retired
                if call.done() and not in_flight:
                    code = await call.code()
                    if code == grpc.StatusCode.OK:
                        raise WorkerLeft("it closed its step stream")
                    raise ConnectionError(f"the worker's step stream ended ({code})")
                if not in_flight or (len(in_flight) < self._depth and in_flight[-1].expected):
                    self._place_arrivals(link)
                    plan = link.core.schedule(now=anyio.current_time())
                    if link.core.preempted_in_plan:
                        self._log_preemptions(link)
                    if plan.num_scheduled_tokens or plan.finished or plan.swap_out or plan.swap_in or plan.copy:
                        link.note_sent(plan.step_id)  # before any await: blocks it freed are free from now on
                        in_flight.append(await self._send(link, call, plan, pipelined=bool(in_flight)))
                        continue
                    if not in_flight:
                        await self._idle(link)
                        continue
                with anyio.fail_after(self.config.step_timeout_s):
                    msg = await rpc(call.read())
                if msg is grpc.aio.EOF:
                    raise WorkerLeft("it closed its step stream")
                self._finish_step(link, in_flight.popleft(), msg)
        except (grpc.aio.AioRpcError, ConnectionError, TimeoutError, InvalidArgument) as exc:
            # InvalidArgument: a result that does not parse (result_from_proto); the worker is not trusted.
            self._fail(link, str(exc.details() if isinstance(exc, grpc.aio.AioRpcError) else exc),
                       left=isinstance(exc, WorkerLeft))
        finally:
            call.cancel()

    def _log_preemptions(self, link: WorkerLink) -> None:
        """A preemption costs its request a swap or a recompute: worth a line in the log, with what might
        have avoided it (the blocks free, a move off or onto this worker under way)."""
        core, migrator = link.core, self.migrator
        moving = [rid for rid, pair in (*migrator.moves.items(), *migrator.precopies.items()) if link in pair]
        log.info("worker %s preempted %s (%d of %d blocks free, %d running, %d swapped; moving: %s)",
                 link.worker_id, ", ".join(sorted(core.preempted_in_plan)), core.blocks.num_free,
                 core.blocks.num_blocks, len(core.running), len(core.swapped), ", ".join(sorted(moving)) or "none")

    async def _idle(self, link: WorkerLink) -> None:
        """Sleeps until ``link``'s core may have something to plan (a request, a transfer or a store ended).
        A core holding requests while it plans nothing waits on something outside its steps (a load, a
        hand-off, a store holding blocks), which ends within the transfer timeout; one that waits longer is
        logged with what it holds, every ``stall_warning_s`` while it lasts: a core that can never plan again
        would otherwise leave its streams hanging without a word (bench/README.md has such a deadlock)."""
        with anyio.move_on_after(self.config.stall_warning_s) as idle:
            await link.wait_for_work()
        core = link.core
        if idle.cancelled_caught and core.requests:
            held = sum(len(ids) for ids in core.handed_off.values())
            log.warning("worker %s planned nothing for %g s while holding %d running, %d waiting, %d swapped and "
                        "%d arriving requests (%d of %d blocks free, %d held for transfers out)", link.worker_id,
                        self.config.stall_warning_s, len(core.running), len(core.waiting), len(core.swapped),
                        len(core.arriving), core.blocks.num_free, core.blocks.num_blocks, held)
            self.metrics.stalls.labels(link.worker_id).inc()

    async def _send(self, link: WorkerLink, call, plan: StepPlan, pipelined: bool) -> _InFlight:
        # A prefill worker's sampled token hands the request off, so its core must not plan a decode after it.
        hands_off = link.role == "prefill" and self.config.mode == "disaggregated"
        ahead = "off" if hands_off else self._plans_ahead()
        # A speculative plan's result decides how many tokens it computed: the next plan waits for it. So does
        # the plan after a decode when the core would speculate next (a decode with a token in flight cannot).
        expected = self._depth > 1 and not plan.speculative and (
            ahead == "all" or not link.core.samples(plan)
            or (ahead == "prompts" and not link.core.samples_a_decode(plan))) and not (
            link.core.speculation_due and link.core.samples_a_decode(plan))
        step = _InFlight(plan, self._note_started(plan), self._traced_chunks(link, plan), time.time_ns(), expected)
        with anyio.fail_after(self.config.step_timeout_s):
            await rpc(call.write(self._plan_message(link, plan)))
        if pipelined:
            self.metrics.pipelined_steps.labels(link.worker_id).inc()
        if expected:
            link.core.expect(plan)
        return step

    def _plans_ahead(self) -> str:
        """The effective ``--step-pipelining``: behind which plans the next one is sent at once. "all":
        every plan; "prompts": plans whose samples are first tokens of prompts, not decodes; "known": plans
        that sample nothing; "off": none. "auto" is "all" on every device (config.py says why). With
        speculative decoding, not behind a decode while the core would speculate next (``_send``)."""
        setting = self.config.step_pipelining
        return "all" if setting == "auto" else setting

    def _finish_step(self, link: WorkerLink, step: _InFlight, msg) -> None:
        link.num_steps += 1
        now = anyio.current_time()
        # A plan queued behind another started when that one's result came back, not when it was sent.
        self._observe_step(link, step.plan, now - max(step.sent, link.last_result_at))
        link.last_result_at = now
        for trace_, n in step.traced:
            trace_.prefill_chunk(step.start_ns, time.time_ns(), link.worker_id, step.plan.step_id, n)
        result = result_from_proto(msg)
        link.note_done(step.plan.step_id)
        if result.num_draft_tokens:
            self.metrics.draft_tokens.labels(link.worker_id).inc(result.num_draft_tokens)
            self.metrics.accepted_tokens.labels(link.worker_id).inc(result.num_accepted_tokens)
        for rid, (start, tokens) in result.prompt_logprobs.items():  # before the first token that ends them
            tracked = self.tracked.get(rid)
            if tracked is not None:
                tracked.add_prompt_logprobs(start, tokens)
        for rid, hidden in result.embeddings.items():  # before the stand-in token that ends them
            tracked = self.tracked.get(rid)
            if tracked is not None:
                tracked.hidden_state = hidden
        self._dispatch(link, link.core.on_result(step.plan, result), now)
        for rid, error in result.errors.items():
            if self.where.get(rid) is link:  # else it ended meanwhile (or this is a plan sent before it failed)
                self.abort(rid, error=error)
        self.migrator.after_step(link)

    def _plan_message(self, link: WorkerLink, plan: StepPlan):
        msg = plan_to_proto(plan, link.epoch)
        if self.tracing.enabled:
            # The worker's spans for a sequence join its request's trace.
            for seq in msg.new_sequences:
                tracked = self.tracked.get(seq.seq_id)
                if tracked is not None and tracked.trace is not None:
                    seq.trace_context.update(tr.inject(tracked.trace.context))
        return msg

    def _traced_chunks(self, link: WorkerLink, plan: StepPlan) -> list:
        """The traces of requests running prompt tokens in this plan, and how many (before the result)."""
        if not self.tracing.enabled:
            return []
        out = []
        swapped_in = {c.seq_id for c in plan.continuing if c.block_ids is not None}
        for rid, n in plan.num_scheduled_tokens.items():
            tracked = self.tracked.get(rid)
            if tracked is None or tracked.trace is None:
                continue
            req = tracked.request
            # A request preempted since it last ran resumes now: by a swap-in, or recomputing from scratch.
            tracked.trace.preempted(req, "swap" if rid in swapped_in else "recompute")
            if req.num_computed_tokens < len(req.prompt_token_ids):
                out.append((tracked.trace, n))
        return out

    def _note_started(self, plan: StepPlan) -> float:
        now = anyio.current_time()
        for rid in plan.num_scheduled_tokens:
            tracked = self.tracked.get(rid)
            if tracked is not None and tracked.first_scheduled is None:
                tracked.first_scheduled = now
                self.metrics.requests.queue.labels(priority_class(tracked.request.priority)).observe(
                    now - tracked.arrival)
                if tracked.trace is not None:
                    tracked.trace.started()
        return now

    def _observe_step(self, link: WorkerLink, plan: StepPlan, seconds: float) -> None:
        steps = self.metrics.steps
        steps.step_seconds.labels(link.worker_id).observe(seconds)
        steps.step_tokens.labels(link.worker_id).observe(plan.total_tokens)
        # What computing a prefix costs there (a speculative plan's count holds drafts the worker may not run).
        if self.dual_path is not None and plan.num_passes == 1 and not plan.speculative:
            self.dual_path.steps[link.worker_id].step(plan.total_tokens, seconds)
        block_bytes = link.info.kv_layout.bytes_per_block
        if plan.swap_out:
            steps.swap_bytes.labels(link.worker_id, "out").inc(len(plan.swap_out) * block_bytes)
        if plan.swap_in:
            steps.swap_bytes.labels(link.worker_id, "in").inc(len(plan.swap_in) * block_bytes)

    def _dispatch(self, link: WorkerLink, events, now: float) -> None:
        """Streams a result's tokens; ``now`` is when it arrived (every token in it arrived then)."""
        generated = 0  # counted once per result: a counter's lock per token is a visible share of a short step
        for event in events:
            tracked = self.tracked.get(event.request_id)
            if tracked is None:
                continue
            emitted = tracked.num_emitted
            reason = tracked.emit(event.token, event.finish_reason)
            if not tracked.request.params.pooling:
                generated += tracked.num_emitted - emitted
            self._observe_token(tracked, reason, now)
            if reason is not None:
                if link.drain is not None:
                    link.drain.finished += 1
                if event.finish_reason is None:  # a stop string, seen only in the text
                    link.core.finish(event.request_id, reason, num_outputs=tracked.num_emitted)
                if event.request_id in link.core.handed_off and self.dual_path is not None:
                    self._tg.start_soon(self.dual_path.store, link, tracked.request, tracked.session_id,
                                        self.trace_metadata(tracked.request))
                self._forget(event.request_id)
            elif (link.role == "prefill" and self.config.mode == "disaggregated"
                  and self.where.get(event.request_id) is link and event.request_id in link.core.requests):
                # Once, though a multi-step result may hold several tokens; and not when a later token of
                # the same result already ended the request in the core.
                self.hand_off(link, tracked.request)
        self.metrics.requests.generation_tokens.inc(generated)

    def _observe_token(self, tracked: TrackedRequest, reason: str | None, now: float) -> None:
        m = self.metrics.requests
        if tracked.last_token_at is None:
            m.ttft.labels(priority_class(tracked.request.priority)).observe(now - tracked.arrival)
            if not tracked.request.params.pooling:
                m.prompt_tokens.inc(len(tracked.request.prompt_token_ids))
        else:
            m.tbt.observe(now - tracked.last_token_at)
        tracked.last_token_at = now
        if reason is not None:
            m.e2e.labels(priority_class(tracked.request.priority)).observe(now - tracked.arrival)
        if tracked.trace is not None:
            tracked.trace.token(len(tracked.request.output_token_ids))

    # --- disaggregated hand-off ---

    def hand_off(self, src: WorkerLink, req: Request, dst: WorkerLink | None = None) -> None:
        """Moves running ``req`` from ``src`` to ``dst`` (None: its decode worker), which pulls its KV: a
        prompt's first token on a prefill worker, or a migration (migrator.py)."""
        if dst is None:
            # A DE-read staged the prefix on a decode worker: that one takes the request over.
            dst = self.decode_for.pop(req.request_id, None)
        if dst is None or not dst.serving:
            dst = self.pick_decode_worker(req)
        if dst is None:
            return  # no decode worker is alive: the request keeps decoding where it is
        log.debug("handing %s (%d tokens) off from %s to %s", req.request_id, req.num_tokens, src.worker_id,
                  dst.worker_id)
        held = src.core.hand_off(req.request_id)
        self.where.pop(req.request_id, None)
        dst.arrivals.append(Arrival(req, src, held))
        dst.wake()

    def _place_arrivals(self, link: WorkerLink) -> None:
        while link.arrivals:
            arrival = link.arrivals[0]
            req = arrival.request
            if not arrival.src.alive:  # its KV died with the prefill worker: recompute here
                link.arrivals.popleft()
                req.reset_for_recompute()
                if self._count_move(req, f"{arrival.src.worker_id} failed holding its KV"):
                    link.core.add(req)
                    self.where[req.request_id] = link
                continue
            dst_blocks = link.core.reserve_arrival(req)
            if dst_blocks is None:
                return  # no room yet: retried after the next step frees blocks
            link.arrivals.popleft()
            self.where[req.request_id] = link
            # The receiver caches the whole prefix already (a recurrent model's state must still come).
            if req.num_cached_blocks >= len(dst_blocks) and not link.core.config.recurrent_state:
                self._release_source(arrival)
                link.core.arrive(req.request_id)
                self.migrator.landed(req.request_id)
                continue
            self._tg.start_soon(self._transfer, arrival, link, dst_blocks)

    async def _transfer(self, arrival: Arrival, dst: WorkerLink, dst_blocks: list[int]) -> None:
        rid = arrival.request.request_id
        skip = arrival.request.num_cached_blocks  # leading blocks the receiver already caches
        # Their previous owners are done with the blocks on the worker before the pull writes them.
        await dst.plans_done(dst.core.reuse_fence(dst_blocks[skip:]))
        request = worker_pb2.PullKVRequest(
            transfer_id=f"{rid}/{next(self._ids)}", src=arrival.src.endpoint(),
            src_block_ids=arrival.src_blocks[skip: len(dst_blocks)], dst_block_ids=dst_blocks[skip:],
            timeout_ms=int(self.config.transfer_timeout_s * 1e3), transport=self.transport,
            # A recurrent model's sequence needs its state too, which its blocks do not hold.
            state_seq_id=rid if dst.core.config.recurrent_state else "")
        error = "timed out"
        started = anyio.current_time()
        tracked = self.tracked.get(rid)
        span = (tracked.trace.transfer(dst.worker_id, self.config.kv_transport, len(dst_blocks))
                if tracked is not None and tracked.trace is not None else trace.INVALID_SPAN)
        try:
            with anyio.move_on_after(self.config.transfer_timeout_s + 5):
                reply = await rpc(dst.stub.PullKV(request, metadata=tr.to_grpc_metadata(tr.span_context(span))))
                span.set_attributes({tr.KV_BYTES: reply.bytes, tr.KV_STATUS: reply.status,
                                     tr.KV_GBPS: reply.bytes / max(reply.duration_ms, 1e-3) / 1e6})
                error = "" if reply.status == common_pb2.TRANSFER_STATUS_DONE else reply.error or "failed"
                self.metrics.transfers.bytes.labels(self.config.kv_transport, "done" if not error else "failed").inc(
                    reply.bytes)
        except grpc.aio.AioRpcError as exc:
            error = exc.details() or str(exc.code())
        finally:
            self._release_source(arrival)
            self.metrics.transfers.seconds.labels(self.config.kv_transport).observe(anyio.current_time() - started)
            span.end()
        if not dst.alive:
            return  # the receiver died: its requests were placed elsewhere
        if dst.core.arriving.get(rid) is not arrival.request:  # aborted meanwhile: the pull was the last writer
            dst.core.release_landing(arrival.request)
            dst.wake()
            return
        if error:
            log.warning("KV transfer of %s failed (%s): recomputing on %s", rid, error, dst.worker_id)
            dst.core.cancel_arrival(rid)
            if not arrival.src.alive:  # the source died under the pull: a move like any off a failed worker
                self._count_move(arrival.request, f"{arrival.src.worker_id} failed sending its KV")
        else:
            dst.core.arrive(rid)
            self.migrator.landed(rid)
        dst.wake()

    def _release_source(self, arrival: Arrival) -> None:
        src, rid = arrival.src, arrival.request.request_id
        if src.alive and rid in src.core.handed_off:
            src.core.release_handed_off(rid)
            src.wake()

    # --- workers leaving ---

    def retire(self, link: WorkerLink) -> None:
        """Forgets a drained worker (worker_drain.py): it holds nothing the mesh needs any more."""
        self._remove(link)
        log.info("worker %s at %s drained and left: %d requests moved, %d finished there", link.worker_id,
                 link.address, link.drain.moved, link.drain.finished)

    def _remove(self, link: WorkerLink) -> None:
        link.alive = False
        link.release_fences()
        self.links.pop(link.worker_id, None)
        self.num_preemptions_gone += sum(link.core.preemptions.values())
        self._closing[id(link)] = link
        self._tg.start_soon(self._close_channel, link)
        if link.drain is not None:
            link.drain.done.set()

    def _fail(self, link: WorkerLink, why: str, left: bool = False) -> None:
        """Drops ``link`` and places what it held elsewhere. ``left``: the worker ended its stream itself (it was
        stopped without a drain): no failure when it held nothing, as when a whole mesh stops."""
        if not link.alive:
            return
        self._remove(link)
        orphans = link.core.drain()
        for arrival in link.arrivals:
            self._release_source(arrival)
            arrival.request.reset_for_recompute()
            orphans.append(arrival.request)
        link.arrivals.clear()
        if left and not orphans:
            log.info("worker %s at %s left (%s) holding no request", link.worker_id, link.address, why)
            return
        log.warning("worker %s at %s failed (%s): moving its requests to live workers", link.worker_id,
                    link.address, why)
        self.metrics.worker_failures.labels(link.role).inc()
        for req in orphans:
            self.where.pop(req.request_id, None)
            if self._count_move(req, why):
                self.place(req)

    async def _close_channel(self, link: WorkerLink) -> None:
        await link.channel.close()
        del self._closing[id(link)]

    def _count_move(self, req: Request, why: str) -> bool:
        """Counts ``req`` as moved off a worker that failed holding it or its KV, to be recomputed elsewhere;
        False when it is gone: aborted, or ended with an error past ``max_moves``."""
        tracked = self.tracked.get(req.request_id)
        if tracked is None:
            return False
        tracked.moves += 1
        if tracked.moves > self.config.max_moves:
            self.abort(req.request_id, error=SeawallError(
                f"the request was on {tracked.moves} workers that failed while running it, the last with: {why}; "
                f"it is not moved again (--max-moves {self.config.max_moves})"))
            return False
        self.metrics.requests_moved.inc()
        return True
