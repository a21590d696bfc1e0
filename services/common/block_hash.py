"""Chained block hashes: the names KV blocks go by in the prefix cache and the kvcache service.

``hash[i] = H(hash[i-1], token ids of block i)`` with ``hash[-1]`` a seed derived from the model and the KV
layout (see ``common.proto``), so ``hash[i]`` names the whole prefix ``[0, (i + 1) * block_size)`` and KV of
another model or layout never matches. Full blocks are hashed; the scheduler core also names a finished
request's partly filled last block (``tail_hash``), which only it looks up. H is BLAKE2b truncated to 64 bits: stable
across processes, machines and Python versions (Python's ``hash`` is not, for strings).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

_MASK = (1 << 64) - 1


def hash_seed(model_name: str, block_size: int, layout: str = "") -> int:
    """``hash[-1]`` for a model and KV layout."""
    digest = hashlib.blake2b(f"seawall-v1|{model_name}|{block_size}|{layout}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@lru_cache(maxsize=256)
def salted_seed(seed: int, salt: str) -> int:
    """``hash[-1]`` for requests whose blocks must never match other requests' (``Request.hash_salt``): a
    LoRA adapter's (the same tokens hold other KV under an adapter), or a tenant's ``cache_salt``."""
    digest = hashlib.blake2b(f"{seed}|{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(array("q", tokens).tobytes())
    return int.from_bytes(h.digest(), "little") & _MASK


@dataclass(frozen=True)
class SwitchedSeed:
    """An activated LoRA's hashes (``Request.activated_salt``): its blocks before block ``at`` hold the base
    model's KV (the adapter applies from a token in block ``at`` on), so they are hashed as the base model's
    and shared with it; from block ``at`` on the chain is salted."""

    seed: int
    at: int
    salt: str


def extend_hashes(hashes: list[int], token_ids: Sequence[int], block_size: int,
                  seed: int | SwitchedSeed) -> list[int]:
    """Appends the hashes of every full block of ``token_ids`` not yet in ``hashes``; returns ``hashes``."""
    for i in range(len(hashes), len(token_ids) // block_size):
        hashes.append(block_hash(_parent(hashes, i, seed), token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


def tail_hash(hashes: Sequence[int], token_ids: Sequence[int], block_size: int, seed: int | SwitchedSeed,
              length: int) -> int:
    """The name of the partly filled block after the full blocks ``hashes`` name, holding the next ``length``
    (< block_size) tokens of ``token_ids``: the same chain, fewer tokens (so never a full block's name)."""
    i = len(hashes)
    return block_hash(_parent(hashes, i, seed), token_ids[i * block_size : i * block_size + length])


def _parent(hashes: Sequence[int], i: int, seed: int | SwitchedSeed) -> int:
    switched = seed if isinstance(seed, SwitchedSeed) else None
    parent = hashes[i - 1] if i else switched.seed if switched else seed
    if switched is not None and i == switched.at:
        parent = salted_seed(parent, switched.salt)
    return parent
