"""Protobuf ↔ internal dataclasses, at the edge of every service (STYLE §5).

The scheduler core and the engine work on ``services.common.step`` and ``SamplingParams``; only the gRPC
servicers and clients call these functions. Proto zero values mean "default" (see common.proto), so the
mapping fills in the dataclass defaults explicitly.
"""

from __future__ import annotations

import json

import grpc

from seawall.v1 import common_pb2, worker_pb2
from services.common.errors import InvalidArgument, error_for_code
from services.common.sampling_params import FinishReason, SamplingParams
from services.common.step import ContinuingSequence, LoraRef, NewSequence, SampledToken, StepPlan, StepResult

_FINISH_TO_PROTO = {
    None: common_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}
_FINISH_FROM_PROTO = {v: k for k, v in _FINISH_TO_PROTO.items()}
# SamplingParams.structured_output kinds <-> StructuredOutput's oneof members.
_STRUCTURED_PROTO_FIELDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
_STRUCTURED_KINDS = {field: kind for kind, field in _STRUCTURED_PROTO_FIELDS.items()}
_FREE_THOUGHT_TO_PROTO = {"": common_pb2.FREE_THOUGHT_UNSPECIFIED, "required": common_pb2.FREE_THOUGHT_REQUIRED,
                          "optional": common_pb2.FREE_THOUGHT_OPTIONAL, "harmony": common_pb2.FREE_THOUGHT_HARMONY}
_FREE_THOUGHT_FROM_PROTO = {v: k for k, v in _FREE_THOUGHT_TO_PROTO.items()}
# SequenceError.code is a grpc.StatusCode's number.
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def finish_reason_to_proto(reason: str | None) -> int:
    return _FINISH_TO_PROTO[reason]


def finish_reason_from_proto(value: int) -> str | None:
    return _FINISH_FROM_PROTO[value]


def params_to_proto(p: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(
        max_tokens=p.max_tokens, temperature=p.temperature, top_k=max(p.top_k, 0), top_p=p.top_p,
        min_p=p.min_p, repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty, stop=list(p.stop), stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos, min_tokens=p.min_tokens,
        include_stop_str_in_output=p.include_stop_str_in_output, logit_bias=dict(p.logit_bias),
        keep_special_tokens=not p.skip_special_tokens,
        allowed_token_ids=list(p.allowed_token_ids), bad_words=list(p.bad_words), pooling=p.pooling,
    )
    if p.seed is not None:
        msg.seed = p.seed
    if p.logprobs is not None:
        msg.logprobs = p.logprobs
    if p.prompt_logprobs is not None:
        msg.prompt_logprobs = p.prompt_logprobs
    if p.structured_output is not None:
        kind, spec = p.structured_output
        if kind == "choice":
            msg.structured_output.choice.choices.extend(json.loads(spec))
        else:
            setattr(msg.structured_output, _STRUCTURED_PROTO_FIELDS[kind], spec)
        msg.structured_output.free_thought = _FREE_THOUGHT_TO_PROTO[p.free_thought]
    return msg


def _structured_from_proto(msg: common_pb2.SamplingParams) -> tuple[str, str] | None:
    if not msg.HasField("structured_output"):
        return None
    which = msg.structured_output.WhichOneof("constraint")
    if which is None:
        raise InvalidArgument("structured_output is set but empty: set one of json_schema, regex, choice, grammar")
    if which == "choice":
        return ("choice", json.dumps(list(msg.structured_output.choice.choices)))
    return (_STRUCTURED_KINDS[which], getattr(msg.structured_output, which))


def _free_thought_from_proto(msg: common_pb2.SamplingParams) -> str:
    value = msg.structured_output.free_thought
    if value not in _FREE_THOUGHT_FROM_PROTO:
        raise InvalidArgument(f"structured_output.free_thought: unknown value {value}")
    return _FREE_THOUGHT_FROM_PROTO[value]


# Fields a request may leave unset to take the model's generation config (its API names are the same), each
# with what it means where the model has none.
_DEFAULTED_FIELDS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
UNSET_TAKES_MODEL_DEFAULT = tuple(_DEFAULTED_FIELDS)


def params_from_proto(msg: common_pb2.SamplingParams, default_max_tokens: int = 16,
                      defaults: dict | None = None) -> SamplingParams:
    """Raises InvalidArgument (from SamplingParams) for values out of range.

    ``default_max_tokens`` stands in for ``max_tokens == 0`` ("until the context is full"); ``defaults``
    (``sampling_params.generation_defaults``: the model's generation config) for the fields left unset.
    """
    defaults = defaults or {}
    given = {name: getattr(msg, name) if msg.HasField(name) else defaults.get(name, neutral)
             for name, neutral in _DEFAULTED_FIELDS.items()}
    max_tokens = msg.max_tokens or min(default_max_tokens, defaults.get("max_tokens", default_max_tokens))
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=given["temperature"],
        top_k=given["top_k"],
        top_p=given["top_p"] or 1.0,  # 0: disabled, as 1; out of (0, 1] is refused
        min_p=given["min_p"],
        seed=msg.seed if msg.HasField("seed") else None,
        repetition_penalty=given["repetition_penalty"] or 1.0,
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        min_tokens=msg.min_tokens,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        include_stop_str_in_output=msg.include_stop_str_in_output,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
        logit_bias=tuple(sorted(msg.logit_bias.items())),
        allowed_token_ids=tuple(msg.allowed_token_ids),
        bad_words=tuple(msg.bad_words),
        structured_output=_structured_from_proto(msg),
        free_thought=_free_thought_from_proto(msg),
        skip_special_tokens=not msg.keep_special_tokens,
        pooling=msg.pooling,
    )


