"""The Scheduler gRPC service: Generate (streaming), GenerateBatch, Embed, Classify, BeamSearch, Abort, GetStats,
RegisterWorker, DrainWorker. A shell over the mesh."""

from __future__ import annotations

import math

from seawall.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from services.common import tracing
from services.common.beam_search import beam_params, hypothesis_text
from services.common.convert import finish_reason_to_proto, params_from_proto, token_logprobs_to_proto
from services.common.errors import InvalidArgument, NotFound, SeawallError
from services.common.grpc_server import abort_with
from services.engine.pooling import check_classifier
from services.scheduler.beam_driver import beam_search
from services.scheduler.config import as_flag
from services.scheduler.core.policies.base import chunk_budget
from services.scheduler.core.scheduler import SchedulerConfig, StepTimeModel
from services.scheduler.frontend import Frontend, Submission, labelled
from services.scheduler.mesh import Mesh
from services.scheduler.tracked import Delta, TrackedRequest

_EARLY_STOPPING = {scheduler_pb2.EARLY_STOPPING_UNSPECIFIED: False, scheduler_pb2.EARLY_STOPPING_TRUE: True,
                   scheduler_pb2.EARLY_STOPPING_NEVER: "never"}


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, frontend: Frontend, mesh: Mesh, policy: str, sampling_defaults: dict | None = None) -> None:
        """``sampling_defaults``: the sampling fields a request leaves unset (``generation_defaults``)."""
        self.frontend = frontend
        self.mesh = mesh
        self.policy = policy
        self.sampling_defaults = sampling_defaults or {}

    async def Generate(self, request, context):
        try:
            tracked = self._submit(request, tracing.from_grpc_metadata(context.invocation_metadata()))
        except SeawallError as exc:
            await abort_with(context, exc)
        reply = _Replies(self.frontend, request)
        async for delta in self._deltas(tracked, request.final_only):
            yield reply(tracked, delta)

    async def GenerateBatch(self, request, context):
        try:
            if not request.requests:
                raise InvalidArgument("requests is empty: send at least one GenerateRequest")
            parent = tracing.from_grpc_metadata(context.invocation_metadata())
            items = [labelled(f"requests[{i}]", self._submission, r) for i, r in enumerate(request.requests)]
            tracked = self.frontend.submit_many(items, parent)
        except SeawallError as exc:
            await abort_with(context, exc)
        replies = [_Replies(self.frontend, r) for r in request.requests]
        async for ready in self.frontend.stream_many(tracked, [r.final_only for r in request.requests]):
            yield scheduler_pb2.GenerateBatchResponse(outputs=[
                scheduler_pb2.BatchOutput(index=i, response=replies[i](tracked[i], delta)) for i, delta in ready])

    async def Embed(self, request, context):
        try:
            if not request.inputs:
                raise InvalidArgument("inputs is empty: send at least one text or token_ids")
            lora = self.frontend.loras.resolve(request.model)
            prompts = [labelled(f"inputs[{i}]", self._prompt, x) for i, x in enumerate(request.inputs)]
            vectors = await self.frontend.embed(prompts, request.dimensions or None,
                                                tracing.from_grpc_metadata(context.invocation_metadata()),
                                                request.priority, lora,
                                                [f"inputs[{i}]" for i in range(len(prompts))])
        except SeawallError as exc:
            await abort_with(context, exc)
        return scheduler_pb2.EmbedResponse(embeddings=[scheduler_pb2.EmbedVector(values=v) for v in vectors],
                                           usage=common_pb2.Usage(prompt_tokens=sum(map(len, prompts))))

    async def Classify(self, request, context):
        try:
            if not request.inputs:
                raise InvalidArgument("inputs is empty: send at least one text or token_ids")
            if request.dimensions:
                raise InvalidArgument("dimensions does not apply to classes: leave it 0")
            lora = self.frontend.loras.resolve(request.model)
            classifier = check_classifier(self.frontend.checkpoint.classifier)
            prompts = [labelled(f"inputs[{i}]", self._prompt, x) for i, x in enumerate(request.inputs)]
            logits = await self.frontend.classify(prompts, tracing.from_grpc_metadata(context.invocation_metadata()),
                                                  request.priority, lora, [f"inputs[{i}]" for i in range(len(prompts))])
        except SeawallError as exc:
            await abort_with(context, exc)
        return scheduler_pb2.ClassifyResponse(
            classifications=[scheduler_pb2.Classification(label=classifier.label(row), probs=classifier.scores(row),
                                                          logits=row) for row in logits],
            usage=common_pb2.Usage(prompt_tokens=sum(map(len, prompts))))

    async def BeamSearch(self, request, context):
        try:
            item = self._submission(request.request, beam=True)
            if item.session_id:
                raise InvalidArgument("request.session_id cannot be used with a beam search (it stores no turn): "
                                      "leave it empty")
            self.frontend.validate(item.prompt_token_ids, item.params)
            self.frontend.check_batch_size(request.beam_width)
            length_penalty = request.length_penalty if request.HasField("length_penalty") else 1.0
            beam = beam_params(item.params, request.beam_width, length_penalty,
                               _EARLY_STOPPING[request.early_stopping], self.frontend.checkpoint.eos_token_ids,
                               self.frontend.max_model_len - len(item.prompt_token_ids))
            found = await beam_search(self.frontend, item, beam,
                                      tracing.from_grpc_metadata(context.invocation_metadata()))
        except SeawallError as exc:
            await abort_with(context, exc)
        eos, decode = self.frontend.checkpoint.eos_token_ids, self.frontend.tokenizer.decode
        return scheduler_pb2.BeamSearchResponse(
            hypotheses=[scheduler_pb2.BeamHypothesis(
                token_ids=h.token_ids, text=hypothesis_text(decode, h, item.params, eos),
                finish_reason=finish_reason_to_proto(h.finish_reason), cumulative_logprob=h.logprob, score=h.score)
                for h in found],
            usage=common_pb2.Usage(prompt_tokens=len(item.prompt_token_ids),
                                   completion_tokens=sum(len(h.token_ids) for h in found)))

    async def _deltas(self, tracked, final_only: bool):
        if final_only:
            yield await self.frontend.collect(tracked)
        else:
            async for delta in self.frontend.stream(tracked):
                yield delta

    def _submit(self, request, parent):
        item = self._submission(request)
        return self.frontend.submit(item.prompt_token_ids, item.params, item.request_id, parent, item.session_id,
                                    item.priority, item.lora, item.cache_salt)

    def _prompt(self, request) -> list[int]:
        which = request.WhichOneof("prompt")
        if which is None:
            raise InvalidArgument("set the prompt: text or token_ids")
        return self.frontend.encode(request.text) if which == "text" else list(request.token_ids.ids)

    def _submission(self, request, beam: bool = False) -> Submission:
        lora = self.frontend.loras.resolve(request.model)
        prompt = self._prompt(request)
        # A beam search takes no defaults: it ranks beams by their logprobs, which sampling options would change.
        params = params_from_proto(request.sampling, self.frontend.room(len(prompt)),
                                   None if beam else self.sampling_defaults)
        if params.pooling:  # Generate's responses have no place for a vector
            raise InvalidArgument("sampling.pooling asks for an embedding: call Embed, which returns the vectors")
        return Submission(prompt, params, request.request_id, request.session_id, request.priority, lora,
                          request.cache_salt)

    async def Abort(self, request, context):
        return scheduler_pb2.AbortResponse(found=self.mesh.abort(request.request_id))

    async def GetStats(self, request, context):
        links = sorted(self.mesh.live_links(), key=lambda w: w.worker_id)
        cores = [link.core for link in links]
        levels: list[int] = []
        for core in cores:
            for i, n in enumerate(core.queue_lengths()):
                levels.extend([0] * (i + 1 - len(levels)))
                levels[i] += n
        reply = scheduler_pb2.GetStatsResponse(
            policy=self.policy, queue_lengths=levels or [len(self.mesh.unplaced)],
            num_running=sum(len(c.running) + len(c.arriving) for c in cores),
            num_waiting=self.mesh.num_waiting, num_swapped=sum(len(c.swapped) for c in cores),
            num_preemptions=self.mesh.num_preemptions_gone + sum(sum(c.preemptions.values()) for c in cores),
            num_finished=self.mesh.num_finished, num_steps=sum(link.num_steps for link in links),
            num_migrations=self.mesh.migrator.num_migrations, num_queued_moves=self.mesh.migrator.num_queued_moves,
            num_precopied_blocks=self.mesh.migrator.num_precopied_blocks)
        for link in links:
            blocks, host = link.core.blocks, link.core.host_blocks
            reply.workers.append(scheduler_pb2.WorkerStats(
                worker_id=link.worker_id, address=link.address, role=link.info.role, draining=link.drain is not None,
                num_device_blocks=blocks.num_blocks, num_device_blocks_used=blocks.num_blocks - blocks.num_free,
                num_device_blocks_cached=blocks.num_cached, num_host_blocks=host.num_blocks if host else 0,
                num_host_blocks_used=(host.num_blocks - host.num_free) if host else 0,
                num_running=len(link.core.running),
                num_prefix_queried_blocks=link.core.prefix_stats.queried_blocks,
                num_prefix_hit_blocks=link.core.prefix_stats.hit_blocks,
                num_draft_tokens=link.core.draft_stats.drafted,
                num_accepted_draft_tokens=link.core.draft_stats.kept,
                prompt_token_budget=_budget(link.core.config), step_time=_step_time(link.core.config.step_time),
                kv_layout=link.info.kv_layout))
        return reply

    async def RegisterWorker(self, request, context):
        if not request.address:
            await abort_with(context, InvalidArgument("address is required: the host:port of the Worker service"))
        try:
            link = self.mesh.register(request.address, request.info)
        except ValueError as exc:  # e.g. a TBT target this worker cannot meet even with one token a step
            await abort_with(context, InvalidArgument(f"worker {request.address} cannot serve this scheduler: "
                                                      f"{as_flag(str(exc))}"))
        return scheduler_pb2.RegisterWorkerResponse(worker_id=link.worker_id, scheduler_id=link.epoch)

    async def DrainWorker(self, request, context):
        link = next((w for w in self.mesh.live_links() if w.address == request.address), None)
        if link is None:
            await abort_with(context, NotFound(f"no live worker registered at {request.address!r}: drain the "
                                               "address a worker registered with (its --advertise host and port)"))
        drain = await self.mesh.drains.drain(link)
        return scheduler_pb2.DrainWorkerResponse(num_moved=drain.moved, num_finished=drain.finished)


