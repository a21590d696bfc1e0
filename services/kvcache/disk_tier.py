"""The disk tier's files: one file per block, named by its hash, with a checked header and a checksum.

Directory::

    <root>/blocks/<first hex byte of hash>/<hash as 16 hex digits>.kv    one block
    <root>/tmp/                                                         files being written (removed on start)

File (little endian)::

    offset  size  field
         0     4  magic b"SWKV"
         4     2  format version (1)
         6     2  header size (64)
         8     8  block hash (must equal the name)
        16     8  data length (bytes) = the layout's bytes_per_block
        24     4  CRC-32 of the data
        28    20  layout: block_size, num_layers, num_kv_heads, head_dim, KVDtype (u32 each)
        48     4  tensors per layer (u32): 1 for a latent, 2 (or 0, files from before this field) for K and V
        52     8  zero
        60     4  CRC-32 of bytes 0..59
        64     n  the block's bytes, exactly as in a block-major pool

A file is written under ``tmp/`` and renamed into place, so a reader sees a whole file or none; it is not
fsynced (this is a cache: a file torn by a crash fails its checks and is dropped). A reader checks the header,
the size and the data CRC; anything wrong means the file is deleted and the block is a miss. CRC-32 (zlib)
rather than BLAKE2b: it catches every burst of ≤ 32 flipped bits and truncation, which is what disks do, at
~2.6 GB/s here against 0.53 GB/s for BLAKE2b — the checksum must not be slower than the disk.

This class is file mechanics only: the index (which hashes are where, LRU order, capacity) is the store's.
Its methods block on I/O; the store calls them from worker threads. They are safe to call concurrently for
different hashes, and for the same hash (a rename replaces a file atomically; a reader holds its inode).
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import shutil
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from services.engine.kv_pool import KVLayout
from services.kvcache.layout import TORCH_DTYPES, dtype_code

log = logging.getLogger(__name__)

MAGIC = b"SWKV"
VERSION = 1
_HEADER = struct.Struct("<4sHHQQIIIIIII8x")  # everything before the header CRC
_HEADER_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _HEADER_CRC.size
assert HEADER_BYTES == 64


class ReadStatus(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # no such file (deleted meanwhile)
    CORRUPT = "corrupt"  # the file failed a check and was deleted


@dataclass(frozen=True)
class Header:
    block_hash: int
    data_len: int
    data_crc: int
    layout: KVLayout


@dataclass(frozen=True)
class ScannedFile:
    block_hash: int
    nbytes: int  # file size, header included
    mtime_ns: int
    layout: KVLayout


def file_bytes(layout: KVLayout) -> int:
    """Size of one block's file (bytes): what it costs the disk tier's capacity."""
    return HEADER_BYTES + layout.bytes_per_block


def encode_header(block_hash: int, layout: KVLayout, data_len: int, data_crc: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, block_hash, data_len, data_crc, layout.block_size,
                        layout.num_layers, layout.num_kv_heads, layout.head_dim, dtype_code(layout.dtype),
                        layout.num_parts)
    return head + _HEADER_CRC.pack(zlib.crc32(head))


def decode_header(buf: bytes | memoryview) -> Header | None:
    """The header at the start of ``buf``; None when it is short, foreign or fails its CRC."""
    if len(buf) < HEADER_BYTES:
        return None
    head = bytes(buf[:_HEADER.size])
    (crc,) = _HEADER_CRC.unpack_from(buf, _HEADER.size)
    if zlib.crc32(head) != crc:
        return None
    magic, version, size, h, data_len, data_crc, bs, nl, nkv, hd, dt, parts = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION or size != HEADER_BYTES or dt not in TORCH_DTYPES:
        return None
    layout = KVLayout(num_layers=nl, block_size=bs, num_kv_heads=nkv, head_dim=hd, dtype=TORCH_DTYPES[dt],
                      num_parts=parts or 2)
    return Header(h, data_len, data_crc, layout)


class AtomicFiles:
    """Whole files written into place: each under ``tmp`` (emptied now: leftovers of writes a crash
    interrupted) with a name of its own, then renamed over the final path, so a reader sees a whole file or
    none. Safe from several threads at once."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._made: set[Path] = set()
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def write(self, final: Path, parts: list[bytes | memoryview]) -> None:
        """``parts``, in order, as the file at ``final`` (replacing any). OSError (disk full...) propagates."""
        if final.parent not in self._made:
            final.parent.mkdir(exist_ok=True)
            self._made.add(final.parent)
        with self._lock:
            n = next(self._seq)
        tmp = self._tmp / f"{final.name}.{n}"
        try:
            with open(tmp, "wb", buffering=0) as f:
                for part in parts:
                    _write_all(f, part)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


