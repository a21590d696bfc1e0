"""Tokenizers shipped as tiktoken ranks (services/engine/tiktoken_vocab.py) against tiktoken itself: ranks
trained by tiktoken's own trainer, then any text (letters of every case, CJK, digits, punctuation, whitespace
runs, emoji, special tokens) encodes to the ids tiktoken gives and decodes to its text."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import ModelLoadError
from services.engine.checkpoint import load_checkpoint_meta
from services.engine.tiktoken_vocab import KIMI_PATTERN, load_tiktoken_dir, tiktoken_tokenizer

tiktoken = pytest.importorskip("tiktoken")
from tiktoken._educational import bpe_train  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHINESE = "你好世界，今天天气很好。我们去公园散步吧！天下大事，分久必合，合久必分。"
# A pattern other than the one tested, so that the ranks hold merges across what Kimi's pattern splits apart.
TRAIN_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPECIAL = ["[BOS]", "[EOS]", "<|im_end|>", "<|tool_call_begin|>"]


# Tokens no merge reaches (no split of them is two tokens), which tiktoken still takes whole, as released
# vocabularies have some.
UNREACHABLE = [b"zqxj", b" zqxj"]


WORDS = ("the server serving request requests token tokens cache cached prefill decode burst bursts stall "
         "schedule scheduler chunk chunks block blocks memory KV GPU NIXL Seawall's isn't they're we'll "
         "latency throughput 2048 16 3.14 -> == {} [] () : ; , . ! ? \n").split(" ")


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    """Trained on a fixed text (not a file of the repo, which changes), so every run has the same ranks."""
    rng = random.Random(5)
    text = " ".join(rng.choice(WORDS) for _ in range(1500)) + CHINESE * 3
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints every merge
        trained = bpe_train(text, 400, TRAIN_PATTERN)
    return {**trained, **{token: len(trained) + i for i, token in enumerate(UNREACHABLE)}}


@pytest.fixture(scope="module")
def pair(ranks):
    special = {name: len(ranks) + i for i, name in enumerate(SPECIAL)}
    oracle = tiktoken.Encoding("oracle", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=special)
    return oracle, tiktoken_tokenizer(ranks, KIMI_PATTERN, special)


PIECES = st.sampled_from(["the", "The", "THE", " server", "'s", "'LL", "don't", "Ünïcödé", "ǅungla", "12345", "3.14",
                          " ", "  ", "\n", "\r\n", "\t", " \n\n ", "!!", "...", "->", "你好", "世界。", "😀", "é",
                          "\u0301", "\u200b", *SPECIAL, "<|im_", "[BO", "zqxj", " zqxj"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=30).map("".join))
def test_any_text_encodes_and_decodes_as_tiktoken_does(pair, text):
    oracle, tokenizer = pair
    ids = tokenizer.encode(text).ids
    assert ids == oracle.encode(text, allowed_special="all")
    assert tokenizer.decode(ids, skip_special_tokens=False) == oracle.decode(ids)


def test_prose_encodes_as_tiktoken_does(pair):
    oracle, tokenizer = pair
    text = (REPO / "docs" / "design.md").read_text()[:20000] + CHINESE
    assert tokenizer.encode(text).ids == oracle.encode(text, allowed_special="all")


def write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    path.write_text("".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks.items()))


KIMI_CONFIG = {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
               "added_tokens_decoder": {}, "bos_token": "[BOS]", "eos_token": "[EOS]"}


def kimi_dir(tmp_path: Path, tiny_model_dir: Path, ranks: dict[bytes, int]) -> Path:
    """A checkpoint whose tokenizer is tiktoken ranks and Kimi K2's class: no tokenizer.json."""
    out = tmp_path / "kimi"
    out.mkdir()
    shutil.copy(tiny_model_dir / "config.json", out / "config.json")
    write_ranks(out / "tiktoken.model", ranks)
    named = {str(len(ranks) + i): {"content": name, "special": name != "<|tool_call_begin|>"}
             for i, name in enumerate(SPECIAL)}
    (out / "tokenizer_config.json").write_text(json.dumps({**KIMI_CONFIG, "added_tokens_decoder": named}))
    return out