def _budget(config: SchedulerConfig) -> int:
    budget, _ = chunk_budget(config)
    return 0 if math.isinf(budget) else int(budget)


def _step_time(model: StepTimeModel) -> worker_pb2.StepTimeProfile:
    return worker_pb2.StepTimeProfile(base_ms=model.base_s * 1e3, per_token_ms=model.per_token_s * 1e3,
                                      per_seq_ms=model.per_seq_s * 1e3)


class _Replies:
    """Builds one request's GenerateResponse messages, with what its GenerateRequest asked to have back."""

    def __init__(self, frontend: Frontend, request) -> None:
        self.frontend = frontend
        opts = request.stream_options if request.HasField("stream_options") else None
        self.want_ids = opts is None or opts.return_token_ids
        self.want_text = opts is None or opts.return_text

    def __call__(self, tracked: TrackedRequest, delta: Delta) -> scheduler_pb2.GenerateResponse:
        req = tracked.request
        reply = scheduler_pb2.GenerateResponse(
            request_id=tracked.request_id, finish_reason=finish_reason_to_proto(delta.finish_reason),
            finish_detail=delta.detail, queue_delay_ms=self.frontend.queue_delay_ms(tracked),
            usage=common_pb2.Usage(prompt_tokens=len(req.prompt_token_ids), completion_tokens=len(req.output_token_ids),
                                   cached_prompt_tokens=req.num_prefix_hit_tokens))
        if self.want_ids:
            reply.token_ids.extend(delta.token_ids)
        if self.want_text:
            reply.text = delta.text
        reply.logprobs.extend(token_logprobs_to_proto(t) for t in delta.logprobs)
        reply.prompt_logprobs.extend(token_logprobs_to_proto(t) for t in delta.prompt_logprobs)
        return reply
