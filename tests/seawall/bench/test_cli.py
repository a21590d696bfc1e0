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