def test_a_checkpoint_with_kimi_ranks_loads_its_tokenizer_with_its_special_tokens(tmp_path, tiny_model_dir, ranks):
    meta = load_checkpoint_meta(kimi_dir(tmp_path, tiny_model_dir, ranks))
    tokenizer, n = meta.tokenizer, len(ranks)
    assert [tokenizer.token_to_id(name) for name in SPECIAL] == [n, n + 1, n + 2, n + 3]
    # Ids the config does not name are reserved, as Kimi's code names them: 256 + 2 in all.
    assert tokenizer.token_to_id(f"<|reserved_token_{n + 4}|>") == n + 4
    assert tokenizer.get_vocab_size() == n + 258 and tokenizer.id_to_token(n + 258) is None
    # Decoding that skips special tokens keeps those the config marks "special": false (a tool-call marker).
    call = tokenizer.encode("[BOS]<|tool_call_begin|>x").ids
    assert tokenizer.decode(call) == "<|tool_call_begin|>x" and tokenizer.decode(call, skip_special_tokens=False) \
        == "[BOS]<|tool_call_begin|>x"
    oracle = tiktoken.Encoding("oracle", pat_str=KIMI_PATTERN, mergeable_ranks=ranks,
                               special_tokens={name: n + i for i, name in enumerate(SPECIAL)})
    prompt = "[BOS]Hello, 世界!<|im_end|>"
    assert tokenizer.encode(prompt).ids == oracle.encode(prompt, allowed_special="all")


def test_what_cannot_be_read_is_refused_naming_the_file(tmp_path, tiny_model_dir, ranks):
    path = kimi_dir(tmp_path, tiny_model_dir, ranks)
    with pytest.raises(ModelLoadError, match="tokenizer class 'tokenization_qwen.QWenTokenizer' is not one whose"):
        load_tiktoken_dir(path, {"auto_map": {"AutoTokenizer": ["tokenization_qwen.QWenTokenizer", None]}})
    with pytest.raises(ModelLoadError, match="must map an id to an object with a content string"):
        load_tiktoken_dir(path, {**KIMI_CONFIG, "added_tokens_decoder": {"x": {"content": "[BOS]"}}})
    (path / "tiktoken.model").write_text("IQ== 0\nnot-base64 1\n")
    with pytest.raises(ModelLoadError, match=r"tiktoken.model:2: not a tiktoken rank line"):
        load_tiktoken_dir(path, KIMI_CONFIG)
    (path / "tiktoken.model").write_text("IQ== 0\nIg== 2\n")
    with pytest.raises(ModelLoadError, match="ranks must number the tokens 0..1 once each"):
        load_tiktoken_dir(path, KIMI_CONFIG)
    (path / "tiktoken.model").unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer.json .* and no tiktoken.model"):
        load_checkpoint_meta(path)


@pytest.mark.oracle
def test_a_kimi_k2_shaped_checkpoint_serves_text_as_transformers_and_tiktoken_do(tmp_path, tiny_model_dir, ranks):
    """DeepSeek-V3's architecture (Kimi K2's) with its tokenizer as tiktoken ranks: a text prompt encodes as
    tiktoken encodes it, greedy tokens are transformers', and the streamed text is tiktoken's decoding."""
    pytest.importorskip("transformers")
    from seawall.offline.engine import OfflineEngine
    from services.common.sampling_params import SamplingParams
    from services.engine.config import EngineConfig
    from services.scheduler.core.scheduler import SchedulerConfig
    from tests.engine.test_architectures import CASES, assert_matches_transformers, save_checkpoint

    config = CASES["deepseek-v3"]()
    config.vocab_size = len(ranks) + 258
    path = kimi_dir(tmp_path, tiny_model_dir, ranks)
    model = save_checkpoint(config, path, tiny_model_dir)
    (path / "tokenizer.json").unlink()  # the ranks are the tokenizer
    write_ranks(path / "tiktoken.model", ranks)
    named = {str(len(ranks) + i): {"content": name, "special": True} for i, name in enumerate(SPECIAL)}
    (path / "tokenizer_config.json").write_text(json.dumps({**KIMI_CONFIG, "added_tokens_decoder": named}))
    special = {name: len(ranks) + i for i, name in enumerate(SPECIAL)}  # and the reserved rest, as Kimi's code
    special |= {f"<|reserved_token_{i}|>": i for i in range(len(ranks) + len(SPECIAL), len(ranks) + 258)}
    oracle = tiktoken.Encoding("oracle", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=special)
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig(chunk_size=16))
    prompt = engine.encode("[BOS]The server's cache, 你好世界 — 12345 tokens.<|im_end|>")
    assert prompt == oracle.encode("[BOS]The server's cache, 你好世界 — 12345 tokens.<|im_end|>",
                                   allowed_special="all")
    (out,) = engine.generate([prompt], [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0,
                                                       skip_special_tokens=False)])
    assert_matches_transformers(model, [prompt], [out])
    # As vLLM's, the stream holds back a character whose bytes are not all generated yet: cut there by
    # max_tokens, it never arrives (tiktoken decodes those bytes as U+FFFD).
    assert oracle.decode(out.token_ids) in (out.text, out.text + "\ufffd")
