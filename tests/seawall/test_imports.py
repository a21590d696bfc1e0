"""The CLI and the scheduler start without torch: importing it costs 2-3 s on 2 cores, paid by every
``seawall`` command and by the scheduler's start-up, neither of which runs a model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("module", ["seawall.cli", "services.scheduler.main"])
def test_importing_does_not_import_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch was imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