def plan_to_proto(plan: StepPlan, scheduler_id: str = "") -> worker_pb2.StepPlan:
    msg = worker_pb2.StepPlan(step_id=plan.step_id, scheduler_id=scheduler_id,
                              finished_seq_ids=plan.finished,
                              swap_out=_moves(plan.swap_out), swap_in=_moves(plan.swap_in), copy=_moves(plan.copy),
                              scheduled_seq_ids=plan.num_scheduled_tokens.keys(),
                              num_scheduled_tokens=plan.num_scheduled_tokens.values(), speculative=plan.speculative,
                              state_saves=[worker_pb2.StateSave(seq_id=rid, tokens_into_step=k, slot=slot)
                                           for rid, (k, slot) in plan.state_saves.items()],
                              swapped_out_seq_ids=plan.swapped_out,
                              state_moves=[worker_pb2.StateMove(device_slot=d, host_slot=h) for d, h in plan.state_moves])
    # add() builds each submessage in place; append() would build it, then copy it.
    for new in plan.new:
        msg.new_sequences.add(
            seq_id=new.seq_id, token_ids=new.token_ids, num_prompt_tokens=new.prompt_len,
            num_computed_tokens=new.num_computed_tokens, block_ids=new.block_ids,
            sampling=params_to_proto(new.params), state_checkpoint=new.state_checkpoint,
            lora=None if new.lora is None else common_pb2.LoraAdapter(name=new.lora.name, path=new.lora.path))
    add = msg.continuing.add
    for cont in plan.continuing:
        if cont.block_ids is None:
            add(seq_id=cont.seq_id, new_block_ids=cont.new_block_ids, appended_token_ids=cont.appended_token_ids)
        else:
            add(seq_id=cont.seq_id, new_block_ids=cont.new_block_ids, appended_token_ids=cont.appended_token_ids,
                block_ids=cont.block_ids, replace_block_table=True)
    return msg


def plan_from_proto(msg: worker_pb2.StepPlan) -> StepPlan:
    if len(msg.scheduled_seq_ids) != len(msg.num_scheduled_tokens):
        raise InvalidArgument(f"step {msg.step_id}: {len(msg.scheduled_seq_ids)} scheduled_seq_ids but "
                              f"{len(msg.num_scheduled_tokens)} num_scheduled_tokens; send one count per sequence")
    plan = StepPlan(msg.step_id, finished=list(msg.finished_seq_ids), swap_out=_pairs(msg.swap_out),
                    swap_in=_pairs(msg.swap_in), copy=_pairs(msg.copy),
                    num_scheduled_tokens=dict(zip(msg.scheduled_seq_ids, msg.num_scheduled_tokens, strict=True)),
                    speculative=msg.speculative,
                    state_saves={s.seq_id: (s.tokens_into_step, s.slot) for s in msg.state_saves},
                    swapped_out=list(msg.swapped_out_seq_ids),
                    state_moves=[(m.device_slot, m.host_slot) for m in msg.state_moves])
    for new in msg.new_sequences:
        plan.new.append(NewSequence(new.seq_id, list(new.token_ids), new.num_prompt_tokens,
                                    new.num_computed_tokens, list(new.block_ids),
                                    params_from_proto(new.sampling),
                                    LoraRef(new.lora.name, new.lora.path) if new.HasField("lora") else None,
                                    new.state_checkpoint if new.HasField("state_checkpoint") else None))
    for cont in msg.continuing:
        plan.continuing.append(ContinuingSequence(
            cont.seq_id, list(cont.new_block_ids), list(cont.appended_token_ids),
            list(cont.block_ids) if cont.replace_block_table else None))
    return plan


