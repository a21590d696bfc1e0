"""The oracle checks the end-to-end tests share (tests/e2e/conftest.py), checked against generation."""

from __future__ import annotations

from tests.e2e.conftest import greedy_misses, random_prompts


def test_teacher_forcing_finds_exactly_the_tokens_greedy_generation_would_not_have_chosen(hf_model, hf_greedy):
    prompt = random_prompts([30], seed=11)[0]
    out = hf_greedy(prompt, 60)
    assert len(out) == 60 and greedy_misses(hf_model, prompt, out) == []
    wrong = list(out)
    wrong[17] = (wrong[17] + 1) % 4096
    assert greedy_misses(hf_model, prompt, wrong)[:1] == [17]
