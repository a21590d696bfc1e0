"""Block files: header, checksum, atomic replace, and every way a file can go bad (each is a miss, deleted)."""

from __future__ import annotations

import dataclasses
import os
import zlib

import numpy as np
import pytest
import torch

from services.engine.kv_pool import KVLayout
from services.kvcache.disk_tier import (
    HEADER_BYTES,
    DiskTier,
    ReadStatus,
    decode_header,
    encode_header,
    file_bytes,
)
from tests.kvcache.conftest import BPB, LAYOUT

pytestmark = pytest.mark.timeout(30)


def _data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BPB, dtype=np.uint8)


def _read(disk: DiskTier, h: int, layout: KVLayout = LAYOUT) -> tuple[ReadStatus, np.ndarray]:
    out = np.zeros(layout.bytes_per_block, dtype=np.uint8)
    return disk.read_into(h, layout, memoryview(out)), out


def test_the_header_round_trips_and_names_hash_layout_and_checksum():
    head = encode_header(0xDEADBEEF_01234567, LAYOUT, BPB, 12345)
    assert len(head) == HEADER_BYTES == 64 and head[:4] == b"SWKV"
    h = decode_header(head)
    assert (h.block_hash, h.data_len, h.data_crc, h.layout) == (0xDEADBEEF_01234567, BPB, 12345, LAYOUT)
    for i in (0, 9, 30, 61):  # any flipped byte, header CRC included
        bad = bytearray(head)
        bad[i] ^= 1
        assert decode_header(bytes(bad)) is None
    assert decode_header(head[:63]) is None
    assert file_bytes(LAYOUT) == BPB + 64
    latent = dataclasses.replace(LAYOUT, num_parts=1)  # one tensor per layer (DeepSeek-V3's latent)
    assert decode_header(encode_header(7, latent, latent.bytes_per_block, 1)).layout == latent
    old = bytearray(head)  # a file from before the parts field: zero there means keys and values
    old[48:52] = bytes(4)
    old[60:64] = zlib.crc32(bytes(old[:60])).to_bytes(4, "little")
    assert decode_header(bytes(old)).layout == LAYOUT


def test_a_block_written_reads_back_exactly(tmp_path):
    disk = DiskTier(tmp_path)
    data = _data(1)
    assert disk.write(2**64 - 1, LAYOUT, memoryview(data)) == BPB + 64
    assert disk.path(2**64 - 1).name == "ffffffffffffffff.kv" and disk.path(2**64 - 1).parent.name == "ff"
    status, out = _read(disk, 2**64 - 1)
    assert status is ReadStatus.OK and np.array_equal(out, data)
    assert disk.write(2**64 - 1, LAYOUT, memoryview(_data(2))) == BPB + 64  # replaced atomically
    assert np.array_equal(_read(disk, 2**64 - 1)[1], _data(2))
    assert _read(disk, 5)[0] is ReadStatus.MISSING
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("damage", ["flip data", "flip header", "truncate", "append", "empty", "other layout",
                                    "other hash"])
def test_a_damaged_file_is_corrupt_and_deleted(tmp_path, damage):
    disk = DiskTier(tmp_path)
    h = 0x1234
    disk.write(h, LAYOUT, memoryview(_data(1)))
    path = disk.path(h)
    raw = bytearray(path.read_bytes())
    layout = LAYOUT
    if damage == "flip data":
        raw[HEADER_BYTES + BPB // 2] ^= 0x80
    elif damage == "flip header":
        raw[20] ^= 0x01
    elif damage == "truncate":
        raw = raw[:-1]
    elif damage == "append":
        raw += b"\0"
    elif damage == "empty":
        raw = bytearray()
    elif damage == "other layout":
        layout = KVLayout(2, 16, 2, 16, torch.bfloat16)  # same size, different dtype
    elif damage == "other hash":
        disk.write(0x9999, LAYOUT, memoryview(_data(1)))
        raw = bytearray(disk.path(0x9999).read_bytes())
    path.write_bytes(bytes(raw))
    status, _ = _read(disk, h, layout)
    assert status is ReadStatus.CORRUPT and not path.exists()
    assert _read(disk, h)[0] is ReadStatus.MISSING


def test_scan_lists_sound_files_oldest_first_and_deletes_the_rest(tmp_path):
    disk = DiskTier(tmp_path)
    for i, h in enumerate([0x30, 0x10, 0x20]):
        disk.write(h, LAYOUT, memoryview(_data(i)))
        os.utime(disk.path(h), ns=(10**18 + i, 10**18 + i))
    disk.write(0x40, LAYOUT, memoryview(_data(9)))
    disk.path(0x40).write_bytes(disk.path(0x40).read_bytes()[:100])  # truncated: bad size
    (tmp_path / "blocks" / "00" / "junk.kv").write_bytes(b"not a block")
    disk.path(0x20).rename(disk.path(0x50))  # misnamed: its header says 0x20
    (tmp_path / "tmp" / "half-written").write_bytes(b"x")

    disk = DiskTier(tmp_path)  # a restart
    assert not (tmp_path / "tmp" / "half-written").exists()
    files, dropped = disk.scan()
    assert [f.block_hash for f in files] == [0x30, 0x10] and dropped == 3
    assert all(f.nbytes == BPB + 64 and f.layout == LAYOUT for f in files)
    assert sorted(p.name for p in (tmp_path / "blocks").rglob("*.kv")) == ["0000000000000010.kv",
                                                                           "0000000000000030.kv"]
