"""Beam search through the offline engine and ``seawall run-batch``, against transformers' ``generate(num_beams)``:
every hypothesis token for token, best first, its score to float32's rounding; under every kind of end (the
model's eos, extra end tokens, length), each ``early_stopping`` and several length penalties, and with block
sizes and pools that make the beams' steps share, evict and recompute cached blocks."""

from __future__ import annotations

import json

import pytest
import torch

from seawall.cli import main
from seawall.offline.engine import OfflineEngine
from services.common.beam_search import BeamParams
from services.engine.config import EngineConfig
from services.scheduler.core.config import SchedulerConfig
from tests.beam_oracle import assert_beams_match, hf_beams

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return OfflineEngine(EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                      kv_cache_bytes=16 << 20), SchedulerConfig(chunk_size=32))


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 4096, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _likely_token(engine, prompt: list[int], width: int, steps: int) -> int:
    """A token the beams will meet: the best hypothesis's ``steps``-th without it, made an end token so that
    hypotheses end by it mid-search."""
    free = engine.beam_search(prompt, BeamParams(width, steps, end_token_ids=tuple(engine.checkpoint.eos_token_ids)))
    return free[0].token_ids[steps - 1]


# (prompt length, width, length penalty, early_stopping, end by a likely token at step k or 0: never). Where
# hypotheses end by that token, a penalty <= 0 keeps them among the best (shorter sums score higher).
CASES = [
    (5, 2, 1.0, False, 0),
    (23, 3, 0.0, False, 3),
    (40, 4, 2.0, "never", 0),
    (16, 4, 0.0, True, 2),
    (33, 5, -1.0, False, 4),
    (70, 3, 0.5, "never", 0),
    (1, 6, 0.0, True, 5),
    (50, 3, -1.0, "never", 2),
]


@pytest.mark.parametrize("case", CASES, ids=[f"len{c[0]}-w{c[1]}-lp{c[2]}-es{c[3]}-end{c[4]}" for c in CASES])
def test_beam_search_equals_transformers(engine, hf_model, case):
    n, width, penalty, early, end_at = case
    prompt = _prompt(n, seed=n)
    ends = tuple(engine.checkpoint.eos_token_ids) + ((_likely_token(engine, prompt, width, end_at),) if end_at else ())
    beam = BeamParams(width, 12, penalty, early, ends)
    tails = engine.scheduler.prefix_stats.tail_tokens
    got = engine.beam_search(prompt, beam)
    assert len(got) == width
    assert engine.scheduler.prefix_stats.tail_tokens > tails  # steps copied the beams' partly filled blocks
    assert_beams_match(got, hf_beams(hf_model, prompt, beam))
    if end_at:
        assert any(h.finish_reason == "stop" for h in got)  # the case exercised an end mid-search
    engine.scheduler.check_integrity()
    assert not engine.scheduler.has_work


@pytest.mark.parametrize("block_size,kv_bytes", [(4, 16 << 20), (16, 1 << 20)], ids=["small-blocks", "small-pool"])
def test_beam_search_equals_transformers_when_blocks_are_small_or_few(tiny_model_dir, hf_model, block_size,
                                                                      kv_bytes):
    engine = OfflineEngine(EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                        block_size=block_size, kv_cache_bytes=kv_bytes), SchedulerConfig(chunk_size=8))
    prompt = _prompt(45, seed=3)
    beam = BeamParams(4, 10, 1.0, False, tuple(engine.checkpoint.eos_token_ids))
    assert_beams_match(engine.beam_search(prompt, beam), hf_beams(hf_model, prompt, beam))
    engine.scheduler.check_integrity()
    assert not engine.scheduler.has_work


def test_run_batch_returns_each_line_s_beams_as_its_choices(tmp_path, tiny_model_dir, hf_model):
    prompt = _prompt(20, seed=8)
    rows = [
        {"custom_id": "beams", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": prompt, "max_tokens": 9, "n": 3, "use_beam_search": True, "length_penalty": 0.5}},
        {"custom_id": "plain", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": prompt, "max_tokens": 4, "temperature": 0}},
        {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": prompt, "n": 2, "use_beam_search": True, "top_p": 0.5}},
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["run-batch", "-i", str(src), "-o", str(dst), "--model", str(tiny_model_dir), "--device", "cpu",
                 "--dtype", "float32"]) == 0
    out = {line["custom_id"]: line for line in map(json.loads, dst.read_text().splitlines())}
    body = out["beams"]["response"]["body"]
    eos = hf_model.generation_config.eos_token_id
    expected = hf_beams(hf_model, prompt, BeamParams(3, 9, 0.5, False, tuple(eos if isinstance(eos, list) else [eos])))
    assert [c["token_ids"] for c in body["choices"]] == [tokens for tokens, _ in expected]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == sum(len(tokens) for tokens, _ in expected)
    assert out["plain"]["response"]["status_code"] == 200
    assert out["bad"]["response"]["status_code"] == 400
    assert "top_p cannot be used with beam search" in out["bad"]["error"]["message"]
