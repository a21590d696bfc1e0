"""Recurrent states on the disk tier: one file per state, named by the hash of the block it follows, beside the
block files (disk_tier.py) and checked the same way.

Directory::

    <root>/states/<first hex byte of hash>/<hash as 16 hex digits>.st    one state
    <root>/states.tmp/                                                   files being written (removed on start)

File (little endian)::

    offset  size  field
         0     4  magic b"SWST"
         4     2  format version (1)
         6     2  header size (40)
         8     8  block hash (must equal the name)
        16     4  tokens the state took in
        20     4  layers
        24     8  data length (bytes)
        32     4  CRC-32 of the data
        36     4  CRC-32 of bytes 0..35
        40     n  data: per layer its conv and ssm lengths (u64 each), then each layer's conv and ssm bytes

Written under ``states.tmp/`` and renamed into place, not fsynced (a cache: a torn file fails its checks and is
deleted). File mechanics only: the index is the state store's. Methods block on I/O; call them from threads.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from services.kvcache.disk_tier import AtomicFiles
from services.kvcache.state_store import StoredState

log = logging.getLogger(__name__)

MAGIC = b"SWST"
VERSION = 1
_HEADER = struct.Struct("<4sHHQIIQI")
_HEADER_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _HEADER_CRC.size
assert HEADER_BYTES == 40
_LENGTHS = struct.Struct("<QQ")


@dataclass(frozen=True)
class ScannedState:
    block_hash: int
    nbytes: int  # file size, header included
    mtime_ns: int


class StateFiles:
    """State files under ``root`` (created if missing)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self._states = self.root / "states"
        self._states.mkdir(parents=True, exist_ok=True)
        self._files = AtomicFiles(self.root / "states.tmp")

    def path(self, block_hash: int) -> Path:
        return self._states / f"{block_hash >> 56:02x}" / f"{block_hash:016x}.st"

    @staticmethod
    def nbytes(state: StoredState) -> int:
        """The size of ``state``'s file."""
        return HEADER_BYTES + _LENGTHS.size * len(state.layers) + state.nbytes

    def write(self, block_hash: int, state: StoredState) -> int:
        """Writes one state's file (replacing any); returns its size. OSError (disk full...) propagates."""
        table = b"".join(_LENGTHS.pack(len(conv), len(ssm)) for conv, ssm in state.layers)
        parts = [table, *(b for layer in state.layers for b in layer)]
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        data_len = sum(map(len, parts))
        head = _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, block_hash, state.num_tokens, len(state.layers),
                            data_len, crc)
        self._files.write(self.path(block_hash), [head, _HEADER_CRC.pack(zlib.crc32(head)), *parts])
        return HEADER_BYTES + data_len

    def read(self, block_hash: int) -> StoredState | None:
        """The state in ``block_hash``'s file, checked; None when there is none, or it fails a check (then the
        file is deleted)."""
        path = self.path(block_hash)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raw, problem = b"", f"cannot be read ({e})"
        else:
            state, problem = _decode(raw, block_hash)
            if state is not None:
                try:
                    os.utime(path)  # the LRU order a restart rebuilds from mtimes
                except OSError:
                    pass
                return state
        log.warning("state file %s %s: deleted, the state is a miss", path, problem)
        self.delete(block_hash)
        return None

    def delete(self, block_hash: int) -> None:
        self.path(block_hash).unlink(missing_ok=True)

    def scan(self) -> list[ScannedState]:
        """Every state file whose header is sound and whose size matches it, oldest mtime first; others are
        deleted. The data CRC is checked on read, not here."""
        found: list[ScannedState] = []
        for sub in self._states.iterdir():
            for path in (sub.iterdir() if sub.is_dir() else ()):
                entry = _scan_one(path)
                if entry is None:
                    log.warning("state file %s has a bad header or size: deleted", path)
                    path.unlink(missing_ok=True)
                else:
                    found.append(entry)
        found.sort(key=lambda e: e.mtime_ns)
        return found


def _header(raw: bytes) -> tuple[int, int, int, int, int] | None:
    """(hash, tokens, layers, data length, data CRC) of a sound header, else None."""
    if len(raw) < HEADER_BYTES:
        return None
    head = raw[: _HEADER.size]
    (crc,) = _HEADER_CRC.unpack_from(raw, _HEADER.size)
    if zlib.crc32(head) != crc:
        return None
    magic, version, size, h, tokens, layers, data_len, data_crc = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION or size != HEADER_BYTES:
        return None
    return h, tokens, layers, data_len, data_crc


def _decode(raw: bytes, block_hash: int) -> tuple[StoredState | None, str]:
    header = _header(raw)
    if header is None:
        return None, "has a bad header"
    h, tokens, num_layers, data_len, data_crc = header
    if h != block_hash:
        return None, f"holds the state after block {h:016x}, not {block_hash:016x}"
    data = memoryview(raw)[HEADER_BYTES:]
    if len(data) != data_len:
        return None, f"is truncated or too long ({len(raw)} bytes, {HEADER_BYTES + data_len} due)"
    if zlib.crc32(data) != data_crc:
        return None, "fails its checksum"
    lengths = [_LENGTHS.unpack_from(data, i * _LENGTHS.size) for i in range(num_layers)]
    at, layers = num_layers * _LENGTHS.size, []
    for conv_len, ssm_len in lengths:
        layers.append((bytes(data[at: at + conv_len]), bytes(data[at + conv_len: at + conv_len + ssm_len])))
        at += conv_len + ssm_len
    if at != data_len:
        return None, "has layer lengths that do not add up to its data"
    return StoredState(tokens, layers), ""


def _scan_one(path: Path) -> ScannedState | None:
    try:
        with open(path, "rb") as f:
            header = _header(f.read(HEADER_BYTES))
            st = os.fstat(f.fileno())
    except OSError:
        return None
    if header is None or path.name != f"{header[0]:016x}.st" or st.st_size != HEADER_BYTES + header[3]:
        return None
    return ScannedState(header[0], st.st_size, st.st_mtime_ns)
