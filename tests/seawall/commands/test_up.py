"""``seawall up`` (in-process until the mesh lands) on the built-in model, created on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_up_creates_the_builtin_model_and_completes_prompts(tmp_path):
    env = {"SEAWALL_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "seawall", "up", "--prompt", "Hello", "--prompt", "Burst", "--max-tokens", "5"],
        capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ready" in proc.stdout and ">>> Hello" in proc.stdout and ">>> Burst" in proc.stdout
    assert "10 tokens" in proc.stdout
    assert (tmp_path / "cache" / "models").is_dir()


def test_up_with_a_missing_model_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "seawall", "up", "--model", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
