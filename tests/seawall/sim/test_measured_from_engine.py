"""The simulator's measured cost model, fed with step times measured on our own engine (bench/step_times.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seawall.cli import main
from seawall.sim.cost_model import MeasuredCostModel

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def test_engine_step_times_drive_the_simulator(tmp_path, tiny_model_dir):
    table = tmp_path / "steps.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "step_times.py"), "--out", str(table), "--quick",
                    "--model", str(tiny_model_dir), "--repeats", "1"], check=True, capture_output=True, timeout=300)
    model = MeasuredCostModel.from_file(table)
    samples = json.loads(table.read_text())["samples"]
    assert len(samples) == 6 and all(s["seconds"] > 0 for s in samples)
    assert model.min_seconds > 0
    out = tmp_path / "run.json"
    assert main(["sim", "run", "--model", "Llama-2-7B", "--gpu", "A100-80GB", "--policy", "sarathi", "--workload",
                 "sharegpt", "--qps", "2", "--num-requests", "30", "--cost-model", "measured", str(table),
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["throughput_tok_s"] > 0 and result["ttft_p50"] > 0
