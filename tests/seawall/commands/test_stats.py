"""``seawall stats`` (seawall/commands/stats.py): the text drawn from a GetStatsResponse, and what it says when no
mesh answers. A live mesh's stats through the command: tests/e2e/test_stats_command.py."""

from __future__ import annotations

import subprocess
import sys

from seawall.commands.stats import render
from seawall.launcher import free_port
from seawall.v1 import scheduler_pb2, worker_pb2


def _stats() -> scheduler_pb2.GetStatsResponse:
    return scheduler_pb2.GetStatsResponse(
        policy="fastserve", queue_lengths=[3, 1, 0], num_running=5, num_waiting=4, num_swapped=1, num_preemptions=7,
        num_finished=12345, num_steps=999, num_migrations=2,
        workers=[scheduler_pb2.WorkerStats(worker_id="w-1", address="10.0.0.1:50061",
                                           role=worker_pb2.WORKER_ROLE_PREFILL, num_device_blocks=8192,
                                           num_device_blocks_used=2048, num_device_blocks_cached=100,
                                           num_host_blocks=1024, num_running=2, num_prefix_queried_blocks=40,
                                           num_prefix_hit_blocks=30, prompt_token_budget=512),
                 scheduler_pb2.WorkerStats(worker_id="w-2", address="10.0.0.2:50061",
                                           role=worker_pb2.WORKER_ROLE_DECODE, num_device_blocks=100,
                                           num_device_blocks_used=99, num_running=3, draining=True)])


def test_the_summary_and_a_row_per_worker_with_its_state_and_pool_use():
    lines = render(_stats(), "10.0.0.9:50051")
    assert lines[0] == "mesh at 10.0.0.9:50051, policy fastserve"
    assert lines[1] == ("requests: 5 running, 4 waiting (by level: 3, 1, 0), 1 swapped; 12,345 finished, "
                        "7 preemptions, 2 migrations, 999 steps")
    header, first, second = (line.split() for line in lines[3:])
    assert header[:4] == ["worker", "role", "address", "state"]
    assert first == ["w-1", "prefill", "10.0.0.1:50061", "serving", "2", "2048/8192", "(25%)", "100", "0/1024",
                     "(0%)", "75%", "512"]
    assert second == ["w-2", "decode", "10.0.0.2:50061", "draining", "3", "99/100", "(99%)", "0", "0/0", "-", "-"]
    assert lines[3].index("state") == lines[4].index("serving") == lines[5].index("draining")  # columns line up


def test_a_mesh_without_workers_says_so():
    lines = render(scheduler_pb2.GetStatsResponse(policy="sarathi", queue_lengths=[2], num_waiting=2), "a:1")
    assert lines[1].startswith("requests: 0 running, 2 waiting, 0 swapped") and lines[-1] == "no worker registered"


def test_no_mesh_at_the_address_is_one_clear_line():
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "seawall", "stats", "--address", address], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"no scheduler answered at {address}" in proc.stderr and "seawall up" in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "seawall", "stats", "--watch", "0"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and "--watch must be a number of seconds > 0" in bad.stderr
