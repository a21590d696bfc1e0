"""``OfflineEngine``: continuous batching with chunked prefill in one process.

Drives the same scheduler core the live scheduler service uses, with a ``ModelRunner`` in place of a remote
worker, and detokenizes outputs (stop strings are matched on text, so they end requests here).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from services.common.beam_search import BeamParams, BeamSearch, Hypothesis, beam_step_params
from services.common.block_hash import hash_seed
from services.common.errors import InvalidArgument, ResourceExhausted, SeawallError
from services.common.lora import activation_start, read_lora
from services.common.sampling_params import FinishReason, SamplingParams, text_left_out
from services.common.step import LoraRef, SampledToken, merge_prompt_scores
from services.engine.bad_words import bad_words_token_ids
from services.engine.config import EngineConfig
from services.engine.detokenizer import IncrementalDetokenizer
from services.engine.pooling import (
    EMBEDDING_PARAMS,
    check_classifier,
    check_embedding,
    check_generates,
    embedding_vector,
)
from services.engine.runner import ModelRunner
from services.scheduler.admission import validate_request
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.request import Request
from services.scheduler.core.scheduler import Scheduler, SchedulerConfig


@dataclass
class Completion:
    """One finished request."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: SeawallError | None = None  # with finish_reason "error": what went wrong
    logprobs: list[SampledToken] = field(default_factory=list)
    # With SamplingParams.prompt_logprobs: prompt positions 1, 2, ... scored.
    prompt_logprobs: list[SampledToken] = field(default_factory=list)
    num_preemptions: int = 0
    num_cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    # An embedding request's (SamplingParams.pooling) last hidden state, as the worker returned it.
    hidden_state: list[float] | None = None


