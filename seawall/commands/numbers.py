"""argparse types for the CLIs' counts and quantities: a value out of range is refused by argparse in one line
naming its flag, before anything starts. ``--max-concurrency 0`` once left a benchmark holding every request
forever, and ``--prompt-len 0`` sent a whole run of empty prompts to be refused one by one."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole(minimum: int) -> Callable[[str], int]:
    """A whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return n
    return parse


def _real(text: str, ok: Callable[[float], bool], what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and ok(x)):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return x


def positive(text: str) -> float:
    """A finite number > 0 (a rate, a duration, a scale)."""
    return _real(text, lambda x: x > 0, "a number > 0")


def non_negative(text: str) -> float:
    """A finite number >= 0 (a wait that may be none)."""
    return _real(text, lambda x: x >= 0, "a number >= 0")


def fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    return _real(text, lambda x: 0 < x < 1, "a number between 0 and 1")
