"""``scheduling_flags`` turns parsed scheduling flags back into a scheduler command line (for ``seawall up``
and ``seawall bench --spawn``): FastServe's settings survive the round trip, and unset ones stay the preset's."""

from __future__ import annotations

import argparse

from services.scheduler.core.config import MLFQConfig
from services.scheduler.main import _mlfq, add_scheduling_flags, scheduling_flags


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_scheduling_flags(p)
    return p.parse_args(argv)


def test_the_wait_bound_flags_reach_the_mlfq_config_through_the_round_trip():
    args = parse(["--policy", "fastserve", "--max-wait-ratio", "0.5", "--wait-slack-s", "0.1",
                  "--wait-credit", "none", "--starvation-s", "1"])
    again = parse(scheduling_flags(args))
    assert _mlfq(again) == MLFQConfig(starvation_s=1.0, max_wait_ratio=0.5, wait_slack_s=0.1, wait_credit="none")


def test_without_the_flags_the_preset_is_untouched():
    assert _mlfq(parse(scheduling_flags(parse([])))) == MLFQConfig()
    assert _mlfq(parse(["--mlfq", "released-code"])) == MLFQConfig.released_code()
    assert "--max-wait-ratio" not in scheduling_flags(parse([]))


def test_a_value_the_core_cannot_take_is_refused_naming_the_flag():
    import pytest

    from services.common.errors import InvalidArgument
    from services.scheduler.main import core_config_from

    assert core_config_from(parse(["--decode-steps", "8"])).num_decode_steps == 8
    for argv, message in ((["--decode-steps", "0"], "--decode-steps must be >= 1"),
                          (["--chunk-size", "0"], "--chunk-size must be >= 1"),
                          (["--policy", "fastserve", "--starvation-s", "0"], "--starvation-s must be > 0"),
                          (["--speculative-tokens", "-1"], "--speculative-tokens must be >= 0"),
                          (["--speculative-tokens", "2", "--decode-steps", "4"], "exclude each other")):
        with pytest.raises(InvalidArgument, match=message):
            core_config_from(parse(argv))
    assert "--decode-steps" in scheduling_flags(parse(["--decode-steps", "4"]))
    assert core_config_from(parse(scheduling_flags(parse(["--speculative-tokens", "3"])))).num_speculative_tokens == 3


def test_reading_prefixes_from_decode_workers_is_on_unless_turned_off_through_the_round_trip():
    from services.scheduler.main import parse_args

    assert parse_args([]).peer_prefix and "--no-peer-prefix" not in scheduling_flags(parse([]))
    assert not parse_args(scheduling_flags(parse(["--no-peer-prefix"]))).peer_prefix


def test_meeting_peers_is_on_unless_turned_off_through_the_round_trip():
    from services.scheduler.main import parse_args

    assert parse_args([]).peer_meeting and "--no-peer-meeting" not in scheduling_flags(parse([]))
    assert not parse_args(scheduling_flags(parse(["--no-peer-meeting"]))).peer_meeting


def test_the_migration_flags_reach_the_service_config_through_the_round_trip():
    import pytest

    from services.scheduler.main import parse_args

    args = parse(["--migration-headroom", "64", "--priority-headroom", "512", "--no-migration-precopy"])
    config = parse_args(scheduling_flags(args))
    assert (config.migration_headroom, config.priority_headroom, config.migration_precopy) == (64, 512, False)
    assert parse_args([]).priority_headroom == 0
    with pytest.raises(ValueError, match="priority_headroom must be >= 0, got -1"):
        parse_args(["--priority-headroom", "-1"])
