"""Which decode moves where (Llumnix's freeness): plain numbers in, a choice out."""

from __future__ import annotations

from services.scheduler.rebalance import MemoryLoad, pick_migration

CANDIDATES = [("long", 900), ("short", 100), ("mid", 400)]


def test_freeness_is_free_memory_less_its_demand_per_running_request():
    assert MemoryLoad("a", free_tokens=320, demand_tokens=0, running=10).freeness == 32
    assert MemoryLoad("a", free_tokens=320, demand_tokens=480, running=4).freeness == -40
    assert MemoryLoad("a", free_tokens=64, demand_tokens=0, running=0).freeness == 64


def test_a_worker_short_of_memory_moves_its_smallest_decode_to_the_freest_peer():
    src = MemoryLoad("a", free_tokens=64, demand_tokens=0, running=8)  # 8 tokens a request
    peers = [src, MemoryLoad("b", 2000, 0, running=4), MemoryLoad("c", 4000, 0, running=4)]
    assert pick_migration(src, peers, CANDIDATES, headroom=32) == ("short", "c")


def test_no_move_while_the_worker_has_headroom_or_nothing_to_move():
    src = MemoryLoad("a", free_tokens=640, demand_tokens=0, running=10)  # 64 a request
    peers = [src, MemoryLoad("b", 4000, 0, running=1)]
    assert pick_migration(src, peers, CANDIDATES, headroom=32) is None
    short = MemoryLoad("a", free_tokens=0, demand_tokens=0, running=10)
    assert pick_migration(short, [short, *peers[1:]], [], headroom=32) is None


def test_requests_waiting_for_memory_count_against_it():
    src = MemoryLoad("a", free_tokens=1000, demand_tokens=900, running=10)  # a preempted request waits
    peers = [src, MemoryLoad("b", 4000, 0, running=1)]
    assert pick_migration(src, peers, CANDIDATES, headroom=32) == ("short", "b")


def test_a_receiver_must_keep_its_headroom_after_the_move_so_it_never_becomes_the_next_source():
    src = MemoryLoad("a", free_tokens=0, demand_tokens=0, running=8)
    tight = MemoryLoad("b", free_tokens=100 + 32 * 5, demand_tokens=0, running=4)  # just room for "short"
    assert pick_migration(src, [src, tight], CANDIDATES, headroom=32) == ("short", "b")
    tighter = MemoryLoad("b", free_tokens=100 + 32 * 5 - 1, demand_tokens=0, running=4)
    assert pick_migration(src, [src, tighter], CANDIDATES, headroom=32) is None
    # The freest peer by freeness may hold fewer free tokens than a busier one with more room in all.
    few = MemoryLoad("c", free_tokens=120, demand_tokens=0, running=0)  # freeness 120; 100 + 32 do not fit
    assert pick_migration(src, [src, tighter, few], CANDIDATES, headroom=32) is None
    roomy = MemoryLoad("d", free_tokens=5000, demand_tokens=0, running=100)  # freeness 50, room for "short"
    assert pick_migration(src, [src, few, roomy], CANDIDATES, headroom=32) == ("short", "d")


def test_busy_workers_neither_send_nor_receive():
    src = MemoryLoad("a", free_tokens=0, demand_tokens=0, running=8)
    free = MemoryLoad("b", 4000, 0, running=1)
    assert pick_migration(MemoryLoad("a", 0, 0, 8, busy=True), [free], CANDIDATES, headroom=32) is None
    assert pick_migration(src, [src, MemoryLoad("b", 4000, 0, 1, busy=True)], CANDIDATES, headroom=32) is None
    assert pick_migration(src, [src, free], CANDIDATES, headroom=32) == ("short", "b")



def test_room_is_what_a_worker_can_take_and_keep_its_headroom():
    assert MemoryLoad("a", free_tokens=2000, demand_tokens=100, running=2).room(32) == 2000 - 100 - 32 * 3
    assert MemoryLoad("a", free_tokens=0, demand_tokens=0, running=0).room(32) == -32


def test_a_trigger_above_the_headroom_picks_earlier_and_still_keeps_the_receiver_above_the_headroom():
    src = MemoryLoad("a", free_tokens=64, demand_tokens=0, running=2)  # 32 tokens a request: not under 32
    roomy = MemoryLoad("b", free_tokens=200, demand_tokens=0, running=2)  # room: 200 - 3 x 32 = 104
    assert pick_migration(src, [roomy], [("r1", 100)], 32) is None
    assert pick_migration(src, [roomy], [("r1", 100)], 32, trigger=64) == ("r1", "b")
    assert pick_migration(src, [roomy], [("r1", 110)], 32, trigger=64) is None  # b would fall under 32


def test_a_request_copied_ahead_stays_the_choice_while_its_receiver_has_room_for_it():
    src = MemoryLoad("a", free_tokens=0, demand_tokens=0, running=8)
    roomy, roomier = MemoryLoad("b", 2000, 0, running=4), MemoryLoad("c", 4000, 0, running=1)
    peers = [src, roomy, roomier]
    assert pick_migration(src, peers, CANDIDATES, headroom=32) == ("short", "c")  # no copy ahead: the usual pick
    assert pick_migration(src, peers, CANDIDATES, headroom=32, prefer=("mid", "b")) == ("mid", "b")
    # Not preferred: gone from the candidates, a receiver without room, busy or unknown; and never when src has room.
    assert pick_migration(src, peers, CANDIDATES, headroom=32, prefer=("left", "b")) == ("short", "c")
    assert pick_migration(src, peers, CANDIDATES, headroom=32, prefer=("long", "b")) == ("long", "b")
    tight = MemoryLoad("b", 500, 0, running=4)  # room 500 - 5 x 32 = 340: "mid" (400) does not fit
    assert pick_migration(src, [src, tight, roomier], CANDIDATES, headroom=32, prefer=("mid", "b")) == ("short", "c")
    busy = MemoryLoad("b", 2000, 0, running=4, busy=True)
    assert pick_migration(src, [src, busy, roomier], CANDIDATES, headroom=32, prefer=("mid", "b")) == ("short", "c")
    assert pick_migration(src, peers, CANDIDATES, headroom=32, prefer=("mid", "gone")) == ("short", "c")
    at_ease = MemoryLoad("a", free_tokens=4000, demand_tokens=0, running=8)
    assert pick_migration(at_ease, peers, CANDIDATES, headroom=32, prefer=("mid", "b")) is None


def test_tokens_kept_for_high_priority_requests_count_as_used():
    kept = MemoryLoad("a", free_tokens=640, demand_tokens=0, running=2, reserved_tokens=512)
    assert kept.freeness == 64 and kept.room(32) == 640 - 512 - 32 * 3
    src = MemoryLoad("a", free_tokens=640, demand_tokens=0, running=10)  # 64 a request: at ease
    assert pick_migration(src, [MemoryLoad("b", 4000, 0, 1)], CANDIDATES, headroom=32) is None
    held = MemoryLoad("a", free_tokens=640, demand_tokens=0, running=10, reserved_tokens=512)  # 12.8 a request
    assert pick_migration(held, [MemoryLoad("b", 4000, 0, 1)], CANDIDATES, headroom=32) == ("short", "b")
    # A receiver that keeps tokens for its own high-priority requests has that much less room.
    assert pick_migration(held, [MemoryLoad("b", 200, 0, 1)], CANDIDATES, headroom=32) == ("short", "b")  # 136
    assert pick_migration(held, [MemoryLoad("b", 200, 0, 1, reserved_tokens=100)], CANDIDATES, headroom=32) is None