class OfflineEngine:
    def __init__(self, engine_config: EngineConfig, scheduler_config: SchedulerConfig | None = None) -> None:
        self.runner = ModelRunner(engine_config)
        self.checkpoint = self.runner.checkpoint
        self.tokenizer = self.checkpoint.tokenizer
        window = self.checkpoint.config.uniform_window
        config = replace(scheduler_config or SchedulerConfig(), max_model_len=self.runner.max_model_len,
                         sliding_window=window, recurrent_state=self.checkpoint.config.recurrent,
                         state_checkpoints=self.runner.state_checkpoints,
                         host_state_checkpoints=self.runner.host_state_checkpoints)
        self.blocks = BlockManager(self.runner.kv.num_blocks, engine_config.block_size, reserve_null=window is not None)
        num_host = self.runner.kv.num_host_blocks
        self.host_blocks = BlockManager(num_host, engine_config.block_size) if num_host else None
        seed = hash_seed(str(self.checkpoint.path), engine_config.block_size)
        self.scheduler = Scheduler(config, self.blocks, self.host_blocks, hash_seed=seed)
        self._ids = itertools.count()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text`` as token ids; ``add_special_tokens``: with those the tokenizer adds (a BOS, for many)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raises InvalidArgument for what the model or the policy cannot run, ResourceExhausted for what the pool
        cannot hold (the scheduler service's checks, services/scheduler/admission.py)."""
        config = self.scheduler.config
        check_generates(self.checkpoint.has_lm_head, params)
        validate_request(prompt_token_ids, params, self.checkpoint.config.vocab_size, config.max_model_len,
                         self.blocks.block_size, self.blocks.num_blocks, config.whole_prompt_limit,
                         config.window_blocks(self.blocks.block_size))
        self.runner.grammars.validate(params.structured_output, params.free_thought)
        bad_words_token_ids(self.tokenizer, params.bad_words)

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                 loras: Sequence[LoraRef | None] | None = None,
                 cache_salts: Sequence[str] | None = None) -> list[Completion]:
        """Runs all prompts together to completion, each with its LoRA adapter (``loras``; None: the base
        model) and cache salt (``cache_salts``; "": none); validate them first."""
        loras = loras if loras is not None else [None] * len(prompts)
        cache_salts = cache_salts if cache_salts is not None else [""] * len(prompts)
        done: dict[str, Completion] = {}
        detoks: dict[str, IncrementalDetokenizer] = {}
        reqs: dict[str, Request] = {}
        order = []
        invocations: dict[LoraRef, tuple[int, ...]] = {}  # each adapter's config read once
        for prompt, p, lora, salt in zip(prompts, params, loras, cache_salts, strict=True):
            rid = f"req-{next(self._ids)}"
            order.append(rid)
            done[rid] = Completion(rid, list(prompt))
            detoks[rid] = IncrementalDetokenizer(self.tokenizer, p, prompt_token_ids=prompt)
            reqs[rid] = Request(rid, list(prompt), p, arrival_time=0.0, eos_token_ids=self.checkpoint.eos_token_ids,
                                lora=lora, cache_salt=salt,
                                lora_from=self._activation_start(lora, prompt, invocations))
            self.scheduler.add(reqs[rid])
        idle_steps = 0
        while self.scheduler.has_work:
            plan = self.scheduler.schedule()
            result = self.runner.execute(plan)  # even an empty plan carries drops and swaps
            for rid, (start, tokens) in result.prompt_logprobs.items():
                merge_prompt_scores(done[rid].prompt_logprobs, start, tokens)
            for rid, hidden in result.embeddings.items():
                done[rid].hidden_state = hidden
            for event in self.scheduler.on_result(plan, result):
                self._apply(event, reqs[event.request_id], done[event.request_id], detoks[event.request_id])
            for rid, error in result.errors.items():
                self._fail(done[rid], error)
            idle_steps = 0 if plan.num_scheduled_tokens else idle_steps + 1
            if idle_steps and not self.scheduler.running and self.scheduler.waiting:
                # Nothing fits and nothing runs: the head request can never be scheduled.
                self._fail(done[self.scheduler.waiting[0].request_id],
                           ResourceExhausted("the request does not fit the KV pool beside the others"))
            # The core always makes progress within a step or two (a swap-in, then its run); more idle
            # steps in a row mean a scheduling bug, which must not hang the caller.
            assert idle_steps < 8, f"scheduler made no progress in {idle_steps} steps: {self.scheduler.running}"
        for rid, comp in done.items():
            comp.text = detoks[rid].text
            comp.num_preemptions = reqs[rid].num_preemptions
            comp.num_cached_prompt_tokens = reqs[rid].num_prefix_hit_tokens
        return [done[rid] for rid in order]

    def beam_search(self, prompt: Sequence[int], beam: BeamParams, lora: LoraRef | None = None,
                    cache_salt: str = "") -> list[Hypothesis]:
        """The beam search of ``prompt`` (services/common/beam_search.py): each step runs every open beam as a
        one-token request, its prefix served by the prefix cache. Raises a failed step's error."""
        search = BeamSearch(beam)
        step = beam_step_params(beam)
        while not search.done:
            n = len(search.running)
            done = self.generate([[*prompt, *b.token_ids] for b in search.running], [step] * n, [lora] * n,
                                 [cache_salt] * n)
            failed = next((c.error for c in done if c.error is not None), None)
            if failed is not None:
                raise failed
            search.advance([c.logprobs[0].top_logprobs for c in done])
        return search.result()

    def _activation_start(self, lora: LoraRef | None, prompt: Sequence[int],
                          invocations: dict[LoraRef, tuple[int, ...]]) -> int | None:
        """Where ``lora`` applies from in ``prompt`` (services/common/lora.py); 0 for the base model, and for an
        adapter the worker will refuse (the request fails there, saying why). ``invocations``: adapters' invocation
        tokens read so far."""
        if lora is None:
            return 0
        if lora not in invocations:
            try:
                spec = read_lora(lora, self.checkpoint.config.lora_shape, max_rank=1 << 16)
                invocations[lora] = spec.invocation_tokens
            except InvalidArgument:
                invocations[lora] = ()
        return activation_start(prompt, invocations[lora])

    def embed(self, prompts: Sequence[Sequence[int]], dimensions: int | None = None,
              lora: LoraRef | None = None) -> list[list[float]]:
        """Each prompt's embedding (pooling.py: its last token's final hidden state, normalized as the
        checkpoint says, cut to ``dimensions``), all run together (with ``lora``'s adapter); validate them first
        (``validate_embedding``)."""
        pooled = self._pooled(prompts, lora)
        return [embedding_vector(hidden, self.checkpoint.pooling, dimensions) for hidden in pooled]

    def classify(self, prompts: Sequence[Sequence[int]], lora: LoraRef | None = None) -> list[list[float]]:
        """A sequence classifier's logits for each prompt (its classes', pooling.py ``Classifier``), all run
        together (with ``lora``'s adapter, and its own head where it saved one); validate them first
        (``validate``)."""
        check_classifier(self.checkpoint.classifier)
        return self._pooled(prompts, lora)

    def _pooled(self, prompts: Sequence[Sequence[int]], lora: LoraRef | None) -> list[list[float]]:
        """Each prompt's pooled state as the worker returns it; raises the first failed prompt's error."""
        out = []
        for comp in self.generate(prompts, [EMBEDDING_PARAMS] * len(prompts), [lora] * len(prompts)):
            if comp.error is not None:
                raise comp.error
            out.append(comp.hidden_state)
        return out

    def validate_embedding(self, prompt_token_ids: Sequence[int], dimensions: int | None = None) -> None:
        """Raises InvalidArgument for a prompt (or cut) this checkpoint cannot embed."""
        check_embedding(self.checkpoint.pooling, self.checkpoint.config.hidden_size, dimensions)
        self.validate(prompt_token_ids, EMBEDDING_PARAMS)

    def _fail(self, comp: Completion, error: SeawallError) -> None:
        if comp.finish_reason is None:  # else it ended at a token of the step that failed it, or before
            comp.finish_reason, comp.error = FinishReason.ERROR, error
            self.scheduler.finish(comp.request_id, FinishReason.ERROR)

    def _apply(self, event, request: Request, comp: Completion, detok: IncrementalDetokenizer) -> None:
        if comp.finish_reason is not None:
            return  # a stop string ended it at an earlier token of the same multi-step result
        comp.token_ids.append(event.token.token_id)
        comp.logprobs.append(event.token)
        reason = event.finish_reason
        if text_left_out(request.params, event.token.token_id, reason, request.eos_token_ids):
            detok.push_stop_token()
        else:
            detok.push(event.token.token_id)
        if reason is None and detok.finished_by_stop_string is not None:
            reason = FinishReason.STOP
            self.scheduler.finish(event.request_id, reason, num_outputs=len(comp.token_ids))
        if reason is not None:
            detok.flush()
            comp.finish_reason = reason
