"""Output files the commands write once their work is done: checked before it starts, so that a path that
cannot be written fails at once in one line instead of as a traceback after the run, its results lost."""

from __future__ import annotations

from pathlib import Path

from services.common.errors import InvalidArgument, NotFound


def check_output_file(path: str | Path | None, flag: str) -> None:
    """``path`` (None: not asked for; ``-``: stdout) names a file that can be created or replaced."""
    if path is None or str(path) == "-":
        return
    out = Path(path)
    if out.is_dir():
        raise InvalidArgument(f"{flag} {str(path)!r} is a directory; give a file name")
    if not out.parent.is_dir():
        raise NotFound(f"{flag} {str(path)!r}: directory {str(out.parent)!r} does not exist")


def write_output_file(path: str | Path, text: str, flag: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise InvalidArgument(f"cannot write {flag} {str(path)!r}: {exc.strerror or exc}") from exc
