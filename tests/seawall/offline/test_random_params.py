"""Random mixes of sampling options, batched, through the scheduler core and the model runner: every output keeps
what its options promise, and greedy or seeded outputs do not depend on the batch around them.

Found that constraints which contradict each other (allowed_token_ids a grammar never allows) sampled token 0
and broke the grammar, and that a whole-prompt policy left a prompt longer than its step budget waiting forever.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from seawall.offline.engine import Completion, OfflineEngine
from services.common.errors import SeawallError
from services.common.sampling_params import SamplingParams
from services.engine.bad_words import bad_words_token_ids
from services.engine.config import EngineConfig
from services.scheduler.core.config import SchedulerConfig

STRUCTURED = [("regex", "(yes|no)"), ("regex", "[0-9]{1,3}"), ("regex", "a+b"),
              ("choice", '["red", "green", "blue"]'),
              ("json", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                   "additionalProperties": False}))]


def _params(rng: random.Random, vocab: int) -> SamplingParams:
    kw: dict = {"max_tokens": rng.choice([1, 2, 5, 17, 40])}
    if rng.random() < 0.5:
        kw["temperature"] = 0.0
    else:
        kw["temperature"] = rng.choice([0.3, 1.0, 2.5])
        if rng.random() < 0.5:
            kw["seed"] = rng.randrange(1000)
        if rng.random() < 0.3:
            kw["top_k"] = rng.choice([1, 2, 50, vocab - 1, vocab + 10])
        if rng.random() < 0.3:
            kw["top_p"] = rng.choice([1e-6, 0.5, 0.95])
        if rng.random() < 0.2:
            kw["min_p"] = rng.choice([0.1, 0.9, 1.0])
    for name, values in [("repetition_penalty", [0.5, 1.3, 50.0]), ("presence_penalty", [-2.0, 2.0]),
                         ("frequency_penalty", [-2.0, 2.0])]:
        if rng.random() < 0.2:
            kw[name] = rng.choice(values)
    if rng.random() < 0.2:
        kw["stop_token_ids"] = tuple(rng.sample(range(vocab), 3))
    if rng.random() < 0.1:
        kw["ignore_eos"] = True
    if rng.random() < 0.3:
        kw["logprobs"] = rng.choice([0, 1, 5, 20])
    if rng.random() < 0.15:
        kw["prompt_logprobs"] = rng.choice([0, 3])
    if rng.random() < 0.2:
        kw["logit_bias"] = tuple(sorted({rng.randrange(vocab): rng.choice([-100.0, 5.0, 100.0])
                                         for _ in range(3)}.items()))
    if rng.random() < 0.1:
        kw["allowed_token_ids"] = tuple(rng.sample(range(vocab), rng.choice([1, 3, 50])))
    if rng.random() < 0.2:
        kw["stop"] = (rng.choice(["e", "the", "\n", "a"]),)
    if rng.random() < 0.2:
        kw["bad_words"] = tuple(rng.sample(["the", "a", "e", "of", "ing", "hello world", "1"], 2))
    if rng.random() < 0.25:
        kw["structured_output"] = rng.choice(STRUCTURED)
    elif rng.random() < 0.2:  # min_tokens is refused beside a structured output
        kw["min_tokens"] = rng.randint(0, kw["max_tokens"])
    return SamplingParams(**kw)


def _matches(structured: tuple[str, str], text: str) -> bool:
    kind, spec = structured
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    if kind == "choice":
        return text in json.loads(spec)
    try:
        return isinstance(json.loads(text)["a"], int)
    except (ValueError, KeyError, TypeError):
        return False


def _broken_promises(p: SamplingParams, prompt: list[int], c: Completion, eos: set[int],
                     bad_words: tuple[tuple[int, ...], ...]) -> list[str]:
    if c.finish_reason == "error":
        # Only constraints that contradict each other may end a request that validated.
        return [] if str(c.error).startswith("no token satisfies") else [f"error: {c.error}"]
    out, broken = c.token_ids, []
    stops = (set() if p.ignore_eos else eos) | set(p.stop_token_ids)
    if len(out) > p.max_tokens or (c.finish_reason == "length" and len(out) != p.max_tokens):
        broken.append(f"{len(out)} tokens, finish {c.finish_reason}")
    if p.allowed_token_ids and not set(out) <= set(p.allowed_token_ids):
        broken.append("a token outside allowed_token_ids")
    if set(out[:p.min_tokens]) & (eos | set(p.stop_token_ids)):
        broken.append("an end token before min_tokens")
    if any(t in stops for t in out[max(p.min_tokens, 0):-1]):
        broken.append("went on past a stop token")
    if c.finish_reason == "stop" and not p.stop and out[-1] not in stops:
        broken.append("stop without a stop token")
    if any(out[i:i + len(w)] == list(w) for w in bad_words for i in range(len(out))):
        broken.append("a bad word written")
    if p.logprobs is not None and (len(c.logprobs) != len(out)
                                   or any(len(t.top_logprobs) != p.logprobs for t in c.logprobs)):
        broken.append("logprobs missing")
    if p.prompt_logprobs is not None and len(c.prompt_logprobs) != len(prompt) - 1:
        broken.append("prompt logprobs missing")
    # A prompt of random ids may end inside a character: its bytes come out as U+FFFD before the output's.
    if p.structured_output and c.finish_reason == "stop" and not p.stop:
        if not _matches(p.structured_output, c.text.lstrip("\ufffd")):
            broken.append(f"output {c.text!r} breaks the structured output")
    return broken


@pytest.mark.parametrize("seed, policy, budget, decode_steps, max_seqs, kv_mib", [
    (1, "sarathi", 64, 4, 256, 8),
    (2, "vllm", 256, 1, 4, 1),  # a small pool: preemptions
    (3, "fastserve", 2048, 4, 256, 1),
    (4, "fastserve+sarathi", 64, 1, 4, 1),
])
def test_random_mixes_of_options_keep_their_promises_in_any_batch(tiny_model_dir, seed, policy, budget,
                                                                   decode_steps, max_seqs, kv_mib):
    rng = random.Random(seed)
    engine = OfflineEngine(EngineConfig(model=str(tiny_model_dir), kv_cache_bytes=kv_mib << 20, swap_bytes=4 << 20),
                           SchedulerConfig(policy=policy, max_num_batched_tokens=budget, num_decode_steps=decode_steps,
                                           max_num_seqs=max_seqs))
    vocab, eos = engine.checkpoint.config.vocab_size, set(engine.checkpoint.eos_token_ids)
    for _ in range(4):
        batch = []
        while len(batch) < 12:
            prompt, params = [rng.randrange(6, vocab) for _ in range(rng.choice([1, 3, 20, 70]))], _params(rng, vocab)
            try:
                engine.validate(prompt, params)
            except SeawallError:  # e.g. a 70-token prompt that vllm's 64-token steps never fit
                continue
            batch.append((prompt, params))
        done = engine.generate([b[0] for b in batch], [b[1] for b in batch])
        for (prompt, params), c in zip(batch, done, strict=True):
            bad_words = bad_words_token_ids(engine.tokenizer, params.bad_words)
            assert not (broken := _broken_promises(params, prompt, c, eos, bad_words)), (broken, params)
            if params.temperature == 0 or params.seed is not None:
                (alone,) = engine.generate([prompt], [params])
                assert alone.token_ids == c.token_ids, params
