"""The worker's command line: engine flags reach the engine's config."""

from __future__ import annotations

from services.worker.main import parse_args


def test_cpu_kernels_are_on_unless_turned_off():
    assert parse_args([], "decode").engine.cpu_kernels is True
    config = parse_args(["--no-cpu-kernels", "--block-size", "32"], "prefill")
    assert config.engine.cpu_kernels is False and config.engine.block_size == 32 and config.role == "prefill"