class DiskTier:
    """Block files under ``root`` (created if missing)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self._blocks = self.root / "blocks"
        self._blocks.mkdir(parents=True, exist_ok=True)
        self._files = AtomicFiles(self.root / "tmp")

    def path(self, block_hash: int) -> Path:
        return self._blocks / f"{block_hash >> 56:02x}" / f"{block_hash:016x}.kv"

    def write(self, block_hash: int, layout: KVLayout, data: memoryview) -> int:
        """Writes one block's file (replacing any); returns its size. OSError (disk full...) propagates."""
        header = encode_header(block_hash, layout, len(data), zlib.crc32(data))
        self._files.write(self.path(block_hash), [header, data])
        return HEADER_BYTES + len(data)

    def read_into(self, block_hash: int, layout: KVLayout, out: memoryview) -> ReadStatus:
        """Reads one block's bytes into ``out`` (``bytes_per_block`` long) and checks them. On CORRUPT the
        file is gone and ``out`` holds undefined bytes; the caller must not serve them."""
        path = self.path(block_hash)
        try:
            with open(path, "rb", buffering=0) as f:
                problem = _check_file(f, block_hash, layout, out)
        except FileNotFoundError:
            return ReadStatus.MISSING
        except OSError as e:
            problem = f"cannot be read ({e})"
        if problem:
            log.warning("block file %s %s: deleted, the block is a miss", path, problem)
            self.delete(block_hash)
            return ReadStatus.CORRUPT
        try:
            os.utime(path)  # the LRU order a restart rebuilds from mtimes
        except OSError:
            pass
        return ReadStatus.OK

    def delete(self, block_hash: int) -> None:
        self.path(block_hash).unlink(missing_ok=True)

    def scan(self) -> tuple[list[ScannedFile], int]:
        """Every block file whose header is sound and whose size matches it, oldest mtime first; files that
        are not deleted. Returns (files, number deleted). The data CRC is checked on read, not here."""
        found: list[ScannedFile] = []
        dropped = 0
        for sub in self._blocks.iterdir():
            for path in (sub.iterdir() if sub.is_dir() else ()):
                entry = _scan_one(path)
                if entry is None:
                    log.warning("block file %s has a bad header or size: deleted", path)
                    path.unlink(missing_ok=True)
                    dropped += 1
                else:
                    found.append(entry)
        found.sort(key=lambda e: e.mtime_ns)
        return found, dropped


def _check_file(f, block_hash: int, layout: KVLayout, out: memoryview) -> str:
    """What is wrong with an open block file, or "" when its bytes (now in ``out``) are sound."""
    head = f.read(HEADER_BYTES)
    header = decode_header(head)
    if header is None:
        return "has a bad header"
    if header.block_hash != block_hash or header.layout != layout or header.data_len != len(out):
        return (f"holds block {header.block_hash:016x} of layout {header.layout} ({header.data_len} bytes), "
                f"not {block_hash:016x} of {layout}")
    got = _read_all(f, out)
    if got != len(out) or f.read(1):
        return f"is truncated or too long ({HEADER_BYTES + (got or 0)} bytes read, {HEADER_BYTES + len(out)} due)"
    if zlib.crc32(out) != header.data_crc:
        return "fails its checksum"
    return ""


def _scan_one(path: Path) -> ScannedFile | None:
    try:
        with open(path, "rb", buffering=0) as f:
            header = decode_header(f.read(HEADER_BYTES))
            st = os.fstat(f.fileno())
    except OSError:
        return None
    if header is None or path.name != f"{header.block_hash:016x}.kv" \
            or st.st_size != HEADER_BYTES + header.data_len or header.data_len != header.layout.bytes_per_block:
        return None
    return ScannedFile(header.block_hash, st.st_size, st.st_mtime_ns, header.layout)


def _read_all(f, out: memoryview) -> int:
    view = out.cast("B") if out.format != "B" else out
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            break
        done += n
    return done


def _write_all(f, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = f.write(view)
        view = view[n:]
