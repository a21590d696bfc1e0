"""``seawall stats`` against a live mesh: its workers as the scheduler sees them, and the request that just ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from seawall import Client


def _stats(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seawall", "stats", *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_stats_shows_the_workers_and_counts_what_ran(default_mesh):
    address = default_mesh.grpc_address
    with Client(address) as client:
        before = client.stats().num_finished
        client.generate("The quick brown fox", max_tokens=4, temperature=0)
    proc = _stats("--address", address)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"mesh at {address}, policy sarathi"
    finished = int(lines[1].split(" finished")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert finished >= before + 1
    rows = {line.split()[1]: line.split() for line in lines[4:]}
    assert set(rows) == {"prefill", "decode"}
    for role, address_ in (("prefill", default_mesh.worker_addresses["prefill-0"]),
                           ("decode", default_mesh.worker_addresses["decode-1"])):
        assert rows[role][2:4] == [address_, "serving"]
    as_json = json.loads(_stats("--address", address, "--json").stdout)
    assert as_json["policy"] == "sarathi" and len(as_json["workers"]) == 2
    assert int(as_json["num_finished"]) >= before + 1


def test_watch_redraws_until_ctrl_c(default_mesh):
    proc = subprocess.Popen([sys.executable, "-m", "seawall", "stats", "--address", default_mesh.grpc_address,
                             "--watch", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        frames = 0
        while frames < 2 and time.monotonic() < deadline:
            if "Ctrl-C to stop" in proc.stdout.readline():
                frames += 1
        assert frames == 2
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
