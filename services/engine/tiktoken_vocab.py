"""A tokenizer shipped as tiktoken BPE ranks (Kimi K2's ``tiktoken.model``), read as a `tokenizers` Tokenizer
that encodes and decodes as tiktoken does, so that such a checkpoint loads without its tokenizer's Python code
(which transformers would run with ``trust_remote_code``) and without tiktoken.

The ranks file holds one base64 token and its rank per line. tiktoken encodes each piece its pattern splits
off by looking it up whole, else by merging, again and again, the adjacent pair whose join ranks lowest. A
byte-level BPE does the same with every split of every token into two tokens as a merge, ordered by the
joined token's rank, and ``ignore_merges`` for the whole-piece lookup (how Llama 3's tokenizer.json was made
from its tiktoken file; transformers' ``TikTokenConverter``). The pattern is not in any file the checkpoint
ships as data: it is in the tokenizer's code, so each known tokenizer class has its pattern here.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from services.common.errors import ModelLoadError

RANKS_FILE = "tiktoken.model"
# Kimi K2's (tokenization_kimi.py): CJK runs on their own; words with their case and contractions; up to three
# digits; punctuation runs; whitespace. Character-class intersection (&&) is read by Oniguruma as by tiktoken.
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# tokenizer_config.json's class -> (its split pattern, how many special-token ids follow the ranks).
KNOWN_CLASSES = {"tokenization_kimi.TikTokenTokenizer": (KIMI_PATTERN, 256 + 2)}


def read_ranks(path: Path) -> dict[bytes, int]:
    """``token_base64 rank`` per line, as tiktoken's ``load_tiktoken_bpe`` reads it."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise ModelLoadError(f"{path}:{number}: not a tiktoken rank line (base64 token, rank): {exc}") from exc
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ModelLoadError(f"{path}: ranks must number the tokens 0..{len(ranks) - 1} once each")
    return ranks


def tiktoken_tokenizer(ranks: dict[bytes, int], pattern: str, special: dict[str, int],
                       kept: frozenset[str] = frozenset()) -> Tokenizer:
    """The byte-level BPE that encodes as tiktoken's ``Encoding(pat_str=pattern, mergeable_ranks=ranks,
    special_tokens=special)`` does with every special token allowed. Those in ``kept`` are not special to
    `tokenizers` (decoding keeps them when it skips special tokens: Kimi K2's tool-call markers)."""
    as_text = _byte_chars()
    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        splits = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        merges += [(rank, ranks[left], ranks[right], left, right) for left, right in splits]
    merges.sort(key=lambda m: m[:3])
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[(as_text(m[3]), as_text(m[4])) for m in merges],
                                     ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    for name, token_id in sorted(special.items(), key=lambda item: item[1]):
        if name in kept:
            tokenizer.add_tokens([AddedToken(name, special=False, normalized=False)])
        else:
            tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False)])
        if tokenizer.token_to_id(name) != token_id:
            raise ModelLoadError(f"special token {name!r} has id {token_id}, but the ranks end at {len(ranks)} and "
                                 "the special tokens must follow them without gaps")
    return tokenizer


def load_tiktoken_dir(path: Path, tokenizer_config: dict) -> Tokenizer:
    """A checkpoint's ``tiktoken.model`` with the pattern of the class its tokenizer_config.json names and the
    special tokens it lists (ids it leaves out are ``<|reserved_token_ID|>``, as Kimi's code names them); those
    it marks ``"special": false`` are kept when decoding skips special tokens, as transformers keeps them."""
    cls = auto_tokenizer_class(tokenizer_config)
    if cls not in KNOWN_CLASSES:
        raise ModelLoadError(f"{path} has {RANKS_FILE} but its tokenizer class {cls!r} is not one whose split "
                             f"pattern is known ({', '.join(KNOWN_CLASSES)}); add a tokenizer.json")
    pattern, count = KNOWN_CLASSES[cls]
    ranks = read_ranks(path / RANKS_FILE)
    named, kept = {}, set()
    for key, entry in (tokenizer_config.get("added_tokens_decoder") or {}).items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str) or not str(key).isdigit():
            raise ModelLoadError(f"{path}/tokenizer_config.json: added_tokens_decoder[{key!r}] must map an id to "
                                 "an object with a content string")
        named[int(key)] = content
        if entry.get("special") is False:
            kept.add(content)
    special = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(len(ranks), len(ranks) + count)}
    return tiktoken_tokenizer(ranks, pattern, special, frozenset(kept))


def auto_tokenizer_class(tokenizer_config: dict) -> str | None:
    """The tokenizer class a ``tokenizer_config.json`` names for remote code (``auto_map``), e.g.
    ``tokenization_kimi.TikTokenTokenizer``; None when it names none."""
    auto = (tokenizer_config.get("auto_map") or {}).get("AutoTokenizer") or [None]
    return auto[0] if isinstance(auto, list) else auto


def _byte_chars():
    """GPT-2's printable stand-in for each byte (what byte-level BPE vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return lambda token: "".join(chars[b] for b in token)
