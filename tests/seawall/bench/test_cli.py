"""``seawall bench`` refuses what it cannot do before it sends anything."""

from __future__ import annotations

import pytest

from seawall.cli import main


@pytest.mark.parametrize(("flag", "where", "message"), [
    ("--json", lambda p: p, "is a directory"),
    ("--html", lambda p: p / "missing" / "report.html", "does not exist"),
])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, flag, where, message):
    # It failed with a traceback when the report was written, after the whole benchmark had run. Nothing
    # listens at the address: the run would fail differently had it started.
    code = main(["bench", "--address", "127.0.0.1:1", "--num-requests", "1", flag, str(where(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and f"{flag} " in err and message in err and "Traceback" not in err, err


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--max-concurrency", "0", "a whole number >= 1"),  # held every request forever
    ("--warmup", "-1", "a whole number >= 0"),
    ("--prompt-len", "0", "a whole number >= 1"),  # a run of empty prompts, each refused by the mesh
    ("--rates", "0", "a number > 0"),
    ("--slo-tbt", "-0.1", "a number > 0"),
    ("--time-scale", "nan", "a number > 0"),
    ("--capacity-tolerance", "1", "a number between 0 and 1"),
    ("--burst-interval", "-5", "a number >= 0"),
    ("--hf-max-batch", "many", "a whole number >= 1"),
])
def test_a_count_or_quantity_out_of_range_is_refused_by_argparse_naming_its_flag(capsys, flag, value, expected):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--address", "127.0.0.1:1", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {flag}: expected {expected}, got {value!r}" in err, err


def test_the_edges_of_each_range_are_accepted():
    from seawall.cli import build_parser

    args = build_parser().parse_args(["bench", "--address", "x:1", "--warmup", "0", "--max-concurrency", "1",
                                      "--burst-interval", "0", "--capacity-tolerance", "0.5", "--rates", "0.5,2"])
    assert (args.warmup, args.max_concurrency, args.burst_interval, args.capacity_tolerance, args.rates) == (
        0, 1, 0.0, 0.5, [0.5, 2.0])
