"""The model runner: one worker's model, KV pool and sequence table; executes step plans.

Three stages per step (STYLE §8): ``prepare_inputs`` (pure CPU bookkeeping), the forward pass, sampling.
Block operations (copy, swap-out, swap-in) run before the forward pass: copies first (their sources are live
blocks), then swap-out, so device blocks it frees can be reused as swap-in targets in the same step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from services.common.errors import InvalidArgument
from services.common.heap import keep_freed_heap
from services.common.lora import activation_start
from services.common.sampling_params import SamplingParams
from services.common.step import NewSequence, SampledToken, StepPlan, StepResult
from services.engine import cpu_kernels
from services.engine.bad_words import bad_words_token_ids
from services.engine.checkpoint import Checkpoint, load_checkpoint_meta, resolve_model_dir
from services.engine.config import EngineConfig
from services.engine.grammar import GrammarCompiler
from services.engine.inputs import SequenceState, prepare_inputs
from services.engine.kv_pool import ATTENTION_FREE_MAX_BLOCKS, KVLayout, PagedKVPool
from services.engine.kv_quant import kv_cache_torch_dtype
from services.engine.loader import load_model, lora_rows
from services.engine.lora import LoraCache
from services.engine.ngram import NgramIndex
from services.engine.recurrent_state import RecurrentStates
from services.engine.sampler import Sampler, SamplerOutput, SamplingRow

log = logging.getLogger(__name__)

_CPU_KV_BYTES = 256 * 2**20


class ModelRunner:
    """Owns the model and KV pool of one worker. Not thread-safe: one step at a time."""

    def __init__(self, config: EngineConfig, checkpoint: Checkpoint | None = None) -> None:
        # Steps allocate and free tens of MiB of activations, and KV chunks over gRPC a few MiB each: keep
        # freed memory for reuse rather than faulting in fresh pages every step (heap.py has the numbers).
        keep_freed_heap()
        self.config = config
        self.checkpoint = checkpoint or load_checkpoint_meta(resolve_model_dir(config.model), config.max_model_len)
        self.device = config.torch_device()
        self.dtype = config.torch_dtype()
        self.model = load_model(self.checkpoint, self.device, self.dtype)
        mc = self.checkpoint.config
        self.layout = KVLayout(mc.kv_slots, config.block_size, *mc.kv_slot,
                               kv_cache_torch_dtype(config.kv_cache_dtype, self.dtype),
                               num_parts=1 if mc.mla else 2,  # latent attention caches one latent
                               layer_shapes=mc.kv_layer_shapes)
        # Linear-attention layers keep a recurrent state per sequence instead of KV (recurrent_state.py), and
        # some more for prefix caching (the scheduler assigns them: StepPlan.state_saves); on CUDA their slots
        # are taken before the KV pool sizes itself by the memory left.
        self.state_checkpoints = config.state_checkpoints if mc.recurrent else 0
        self.host_state_checkpoints = config.host_state_checkpoints if mc.recurrent and self.state_checkpoints else 0
        slots = (config.state_slots + self.state_checkpoints if self.device.type == "cuda"
                 else min(config.state_slots, 8))
        self.states = (RecurrentStates(mc.linear_attention, len(mc.linear_layers), self.dtype, self.device, slots)
                       if mc.recurrent else None)
        self.kv = PagedKVPool(self.layout, *self._pool_blocks(), self.device)
        # Fused C kernels (attention, norms, RoPE, SwiGLU, argmax) where they apply (CPU, fp32) and can be built;
        # not with a float8 pool, whose rounding would turn their last-bit differences into other tokens (kv_quant).
        kernels = (cpu_kernels.load() if config.cpu_kernels and self.device.type == "cpu"
                   and self.dtype == torch.float32 else None)
        self.kernels = kernels if config.kv_cache_dtype == "auto" else None
        # Reading a float8 e4m3 pool is exact whoever widens it: the kernels' gather does it ~13x faster than torch.
        self.float8_kernels = kernels if self.layout.dtype == torch.float8_e4m3fn else None
        self.sampler = Sampler(self.kernels)
        self.grammars = GrammarCompiler(self.checkpoint.tokenizer, self.checkpoint.config.vocab_size,
                                        self.checkpoint.eos_token_ids)
        self.seqs: dict[str, SequenceState] = {}
        self.loras = LoraCache(mc.lora_shape, self.device, self.dtype, config.max_idle_loras,
                               lora_rows(self.checkpoint))
        # Where a speculative plan's draft tokens come from: (sequence, most drafts) -> drafts. Any drafts give
        # the same output (only those the sampler agrees with are kept); tests swap in drafts whose fate
        # they know.
        self.drafter: Callable[[SequenceState, int], list[int]] = ngram_drafts
        self._mask_thread: ThreadPoolExecutor | None = None  # made by the first structured-output request
        log.info("runner ready: %s on %s/%s, KV %s, %d device blocks, %d host blocks, attention: %s",
                 self.checkpoint.path, self.device, self.dtype, self.layout.dtype, self.kv.num_blocks,
                 self.kv.num_host_blocks, "fused CPU kernels" if self.kernels else "gather + SDPA")

    @property
    def max_model_len(self) -> int:
        return self.checkpoint.config.max_model_len

    def _pool_blocks(self) -> tuple[int, int]:
        """Device and host blocks: as many as the KV and swap budgets hold; an attention-free model's blocks hold
        nothing and only count tokens for the scheduler, so enough for ``state_slots`` sequences of the whole
        context (the states are the memory its sequences take), at most ``ATTENTION_FREE_MAX_BLOCKS``."""
        if self.layout.bytes_per_block:
            return (self.layout.blocks_for_budget(self._kv_budget()),
                    self.layout.blocks_for_budget(self.config.swap_bytes))
        per_sequence = -(-self.max_model_len // self.config.block_size)
        n = min(self.config.state_slots * per_sequence, ATTENTION_FREE_MAX_BLOCKS)
        return n, n if self.config.swap_bytes else 0

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes is not None:
            return self.config.kv_cache_bytes
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * 0.9)
        return _CPU_KV_BYTES

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        for seq_id in plan.finished:
            self.drop(seq_id)
        for src, dst in plan.state_moves:  # before the sequences claim: one may start from a state moved here
            self.states.move_checkpoint(src, dst)
        for sid in plan.swapped_out:  # a recurrent model's states leave the device with their KV blocks
            seq = self.seqs.get(sid)
            if self.states is not None and seq is not None and seq.state_slot is not None:
                self.states.swap_out(sid, seq.state_slot)
                seq.state_slot = None
        for new in plan.new:
            self._add(new)
        for cont in plan.continuing:
            seq = self._get(cont.seq_id)
            if self.states is not None and self.states.on_host(seq.seq_id):  # swapped back in
                seq.state_slot = self.states.swap_in(seq.seq_id)
            if cont.block_ids is not None:
                seq.block_ids = list(cont.block_ids)
            seq.block_ids.extend(cont.new_block_ids)
            seq.token_ids.extend(cont.appended_token_ids)
        # Copies (copy-on-write at a fork) first: their sources are live blocks this plan's preemptions may
        # free and its swap-ins overwrite.
        self.kv.copy(plan.copy)
        self.kv.swap_out(plan.swap_out)
        self.kv.swap_in(plan.swap_in)
        result = StepResult(plan.step_id)
        for sid, (at, checkpoint) in plan.state_saves.items():  # prefix caching of a recurrent model's states
            seq = self.seqs.get(sid)
            if seq is not None and self.states is not None:
                seq.state_save = (at, self.states.checkpoint_row(checkpoint))
        if plan.num_scheduled_tokens:
            scheduled = [(self._get(sid), n) for sid, n in plan.num_scheduled_tokens.items() if n > 0]
            result.sampled = self._run([(seq, n) for seq, n in scheduled if seq.error is None], result,
                                       plan.speculative)
            result.errors = {seq.seq_id: seq.error for seq, _ in scheduled if seq.error is not None}
        result.forward_seconds = time.perf_counter() - started
        return result

    def _run(self, scheduled: list[tuple[SequenceState, int]], result: StepResult,
             speculative: bool) -> dict[str, list[SampledToken]]:
        """Runs the plan's tokens; a sequence scheduled past its known tokens (a multi-step decode) goes on
        with one pass per extra token, fed what it sampled. It runs them all even past a stop token: the
        scheduler counts on exactly that many tokens and drops what follows a stop (one row of a pass).
        In a ``speculative`` plan the extra tokens are drafts instead, verified in the one pass. Prompt
        tokens scored on the way go into ``result.prompt_logprobs``."""
        block_size = self.config.block_size
        batch, extra = [], {}
        for seq, n in scheduled:
            known = len(seq.token_ids) - seq.num_computed
            if n > known and (known < 1 or -(-(seq.num_computed + n) // block_size) > len(seq.block_ids)):
                raise ValueError(f"sequence {seq.seq_id}: {n} tokens scheduled from {seq.num_computed} with "
                                 f"{known} known and {len(seq.block_ids)} blocks: no room for {n - known} more")
            if n > known and speculative and self.states is not None:
                # A rejected draft's step cannot be taken back out of a recurrent state (the scheduler knows
                # from Describe and never plans one; this names the mistake if it did).
                raise ValueError(f"sequence {seq.seq_id}: a speculative step on a model with linear-attention "
                                 "layers, whose recurrent state cannot drop rejected drafts")
            if n > known and speculative:
                drafts = self.drafter(seq, n - known)[:n - known]
                seq.token_ids.extend(drafts)
                seq.num_drafts = len(drafts)
                result.num_draft_tokens += len(drafts)
                batch.append((seq, known + len(drafts)))
                continue
            batch.append((seq, min(n, known)))
            if n > known:
                extra[seq.seq_id] = n - known
        if speculative:
            return self._pass(batch, result)
        sampled: dict[str, list[SampledToken]] = {}
        while batch:
            for sid, tokens in self._pass(batch, result).items():
                sampled.setdefault(sid, []).extend(tokens)
            batch = []
            for sid in [sid for sid, left in extra.items() if left and self.seqs[sid].error is None]:
                extra[sid] -= 1
                batch.append((self.seqs[sid], 1))
        for seq, _ in scheduled:  # a pass cut short (an error) leaves no save for the next step
            seq.state_save = None
        return sampled

    def _pass(self, scheduled: list[tuple[SequenceState, int]],
              result: StepResult) -> dict[str, list[SampledToken]]:
        """One forward pass over the scheduled tokens, then sampling where a sequence reaches its end: one
        token, or for a sequence verifying drafts, the drafts kept and the token after them."""
        arch = self.model.config
        inputs = prepare_inputs(scheduled, self.config.block_size, self.device, self.kernels, arch.sliding_window,
                                arch.attn_softcap, arch.attention_chunk, self.states, self.float8_kernels,
                                sampled_rows=self.config.kv_sharing_fast_prefill and arch.kv_free_tail is not None)
        # Embedding requests whose prompt ends here take their last token's hidden state instead of a sample.
        pool_rows = [i for i, sid in enumerate(inputs.sample_seq_ids) if self.seqs[sid].params.pooling]
        sample_ids = [sid for sid in inputs.sample_seq_ids if not self.seqs[sid].params.pooling]
        rows = []
        for sid in sample_ids:
            seq = self.seqs[sid]
            rows.append(SamplingRow(seq.params, seq.token_ids[: seq.prompt_len], seq.token_ids[seq.prompt_len:],
                                    bad_words=seq.bad_words))
        # Each draft's row samples as if the drafts before it were outputs already: the same grammar, penalties,
        # min_tokens, bad words and seeded draws as a pass per token would have had.
        verify: dict[str, list[SamplingRow]] = {}
        for sid, m in inputs.verified:
            seq = self.seqs[sid]
            known = len(seq.token_ids) - m
            verify[sid] = [SamplingRow(seq.params, seq.token_ids[: seq.prompt_len],
                                       seq.token_ids[seq.prompt_len:known + j], bad_words=seq.bad_words)
                           for j in range(m)]
        # Grammar masks depend on the tokens so far only: computed beside the forward pass (llguidance drops
        # the GIL), as vLLM and SGLang overlap them with the GPU.
        masks = self._grammar_masks([self.seqs[sid] for sid in sample_ids], rows, verify)
        # Hidden states first where some rows pool, or the model has no head (an embedding model's chunks).
        hidden = bool(pool_rows) or self.model.lm_head is None
        logits = self.model(inputs.input_ids, inputs.positions, inputs.attention, self.kv, inputs.logits_index,
                            inputs.lora, hidden=hidden)
        for seq, n in scheduled:
            seq.num_computed += n
            # Saved in this pass, or (a multi-step decode) as many tokens on as it said, in a later pass.
            save = seq.state_save
            seq.state_save = (save[0] - n, save[1]) if save is not None and save[0] > n else None
        pooled = self._pool(logits, pool_rows, inputs.sample_seq_ids, result) if pool_rows else {}
        if hidden:
            keep = [i for i in range(len(logits)) if i not in set(pool_rows)]
            logits = self.model.head(logits[keep]) if keep else logits[:0]
        n_sampled = len(sample_ids)
        n_scored = sum(n for _, _, n in inputs.scored)
        if inputs.scored:
            result.prompt_logprobs.update(self._score_prompts(logits[n_sampled:n_sampled + n_scored],
                                                              inputs.scored))
        if inputs.verified:
            rows += [row for sid, _ in inputs.verified for row in verify[sid]]
            logits = torch.cat([logits[:n_sampled], logits[n_sampled + n_scored:]])
        elif inputs.scored:
            logits = logits[:n_sampled]
        if not sample_ids:
            return pooled
        if masks is not None:
            masks.result()
        out = self.sampler(logits, rows, self.checkpoint.eos_token_ids)
        no_token = set(out.no_token)
        verify_row = n_sampled
        sampled: dict[str, list[SampledToken]] = pooled
        for i, sid in enumerate(sample_ids):
            seq = self.seqs[sid]
            if m := seq.num_drafts:
                kept = self._keep_drafts(seq, [*range(verify_row, verify_row + m), i], out, rows, no_token, result)
                verify_row += m
            elif i in no_token:
                seq.error = InvalidArgument(no_token_message(seq.params, len(rows[i].output_token_ids)))
                continue
            else:
                kept = [_sampled_token(out, i)]
                seq.token_ids.append(kept[0].token_id)
            if kept:
                sampled[sid] = kept
        return sampled

    def _pool(self, hidden: torch.Tensor, pool_rows: list[int], seq_ids: list[str],
              result: StepResult) -> dict[str, list[SampledToken]]:
        """The embedding requests' last hidden states (a classifier's: their classes' logits) into
        ``result.embeddings``; each "samples" token 0, which ends it (max_tokens 1), so the scheduler's
        bookkeeping stays that of any request."""
        pooled = hidden[pool_rows]
        if self.model.score is not None:  # a classifier: its classes' logits, by its adapter's head where it has one
            logits = self.model.score(pooled)
            for i, row in enumerate(pool_rows):
                lora = self.seqs[seq_ids[row]].lora
                if lora is not None and lora.head is not None:
                    logits[i] = pooled[i] @ lora.head.T
            pooled = logits
        vectors = pooled.float().tolist()
        sampled = {}
        for row, vector in zip(pool_rows, vectors, strict=True):
            sid = seq_ids[row]
            result.embeddings[sid] = vector
            self.seqs[sid].token_ids.append(0)
            sampled[sid] = [SampledToken(0)]
        return sampled

    def _keep_drafts(self, seq: SequenceState, order: list[int], out: SamplerOutput, rows: list[SamplingRow],
                     no_token: set[int], result: StepResult) -> list[SampledToken]:
        """The tokens ``seq`` keeps from a pass that verified its drafts: ``order`` holds the sampler rows of
        its newest token and each draft but the last, then the last's. Each row's sample is kept while it
        equals the next draft; the first that does not is kept too, and ends it (later rows saw wrong drafts)."""
        m = seq.num_drafts
        drafts = seq.token_ids[len(seq.token_ids) - m:]
        del seq.token_ids[len(seq.token_ids) - m:]
        seq.num_drafts = 0
        kept = []
        for j, r in enumerate(order):
            if r in no_token:
                seq.error = InvalidArgument(no_token_message(seq.params, len(rows[r].output_token_ids)))
                break
            kept.append(_sampled_token(out, r))
            if j == m or kept[-1].token_id != drafts[j]:
                break
        result.num_accepted_tokens += sum(t.token_id == d for t, d in zip(kept, drafts, strict=False))
        # KV stands for the newest token and each draft kept; a rejected draft's slot is rewritten later.
        seq.num_computed -= m + 1 - len(kept)
        seq.token_ids.extend(t.token_id for t in kept)
        return kept

    def _grammar_masks(self, seqs: list[SequenceState], rows: list[SamplingRow],
                       verify: dict[str, list[SamplingRow]]) -> Future | None:
        """Starts setting each structured row's ``token_mask`` (the tokens its grammar allows next) on the mask
        thread, and its draft rows' (``verify``: the rows before the last draft); None when no row is
        structured. A matcher is made on the first token this worker samples for a sequence and catches up
        on the tokens sampled elsewhere (the prefill worker's first token, those before a preemption)."""
        constrained = [k for k, seq in enumerate(seqs) if seq.params.structured_output is not None]
        if not constrained:
            return None
        for k in constrained:
            if seqs[k].grammar is None:
                seqs[k].grammar = self.grammars.matcher(seqs[k].params.structured_output, seqs[k].params.free_thought)
        grammars = [seqs[k].grammar for k in constrained]
        # A sampled row's output ends with the sequence's drafts (if any): the matcher stays before them.
        cuts = [len(rows[k].output_token_ids) - seqs[k].num_drafts for k in constrained]
        outputs = [rows[k].output_token_ids[:cut] for k, cut in zip(constrained, cuts, strict=True)]
        drafts = [rows[k].output_token_ids[cut:] for k, cut in zip(constrained, cuts, strict=True)]

        def fill() -> None:
            for k, masks in zip(constrained, self.grammars.masks(grammars, outputs, drafts), strict=True):
                if masks is not None:
                    for j, row in enumerate([*verify.get(seqs[k].seq_id, ()), rows[k]]):
                        row.token_mask = masks[j:j + 1]

        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return self._mask_thread.submit(fill)

    def _score_prompts(self, logits: torch.Tensor,
                       scored: list[tuple[str, int, int]]) -> dict[str, tuple[int, list[SampledToken]]]:
        """Logprobs of prompt tokens under the model's own distribution (no temperature or penalties, as vLLM's
        prompt_logprobs), with rank and the most likely candidates. ``logits``: one row per token scored."""
        targets = [t for sid, start, n in scored for t in self.seqs[sid].token_ids[start:start + n]]
        lp = torch.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(targets, device=lp.device)
        chosen = lp.gather(1, target[:, None]).squeeze(1)
        ranks = ((lp > chosen[:, None]).sum(1) + 1).tolist()
        k = max(self.seqs[sid].params.prompt_logprobs for sid, _, _ in scored)
        top_values, top_ids = torch.topk(lp, k) if k else (lp[:, :0], lp[:, :0].long())
        ids, values, chosen_list = top_ids.tolist(), top_values.tolist(), chosen.tolist()
        out, row = {}, 0
        for sid, start, n in scored:
            want = self.seqs[sid].params.prompt_logprobs
            out[sid] = (start, [SampledToken(targets[r], chosen_list[r], ranks[r],
                                             list(zip(ids[r][:want], values[r][:want], strict=True)))
                                for r in range(row, row + n)])
            row += n
        return out

    def _add(self, new: NewSequence) -> None:
        if len(new.token_ids) > self.max_model_len:
            raise InvalidArgument(f"sequence {new.seq_id} has {len(new.token_ids)} tokens; the model's context is "
                                  f"{self.max_model_len}")
        seq = self.seqs[new.seq_id] = SequenceState(
            new.seq_id, list(new.token_ids), new.prompt_len, new.num_computed_tokens, list(new.block_ids), new.params,
            bad_words=bad_words_token_ids(self.checkpoint.tokenizer, new.params.bad_words),
        )
        if self.states is not None:
            try:
                seq.state_slot = self.states.claim(new.seq_id, new.num_computed_tokens, new.state_checkpoint)
            except InvalidArgument as exc:  # its first tokens ran elsewhere and their state is not here
                log.warning("%s", exc)
                seq.error = exc
        if new.lora is not None:
            try:
                seq.lora = self.loras.get(new.lora, {id(s.lora) for s in self.seqs.values() if s.lora is not None})
            except InvalidArgument as exc:  # files changed or gone since the scheduler checked them
                seq.error = exc
            else:  # an activated LoRA from its invocation on (the scheduler salted its hashes alike), else never
                start = activation_start(new.token_ids[: new.prompt_len], seq.lora.spec.invocation_tokens)
                seq.lora, seq.lora_from = (seq.lora, start) if start is not None else (None, 0)

    def export_state(self, seq_id: str) -> tuple[int, list[tuple[bytes, bytes]]]:
        """A held sequence's recurrent state for the worker it is handed off to: (tokens it took in, each
        linear layer's bytes)."""
        seq = self.seqs.get(seq_id)
        if self.states is None or seq is None or seq.state_slot is None:
            raise InvalidArgument(f"this worker holds no recurrent state for sequence {seq_id!r}"
                                  + (" (its model has no linear-attention layers)" if self.states is None else ""))
        return seq.num_computed, self.states.read(seq.state_slot)

    def export_checkpoint(self, checkpoint: int) -> list[tuple[bytes, bytes]]:
        """A state checkpoint's bytes, each linear layer's, for a worker reading a prefix from this one's cache."""
        if self.states is None:
            raise InvalidArgument("this worker's model has no linear-attention layers: it saves no state checkpoints")
        return self.states.read_checkpoint(checkpoint)

    def drop(self, seq_id: str) -> bool:
        """Forgets a sequence, its recurrent state's slot freed; False when it held none of that id."""
        seq = self.seqs.pop(seq_id, None)
        if self.states is not None:
            self.states.release(seq_id, None if seq is None else seq.state_slot)
        return seq is not None

    def drop_all(self) -> None:
        """Forgets every sequence (a new scheduler session). States stashed for sequences still to arrive stay:
        the new scheduler's first plan may be the one that adds them (its pulls ran before any plan)."""
        for seq_id in list(self.seqs):
            self.drop(seq_id)

    def _get(self, seq_id: str) -> SequenceState:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"step plan names sequence {seq_id!r} which this worker does not hold")
        return seq


