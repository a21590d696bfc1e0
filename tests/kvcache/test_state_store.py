"""The state store's bookkeeping with plain data and real files: which prefix a stored state resumes,
least-recently-used eviction within its bytes in each tier, pins, states too large to keep, the disk tier's
write-back on eviction and at shutdown, reads back and recovery after a restart, and damaged files."""

from __future__ import annotations

import pytest

from services.kvcache.state_files import StateFiles
from services.kvcache.state_store import StateStore, StoredState

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _state(nbytes: int, tokens: int = 16, fill: bytes = b"c") -> StoredState:
    return StoredState(tokens, [(fill * (nbytes // 2), b"s" * (nbytes - nbytes // 2))])


async def test_the_deepest_prefix_a_state_follows():
    states = StateStore(1000)
    assert await states.put(12, _state(100, 32)) and await states.put(14, _state(100, 64))
    assert states.deepest([11, 12, 13, 14, 15]) == 4
    assert states.deepest([11, 12, 13]) == 2
    assert states.deepest([11]) == 0 and states.deepest([]) == 0
    assert (await states.get(12)).num_tokens == 32 and await states.get(99) is None


async def test_room_is_made_least_recently_used_first_and_a_lookup_touches_nothing():
    states = StateStore(300)
    for h in (1, 2, 3):
        assert await states.put(h, _state(100))
    await states.get(1)  # a load: 2 is now the least recently used
    states.deepest([3, 2])  # a lookup: no use
    assert await states.put(4, _state(100))
    assert 2 not in states and all(h in states for h in (1, 3, 4))
    assert (states.used_bytes, states.num_evictions, len(states)) == (300, 1, 3)
    assert await states.put(5, _state(250))  # three go for one
    assert (len(states), states.used_bytes, states.num_evictions) == (1, 250, 4)


async def test_a_state_stored_already_is_touched_not_replaced():
    states = StateStore(300)
    first = _state(100, 32)
    assert await states.put(1, first) and await states.put(2, _state(100))
    assert await states.put(1, _state(100, 99))
    assert await states.get(1) is first and states.used_bytes == 200
    assert await states.put(3, _state(150))  # 2, now the least recently used, makes the room
    assert 2 not in states and 1 in states


async def test_pinned_states_stay_and_what_cannot_fit_is_not_stored():
    pinned = {1}
    states = StateStore(200, pinned=lambda h: h in pinned)
    assert await states.put(1, _state(100)) and await states.put(2, _state(100))
    assert await states.put(3, _state(100))  # 1 is pinned: 2 goes
    assert 1 in states and 2 not in states
    assert not await states.put(4, _state(150))  # only 3 could go: not enough
    assert 3 in states and 4 not in states
    assert not await states.put(5, _state(201))  # larger than the whole capacity
    assert not await StateStore(0).put(1, _state(2))
    assert states.used_bytes == 200


async def test_with_a_disk_tier_states_outlive_memory_and_a_restart(tmp_path):
    size = StateFiles.nbytes(_state(100))
    states = StateStore(200, files=StateFiles(tmp_path), disk_bytes=3 * size)
    for h in (1, 2, 3):
        assert await states.put(h, _state(100, tokens=16 * h, fill=bytes([h])))
    assert (len(states), states.num_on_disk, states.disk_used) == (2, 1, size)  # 1 went to disk for 3
    assert 1 in states and states.deepest([1]) == 1
    back = await states.get(1)  # read from its file and kept in memory again: 2 goes to disk for it
    assert back == _state(100, tokens=16, fill=b"\x01") and (len(states), states.num_on_disk) == (2, 2)
    assert await states.get(2) == _state(100, tokens=32, fill=b"\x02")  # and 3 for 2: the disk is full
    assert await states.put(4, _state(100, tokens=64, fill=b"\x04"))  # 1 makes room: its file stays (clean)
    assert (states.num_on_disk, states.num_disk_evictions) == (3, 0)
    assert await states.flush() == 1  # 4, memory's alone: the least recently used file (1) goes for it
    assert (states.num_on_disk, states.num_disk_evictions) == (3, 1) and not StateFiles(tmp_path).path(1).exists()

    restarted = StateStore(200, files=StateFiles(tmp_path), disk_bytes=3 * size)
    assert restarted.recover() == 3 and len(restarted) == 0 and restarted.disk_used == 3 * size
    assert [h for h in (1, 2, 3, 4) if h in restarted] == [2, 3, 4]
    assert await restarted.get(4) == _state(100, tokens=64, fill=b"\x04")
    smaller = StateStore(200, files=StateFiles(tmp_path), disk_bytes=2 * size)
    assert smaller.recover() == 2 and smaller.num_disk_evictions == 1  # the oldest file goes


async def test_pinned_states_go_to_disk_rather_than_away(tmp_path):
    pinned = {1, 2}
    states = StateStore(200, pinned=lambda h: h in pinned, files=StateFiles(tmp_path), disk_bytes=1 << 20)
    for h in (1, 2, 3):
        assert await states.put(h, _state(100))
    assert (len(states), states.num_on_disk) == (2, 1) and all(h in states for h in (1, 2, 3))


async def test_a_damaged_state_file_is_deleted_and_a_miss(tmp_path):
    files = StateFiles(tmp_path)
    states = StateStore(0, files=files, disk_bytes=1 << 20)  # disk only: every get reads the file
    assert await states.put(7, _state(100, tokens=48))
    assert await states.get(7) == _state(100, tokens=48)
    raw = bytearray(files.path(7).read_bytes())
    raw[-1] ^= 0xFF
    files.path(7).write_bytes(bytes(raw))
    assert await states.get(7) is None and 7 not in states and not files.path(7).exists()
    assert states.disk_used == 0
    files.path(8).parent.mkdir(exist_ok=True)
    files.path(8).write_bytes(b"SWST" + bytes(10))  # a torn header: dropped on restart
    assert StateStore(0, files=StateFiles(tmp_path), disk_bytes=1 << 20).recover() == 0
    assert not files.path(8).exists()


async def test_one_state_written_by_two_calls_at_once_is_one_file(tmp_path):
    import anyio

    states = StateStore(1000, files=StateFiles(tmp_path), disk_bytes=1 << 20)
    assert await states.put(1, _state(100))
    async with anyio.create_task_group() as tg:  # both find it in memory alone, both write it
        tg.start_soon(states.flush)
        tg.start_soon(states.flush)
    assert (states.num_on_disk, states.disk_used) == (1, StateFiles.nbytes(_state(100)))