def result_to_proto(result: StepResult, step_seconds: float = 0.0) -> worker_pb2.StepResult:
    sampled = result.sampled
    counts = [len(tokens) for tokens in sampled.values()]
    ids = [t.token_id for tokens in sampled.values() for t in tokens]
    msg = worker_pb2.StepResult(step_id=result.step_id, forward_time_ms=result.forward_seconds * 1e3,
                                step_time_ms=step_seconds * 1e3, num_sampled=len(sampled),
                                sampled_seq_ids=sampled.keys(), num_sampled_tokens=counts, sampled_token_ids=ids,
                                num_draft_tokens=result.num_draft_tokens,
                                num_accepted_tokens=result.num_accepted_tokens)
    if any(tokens[0].logprob is not None for tokens in sampled.values()):
        empty = common_pb2.TokenLogprobs()
        msg.logprobs.extend(token_logprobs_to_proto(t) if t.logprob is not None else empty
                            for tokens in sampled.values() for t in tokens)
    for seq_id, (start, tokens) in result.prompt_logprobs.items():
        msg.prompt_logprob_seq_ids.append(seq_id)
        msg.prompt_logprob_starts.append(start)
        msg.num_prompt_logprobs.append(len(tokens))
        msg.prompt_logprobs.extend(token_logprobs_to_proto(t) for t in tokens)
    msg.embeddings.extend(worker_pb2.Embedding(seq_id=seq_id, values=values)
                          for seq_id, values in result.embeddings.items())
    msg.errors.extend(worker_pb2.SequenceError(seq_id=seq_id, code=grpc.StatusCode[exc.grpc_code].value[0],
                                               message=str(exc)) for seq_id, exc in result.errors.items())
    return msg


def result_from_proto(msg: worker_pb2.StepResult) -> StepResult:
    result = StepResult(msg.step_id, forward_seconds=msg.forward_time_ms / 1e3,
                        num_draft_tokens=msg.num_draft_tokens, num_accepted_tokens=msg.num_accepted_tokens)
    seq_ids, counts, ids = msg.sampled_seq_ids, msg.num_sampled_tokens, list(msg.sampled_token_ids)
    if len(seq_ids) != len(counts) or sum(counts) != len(ids) or (msg.logprobs and len(msg.logprobs) != len(ids)):
        raise InvalidArgument(f"step {msg.step_id}: {len(seq_ids)} sampled_seq_ids, {len(counts)} counts summing "
                              f"to {sum(counts)}, {len(ids)} token ids and {len(msg.logprobs)} logprobs do not "
                              "line up")
    if msg.prompt_logprob_seq_ids:
        result.prompt_logprobs = _prompt_logprobs_from_proto(msg)
    for e in msg.errors:
        result.errors[e.seq_id] = error_for_code(_CODE_NAMES.get(e.code, "INTERNAL"), e.message)
    result.embeddings = {e.seq_id: list(e.values) for e in msg.embeddings}
    sampled = result.sampled
    if not msg.logprobs:
        if len(ids) == len(seq_ids):  # one token each: the usual step
            for seq_id, token in zip(seq_ids, ids, strict=True):
                sampled[seq_id] = [SampledToken(token)]
            return result
        lps = [None] * len(ids)
    else:
        lps = list(msg.logprobs)
    at = 0
    for seq_id, n in zip(seq_ids, counts, strict=True):
        sampled[seq_id] = [sampled_token_from_proto(ids[i], lps[i]) for i in range(at, at + n)]
        at += n
    return result


def _prompt_logprobs_from_proto(msg: worker_pb2.StepResult) -> dict[str, tuple[int, list[SampledToken]]]:
    seq_ids, starts, counts = msg.prompt_logprob_seq_ids, msg.prompt_logprob_starts, msg.num_prompt_logprobs
    if not len(seq_ids) == len(starts) == len(counts) or sum(counts) != len(msg.prompt_logprobs):
        raise InvalidArgument(f"step {msg.step_id}: {len(seq_ids)} prompt_logprob_seq_ids, {len(starts)} starts, "
                              f"{len(counts)} counts summing to {sum(counts)} and {len(msg.prompt_logprobs)} prompt "
                              "logprobs do not line up")
    out, at = {}, 0
    for seq_id, start, n in zip(seq_ids, starts, counts, strict=True):
        out[seq_id] = (start, [sampled_token_from_proto(lp.sampled.token_id, lp)
                               for lp in msg.prompt_logprobs[at:at + n]])
        at += n
    return out


def sampled_token_from_proto(token_id: int, lp: common_pb2.TokenLogprobs | None) -> SampledToken:
    if lp is None or not lp.HasField("sampled"):
        return SampledToken(token_id)
    return SampledToken(token_id, lp.sampled.logprob, lp.sampled.rank, [(t.token_id, t.logprob) for t in lp.top])


def token_logprobs_to_proto(token: SampledToken) -> common_pb2.TokenLogprobs:
    return common_pb2.TokenLogprobs(
        sampled=common_pb2.TokenLogprob(token_id=token.token_id, logprob=token.logprob, rank=token.rank or 0),
        top=[common_pb2.TokenLogprob(token_id=t, logprob=lp) for t, lp in token.top_logprobs])


def _moves(pairs: list[tuple[int, int]]) -> list[worker_pb2.BlockMove]:
    return [worker_pb2.BlockMove(src_block_id=s, dst_block_id=d) for s, d in pairs]


def _pairs(moves) -> list[tuple[int, int]]:
    return [(m.src_block_id, m.dst_block_id) for m in moves]