def _sampled_token(out: SamplerOutput, row: int) -> SampledToken:
    lp = out.logprobs[row]
    token = out.token_ids[row]
    return SampledToken(token) if lp is None else SampledToken(token, lp.logprob, lp.rank, lp.top)


def no_token_message(params: SamplingParams, num_outputs: int) -> str:
    """Why a request could not go on: its constraints (named, as the client sent them) left no token possible."""
    held = []
    if params.structured_output is not None:
        held.append(f"the structured output ({params.structured_output[0]})")
    if params.allowed_token_ids:
        held.append(f"allowed_token_ids ({len(params.allowed_token_ids)} tokens)")
    if params.bad_words:
        held.append(f"bad_words ({len(params.bad_words)} words)")
    if num_outputs < params.min_tokens:
        held.append(f"min_tokens ({params.min_tokens}: no end-of-sequence or stop token yet)")
    if not held:  # penalties can rule a token out only by overflowing float32 (a huge repetition_penalty)
        held.append("the penalties")
    return (f"no token satisfies {' and '.join(held)} at output token {num_outputs + 1}: "
            "they contradict each other; loosen one of them")


def ngram_drafts(seq: SequenceState, k: int) -> list[int]:
    """Drafts by n-gram lookup in the sequence's own tokens (ngram.py), its index kept with the sequence."""
    if seq.ngrams is None:
        seq.ngrams = NgramIndex()
    return seq.ngrams.propose(seq.token_ids, k)

