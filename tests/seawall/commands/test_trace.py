"""``seawall trace`` on spans files it cannot use: one clear line, never a traceback."""

from __future__ import annotations

import json
from dataclasses import asdict

from seawall.cli import main
from seawall.trace_receiver import ReceivedSpan
from services.common.tracing import REQUEST_ID, SPAN_REQUEST


def test_a_spans_file_it_cannot_read_is_named_in_one_line(tmp_path, capsys):
    # A line cut short (the receiver's process killed mid-write), a file of other JSON, a directory or a
    # binary file raised JSONDecodeError, TypeError, IsADirectoryError or UnicodeDecodeError as tracebacks.
    span = ReceivedSpan("t1", "s1", "", SPAN_REQUEST, "scheduler", 0, 2_000_000, {REQUEST_ID: "r1"})
    cut = tmp_path / "cut.jsonl"
    cut.write_text(json.dumps(asdict(span)) + "\n" + json.dumps(asdict(span))[:20])
    other = tmp_path / "other.jsonl"
    other.write_text('{"a": 1}\n')
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\n")
    for path, message in ((cut, "line 2 is not a span"), (other, "line 1 is not a span"),
                          (tmp_path, "cannot read spans"), (binary, "cannot read spans")):
        assert main(["trace", "--file", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_a_good_spans_file_prints_its_waterfall(tmp_path, capsys):
    span = ReceivedSpan("t1", "s1", "", SPAN_REQUEST, "scheduler", 0, 2_000_000, {REQUEST_ID: "r1"})
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(asdict(span)) + "\n\n")
    assert main(["trace", "--file", str(good), "r1"]) == 0
    assert "trace t1: 1 spans" in capsys.readouterr().out
