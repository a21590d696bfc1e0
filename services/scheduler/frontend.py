"""Request intake shared by the gRPC and HTTP front doors: tokenize, validate, submit, stream, abort."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import anyio

from services.common.errors import InvalidArgument, ResourceExhausted, SeawallError, Unavailable
from services.common.sampling_params import FinishReason, SamplingParams
from services.common.step import LoraRef
from services.engine.bad_words import bad_words_token_ids
from services.engine.checkpoint import Checkpoint
from services.engine.grammar import GrammarCompiler
from services.engine.pooling import (
    EMBEDDING_PARAMS,
    check_classifier,
    check_embedding,
    check_generates,
    embedding_vector,
)
from services.scheduler.admission import check_cache_salt, room, validate_request
from services.scheduler.core.request import Request
from services.scheduler.lora_registry import LoraRegistry
from services.scheduler.mesh import Mesh
from services.scheduler.request_trace import RequestTrace
from services.scheduler.tracked import BatchWatch, Delta, TrackedRequest


@dataclass
class Submission:
    """One request of a batch, as ``Frontend.submit`` takes it."""

    prompt_token_ids: Sequence[int]
    params: SamplingParams
    request_id: str = ""
    session_id: str = ""
    priority: int = 0  # lower runs sooner (vLLM's meaning)
    lora: LoraRef | None = None  # the LoRA adapter it runs with (LoraRegistry.resolve); None = the base model
    cache_salt: str = ""  # only requests with the same salt share cached KV (admission.check_cache_salt)


class Frontend:
    def __init__(self, checkpoint: Checkpoint, mesh: Mesh, served_model_names: Sequence[str] = (),
                 max_lora_rank: int = 16) -> None:
        """``served_model_names``: what the ``model`` field may call the base model besides its path, the first
        the name replies give (default: the model directory's name)."""
        self.checkpoint = checkpoint
        self.tokenizer = checkpoint.tokenizer
        self.mesh = mesh
        self.draining = False  # shutting down: requests in flight finish, new ones are refused (main.drain)
        self.model_names = tuple(served_model_names) or (checkpoint.path.name,)
        self.model_name = self.model_names[0]
        self.loras = LoraRegistry(checkpoint.config.lora_shape, max_lora_rank,
                                  (*self.model_names, str(checkpoint.path)))
        # Structured-output specs are compiled here once, so a bad schema is refused before it is queued.
        self.grammars = GrammarCompiler(checkpoint.tokenizer, checkpoint.config.vocab_size, checkpoint.eos_token_ids)

    @property
    def max_model_len(self) -> int:
        return self.checkpoint.config.max_model_len

    def room(self, prompt_len: int) -> int:
        """``admission.room`` over the live workers' pools."""
        links = self.mesh.live_links()
        pool = None
        if links:
            block_size = links[0].info.kv_layout.block_size
            if all(link.core.config.window_blocks(block_size) is None for link in links):
                pool = min(link.core.blocks.num_blocks for link in links) * block_size
        return room(prompt_len, self.max_model_len, pool)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text`` as token ids; ``add_special_tokens``: with those the tokenizer adds (a BOS, for many)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str = "",
               trace_parent=None, session_id: str = "", priority: int = 0, lora: LoraRef | None = None,
               cache_salt: str = "") -> TrackedRequest:
        """Validates and queues a request; raises InvalidArgument or ResourceExhausted."""
        tracked = self._prepare(Submission(prompt_token_ids, params, request_id, session_id, priority, lora,
                                           cache_salt), trace_parent)
        self._enqueue(tracked)
        return tracked

    def submit_many(self, items: Sequence[Submission], trace_parent=None,
                    labels: Sequence[str] | None = None) -> list[TrackedRequest]:
        """Validates every request, then queues them all, or none: a request's error is prefixed with its label
        (default ``requests[i]``; an empty label adds nothing), and requests queued before it are aborted."""
        if not items:
            raise InvalidArgument("the batch is empty: send at least one request")
        labels = labels if labels is not None else [f"requests[{i}]" for i in range(len(items))]
        ids = [item.request_id for item in items if item.request_id]
        if len(set(ids)) < len(ids):
            dup = next(rid for rid in ids if ids.count(rid) > 1)
            raise InvalidArgument(f"request id {dup!r} appears more than once in the batch; ids must be unique")
        self.check_batch_size(len(items))
        limit = self.mesh.config.max_queue_len
        room = limit - self.mesh.num_waiting
        if len(items) > room:
            raise ResourceExhausted(f"a batch of {len(items)} requests does not fit the queue ({room} of {limit} "
                                    "places free); retry later or send smaller batches")
        tracked = [labelled(label, self._prepare, item, trace_parent) for label, item in zip(labels, items, strict=True)]
        for i, (label, t) in enumerate(zip(labels, tracked, strict=True)):
            try:
                labelled(label, self._enqueue, t)
            except SeawallError:
                for queued in tracked[:i]:
                    self.mesh.abort(queued.request_id, FinishReason.ABORT)
                raise
        return tracked

    def check_batch_size(self, count: int) -> None:
        """Refuses a batch that could never be queued whole; callers that fan a request out into ``count``
        requests (OpenAI's ``n``) check before building them: ``n`` of 2**40 would never finish building."""
        limit = self.mesh.config.max_queue_len
        if count > limit:
            raise InvalidArgument(f"a batch of {count} requests can never fit the queue ({limit} places, "
                                  "--max-queue-len): send at most that many at once")

    def validate(self, prompt: Sequence[int], params: SamplingParams, session: bool = False) -> None:
        """Raises InvalidArgument for what the model or the policy cannot run, ResourceExhausted for what no
        worker's pool can hold; ``session``: the request stores its turn (every block counts)."""
        links = self.mesh.live_links()
        pools = [link.core.blocks.num_blocks for link in links]
        block_size = links[0].info.kv_layout.block_size if links else 16
        # A session's turn keeps every block for kvcache (sliding_window.py): its whole context counts.
        session = session and self.mesh.dual_path is not None
        held = [None if session else link.core.config.window_blocks(block_size) for link in links]
        check_generates(self.checkpoint.has_lm_head, params)
        validate_request(prompt, params, self.checkpoint.config.vocab_size, self.max_model_len, block_size,
                         min(pools) if pools else None, self.mesh.config.core.whole_prompt_limit,
                         max(held) if held and None not in held else None)
        self.grammars.validate(params.structured_output, params.free_thought)
        bad_words_token_ids(self.tokenizer, params.bad_words)  # a word no token writes is refused here

    def _prepare(self, item: Submission, trace_parent) -> TrackedRequest:
        if self.draining:
            raise Unavailable("this scheduler is shutting down and finishes only the requests it holds; send the "
                              "request to another replica, or again once it is back")
        prompt = list(item.prompt_token_ids)
        self.validate(prompt, item.params, bool(item.session_id))
        request = Request(item.request_id or f"req-{uuid.uuid4().hex[:16]}", prompt, item.params,
                          arrival_time=anyio.current_time(), eos_token_ids=self.checkpoint.eos_token_ids,
                          priority=item.priority, lora=item.lora, cache_salt=check_cache_salt(item.cache_salt or None),
                          lora_from=self.loras.activation_start(item.lora, prompt))
        tracked = TrackedRequest(request, self.tokenizer, anyio.current_time(), item.session_id)
        tracing = self.mesh.tracing
        if tracing.enabled:
            model = item.lora.name if item.lora is not None else self.model_name
            tracked.trace = RequestTrace(tracing.tracer, request, model, trace_parent)
        return tracked

    def _enqueue(self, tracked: TrackedRequest) -> None:
        try:
            self.mesh.submit(tracked)
        except SeawallError:
            if tracked.trace is not None:
                tracked.trace.finish(tracked.request, FinishReason.ERROR)
            raise

    async def stream(self, tracked: TrackedRequest) -> AsyncIterator[Delta]:
        """Yields what arrived since the last yield, until the request finishes (the last one carries the
        finish reason).

        If the consumer goes away first (client disconnect, cancelled call), the request is aborted, which
        frees its blocks on every worker it touched.
        """
        try:
            while True:
                await tracked.arrived.wait()
                delta = tracked.take()
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            self.abort_unless_done(tracked)

    async def collect(self, tracked: TrackedRequest) -> Delta:
        """All of the request's output, once it finished: one wake-up instead of one per step. If the caller
        goes away first, the request is aborted, as in ``stream``."""
        try:
            await tracked.done.wait()
            return tracked.take()
        finally:
            self.abort_unless_done(tracked)

    async def stream_many(self, tracked: Sequence[TrackedRequest],
                          final_only: Sequence[bool]) -> AsyncIterator[list[tuple[int, Delta]]]:
        """Several requests read as one stream: per wake-up, ``(index, delta)`` for each request that produced
        something since the last yield, until all have finished. ``final_only[i]``: request ``i`` appears once,
        when it finished, with all of its output. If the consumer goes away first, the unfinished ones are
        aborted, as in ``stream``."""
        watch = BatchWatch(tracked, final_only)
        left = len(tracked)
        try:
            while left:
                await watch.changed.wait()
                out = [(i, tracked[i].take()) for i in watch.take()]
                left -= sum(delta.finish_reason is not None for _, delta in out)
                yield out
        finally:
            for t in tracked:
                t.on_arrive = None
                self.abort_unless_done(t)

    def abort_unless_done(self, tracked: TrackedRequest) -> None:
        if not tracked.finished or tracked.request_id in self.mesh.tracked:
            self.mesh.abort(tracked.request_id, FinishReason.ABORT)

    async def embed(self, prompts: Sequence[Sequence[int]], dimensions: int | None = None, trace_parent=None,
                    priority: int = 0, lora: LoraRef | None = None, labels: Sequence[str] | None = None,
                    ) -> list[list[float]]:
        """Each prompt's embedding (pooling.py), cut to ``dimensions``: one request per prompt, queued all or
        none, run as any prompt is (chunked, prefix-cached, on a prefill worker in disaggregated mode). Raises
        the first failed request's error; a caller that goes away aborts the rest."""
        check_embedding(self.checkpoint.pooling, self.checkpoint.config.hidden_size, dimensions)
        pooled = await self._pooled(prompts, trace_parent, priority, lora, labels)
        return [embedding_vector(hidden, self.checkpoint.pooling, dimensions) for hidden in pooled]

    async def classify(self, prompts: Sequence[Sequence[int]], trace_parent=None, priority: int = 0,
                       lora: LoraRef | None = None, labels: Sequence[str] | None = None) -> list[list[float]]:
        """A sequence classifier's logits for each prompt (its classes', pooling.py ``Classifier``), run as
        ``embed`` runs its prompts."""
        check_classifier(self.checkpoint.classifier)
        return await self._pooled(prompts, trace_parent, priority, lora, labels)

    async def _pooled(self, prompts: Sequence[Sequence[int]], trace_parent, priority: int, lora: LoraRef | None,
                      labels: Sequence[str] | None) -> list[list[float]]:
        items = [Submission(p, EMBEDDING_PARAMS, priority=priority, lora=lora) for p in prompts]
        tracked = self.submit_many(items, trace_parent, labels)
        async for done in self.stream_many(tracked, [True] * len(tracked)):
            for i, delta in done:
                if tracked[i].hidden_state is None:  # failed (the others are aborted on the way out) or aborted
                    raise delta.error or SeawallError(f"pooling request {tracked[i].request_id} ended "
                                                      f"({delta.finish_reason}) without a result")
        return [t.hidden_state for t in tracked]

    def queue_delay_ms(self, tracked: TrackedRequest) -> float:
        if tracked.first_scheduled is None:
            return 0.0
        return (tracked.first_scheduled - tracked.arrival) * 1e3


def labelled(label: str, fn, *args):
    """``fn(*args)``, with a SeawallError's message prefixed by ``label`` (which request of a batch it is about)."""
    try:
        return fn(*args)
    except SeawallError as exc:
        if not label:
            raise
        raise type(exc)(f"{label}: {exc}") from exc
