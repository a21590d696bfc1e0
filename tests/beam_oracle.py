"""transformers' beam search, the oracle of Seawall's (services/common/beam_search.py)."""

from __future__ import annotations

import torch

from services.common.beam_search import BeamParams


def hf_beams(model, prompt: list[int], beam: BeamParams) -> list[tuple[list[int], float]]:
    """``model.generate(num_beams=beam.width)``'s hypotheses of ``prompt``, best first: each one's tokens after
    the prompt (an end token it stopped at included, its padding cut) and its score. ``beam.end_token_ids`` are
    its eos ids (at least one: transformers has no "none")."""
    assert beam.width > 1, "transformers searches greedily with one beam"
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=beam.max_tokens,
                             num_beams=beam.width, num_return_sequences=beam.width, do_sample=False,
                             length_penalty=beam.length_penalty, early_stopping=beam.early_stopping,
                             eos_token_id=list(beam.end_token_ids), pad_token_id=0, return_dict_in_generate=True,
                             output_scores=True)
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()  # a generated position names the beam it came from
    return [(out.sequences[i, len(prompt):len(prompt) + n].tolist(), out.sequences_scores[i].item())
            for i, n in enumerate(lengths)]


def assert_beams_match(got, expected, rel: float = 1e-5) -> None:
    """Seawall's hypotheses (``Hypothesis``, or (tokens, score) pairs) equal transformers' token for token, and
    their scores to ``rel`` (the engine's logits and transformers' round differently in the last bits)."""
    pairs = [(h.token_ids, h.score) if hasattr(h, "token_ids") else h for h in got]
    assert [tokens for tokens, _ in pairs] == [tokens for tokens, _ in expected]
    for (_, score), (_, ref) in zip(pairs, expected, strict=True):
        assert abs(score - ref) <= rel * abs(ref) + 1e-5, (score, ref)
