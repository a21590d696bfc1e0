"""The worker's command line: engine flags reach the engine's config."""

from __future__ import annotations

import pytest

from services.worker.main import parse_args


def test_cpu_kernels_are_on_unless_turned_off():
    assert parse_args([], "decode").engine.cpu_kernels is True
    config = parse_args(["--no-cpu-kernels", "--block-size", "32"], "prefill")
    assert config.engine.cpu_kernels is False and config.engine.block_size == 32 and config.role == "prefill"


def test_a_worker_drains_for_30_s_unless_told_otherwise():
    assert parse_args([], "decode").drain_timeout_s == 30.0
    assert parse_args(["--drain-timeout-s", "0"], "decode").drain_timeout_s == 0.0
    with pytest.raises(ValueError, match="drain_timeout_s must be >= 0"):
        parse_args(["--drain-timeout-s", "-1"], "decode")
