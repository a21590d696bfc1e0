"""The slots of saved recurrent states (services/scheduler/core/state_slots.py): least recently used first over
the device's and host memory's, moves to host memory instead of drops, and what a plan or another worker
holds stays put."""

from __future__ import annotations

import pytest

from services.scheduler.core.state_slots import StateCheckpoints


def _saved(c: StateCheckpoints, *hashes: int) -> list[int | None]:
    """Each hash's state saved by a plan of its own, and confirmed (its step ran)."""
    slots = []
    for h in hashes:
        slots.append(c.assign(h))
        c.end_plan()
        c.confirm(h)
    return slots


def _plan(c: StateCheckpoints, call, *args):
    """``call(*args)`` as the one thing a plan does with the slots."""
    out = call(*args)
    c.end_plan()
    return out


def test_the_least_recently_used_state_makes_room_and_a_dead_worker_takes_all_with_it():
    c = StateCheckpoints(2)
    assert [_plan(c, c.assign, h) for h in (11, 12)] == [0, 1]
    assert c.deepest([11]) == (0, None)  # not confirmed: its step has not run
    for h in (11, 12):
        c.confirm(h)
    assert _plan(c, c.deepest, [5, 11]) == (2, 0)  # 11 used last: 12 goes first
    assert _plan(c, c.assign, 13) == 1 and c.deepest([5, 12]) == (0, None)
    assert c.assign(11) is None  # saved already
    assert c.assign(14) == c.assign(14)  # unconfirmed: assigned again, the same slot
    c.clear()
    assert len(c) == 0 and _plan(c, c.assign, 15) == 0
    # A prompt's own state (of use to the same prompt again only) goes first, before older ones.
    assert _plan(c, c.assign, 16, True) == 1 and _plan(c, c.assign, 17) == 1
    assert StateCheckpoints(0).assign(1) is None
    with pytest.raises(ValueError, match="capacities must be >= 0"):
        StateCheckpoints(-1)


def test_a_lent_state_is_neither_evicted_nor_replaced_until_unpinned():
    """A state another worker is reading (services/scheduler/peer_prefix.py) keeps its slot meanwhile."""
    c = StateCheckpoints(2)
    _saved(c, 11, 12)
    assert c.lend(11) == 0 and c.lend(12) == 1 and _plan(c, c.assign, 13) is None  # all being read: no save
    c.unpin(12)
    assert _plan(c, c.assign, 13) == 1 and c.covered([11]) == 1 and c.covered([11, 12]) == 1  # 12 went
    c.confirm(13)
    c.lend(13)
    assert _plan(c, c.assign, 14) is None
    # A request's newer state does not push it out.
    assert _plan(c, c.replace, 13, 15) is None and c.covered([13]) == 1
    c.lend(13)
    c.unpin(13)
    assert _plan(c, c.assign, 14) is None  # still pinned once
    c.unpin(13)
    assert _plan(c, c.assign, 14) is not None and c.covered([13]) == 0
    with pytest.raises(ValueError, match="no saved state ends in block"):
        c.lend(99)
    c.clear()
    c.unpin(11)  # a reader finishing after its worker died: nothing to let go of
    assert c.assign(21) is not None and c.assign(22) is not None


def test_routing_reads_how_far_a_saved_state_reaches_without_using_it():
    c = StateCheckpoints(2)
    _saved(c, 11, 12)
    assert c.covered([11, 12, 13]) == 2 and c.covered([11, 99]) == 1
    assert c.covered([99]) == 0
    assert c.covered([11]) == 1
    c.assign(14)  # 11, though just read, is still the least recently used: it goes
    assert c.covered([11]) == 0 and c.covered([11, 12]) == 2


def test_the_device_s_least_recently_used_state_goes_to_host_memory_and_resumes_from_there():
    c = StateCheckpoints(2, host_capacity=2)
    assert _saved(c, 11, 12) == [0, 1]
    assert c.assign(13) == 0 and c.end_plan() == [(0, 2)]  # 11 to host slot 2, its device slot to 13's save
    c.confirm(13)
    assert c.deepest([11]) == (1, 2) and len(c) == 3 and c.num_on_host == 1
    c.end_plan()
    # The order is one over both tiers: 12 is now the least recently used, and goes to host too.
    assert c.assign(14) == 1 and c.end_plan() == [(1, 3)]
    c.confirm(14)
    assert c.num_on_host == 2
    # Host memory full: its least recently used (11 was used after 12) is dropped for the next to come.
    assert c.assign(15) == 0 and c.end_plan() == [(0, 3)]
    assert c.covered([12]) == 0 and c.covered([11]) == 1 and c.covered([13]) == 1 and c.num_on_host == 2
    # A request's newer state frees its older one's host slot.
    c.confirm(15)
    assert c.replace(11, 16) == 1 and c.end_plan() == [(1, 2)]  # 11 released; 14 (LRU on the device) to slot 2
    assert c.covered([11]) == 0 and c.covered([14]) == 1


def test_a_state_a_plan_resumes_from_stays_until_the_plan_is_done():
    """The worker copies a plan's moves before it adds the plan's sequences: a state a sequence of the plan
    resumes from must not be moved over (host) or moved away (device) in the same plan."""
    c = StateCheckpoints(1, host_capacity=1)
    _saved(c, 11)
    assert c.assign(12) == 0 and c.end_plan() == [(0, 1)]
    c.confirm(12)
    assert c.deepest([11]) == (1, 1) and c.deepest([12]) == (1, 0)  # both taken by sequences of this plan
    assert c.assign(13) is None and c.end_plan() == []  # no slot may go: the save is skipped
    assert c.assign(13) == 0 and c.end_plan() == [(0, 1)]  # the next plan: 12 moves over 11


def test_unconfirmed_states_are_dropped_not_moved():
    c = StateCheckpoints(1, host_capacity=4)
    assert _plan(c, c.assign, 11) == 0  # its step has not run (its request left first): nothing to move
    assert c.assign(12) == 0 and c.end_plan() == [] and c.num_on_host == 0


def test_a_plan_never_saves_two_states_into_one_slot():
    """The worker writes a plan's saves in an order of its own: a slot given to a save of the plan being built
    is not given to another of the same plan, even the coldest (a prompt's own state, the next to go)."""
    c = StateCheckpoints(2)
    assert c.assign(11, cold=True) == 0 and c.assign(12) == 1
    assert c.assign(13) is None  # both slots saved into by this plan: the third save is skipped
    c.end_plan()
    assert c.assign(13) == 0  # the next plan: the cold one (unconfirmed) goes

