"""The state store's bookkeeping with plain data: which prefix a stored state resumes, least-recently-used
eviction within its bytes, pins, states too large to keep."""

from __future__ import annotations

from services.kvcache.state_store import StateStore, StoredState


def _state(nbytes: int, tokens: int = 16) -> StoredState:
    return StoredState(tokens, [(b"c" * (nbytes // 2), b"s" * (nbytes - nbytes // 2))])


def test_the_deepest_prefix_a_state_follows():
    states = StateStore(1000)
    assert states.put(12, _state(100, 32)) and states.put(14, _state(100, 64))
    assert states.deepest([11, 12, 13, 14, 15]) == 4
    assert states.deepest([11, 12, 13]) == 2
    assert states.deepest([11]) == 0 and states.deepest([]) == 0
    assert states.get(12).num_tokens == 32 and states.get(99) is None


def test_room_is_made_least_recently_used_first_and_a_lookup_touches_nothing():
    states = StateStore(300)
    for h in (1, 2, 3):
        assert states.put(h, _state(100))
    states.get(1)  # a load: 2 is now the least recently used
    states.deepest([3, 2])  # a lookup: no use
    assert states.put(4, _state(100))
    assert 2 not in states and {1, 3, 4} <= {h for h in (1, 2, 3, 4) if h in states}
    assert (states.used_bytes, states.num_evictions, len(states)) == (300, 1, 3)
    assert states.put(5, _state(250))  # three go for one
    assert (len(states), states.used_bytes, states.num_evictions) == (1, 250, 4)


def test_a_state_stored_already_is_touched_not_replaced():
    states = StateStore(300)
    first = _state(100, 32)
    assert states.put(1, first) and states.put(2, _state(100))
    assert states.put(1, _state(100, 99))
    assert states.get(1) is first and states.used_bytes == 200
    assert states.put(3, _state(150))  # 2, now the least recently used, makes the room
    assert 2 not in states and 1 in states


def test_pinned_states_stay_and_what_cannot_fit_is_not_stored():
    pinned = {1}
    states = StateStore(200, pinned=lambda h: h in pinned)
    assert states.put(1, _state(100)) and states.put(2, _state(100))
    assert states.put(3, _state(100))  # 1 is pinned: 2 goes
    assert 1 in states and 2 not in states
    assert not states.put(4, _state(150))  # only 3 could go: not enough
    assert 3 in states and 4 not in states
    assert not states.put(5, _state(201))  # larger than the whole capacity
    assert not StateStore(0).put(1, _state(2))
    assert states.used_bytes == 200
