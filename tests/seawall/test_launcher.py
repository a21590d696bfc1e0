"""The local launcher: a child that dies during start-up is named, with the end of its log in the error."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from seawall.launcher import LocalMesh, MeshOptions, free_port, worker_threads
from services.common.errors import InvalidArgument, Unavailable


def test_free_ports_lie_below_the_ephemeral_range_where_no_bind_0_or_connect_can_take_them():
    range_file = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not range_file.exists():
        pytest.skip("no Linux ephemeral port range here")
    low = int(range_file.read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(port < low for port in ports)
    assert len(set(ports)) > 40  # drawn at random, so two launchers rarely pick the same one
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # and it is free


def test_workers_split_the_cores_unless_told_how_many_torch_threads_to_use():
    colocated = MeshOptions(mode="colocated", num_decode=1)
    disaggregated = MeshOptions(num_prefill=1, num_decode=2)
    assert worker_threads(colocated, cpus=2) == 2
    assert worker_threads(disaggregated, cpus=8) == 2  # three workers: 8 // 3
    assert worker_threads(disaggregated, cpus=2) == 1  # never zero
    assert worker_threads(MeshOptions(mode="colocated", torch_threads=1), cpus=2) == 1  # a core left over
    with pytest.raises(InvalidArgument, match="torch_threads must be >= 0"):
        worker_threads(MeshOptions(torch_threads=-1), cpus=2)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_mesh_without_a_worker_or_with_a_bad_port_is_refused_before_anything_starts():
    # `seawall up --mode colocated --workers 0` came up "ready" with no worker and held every request forever;
    # --prefill -1 passed as 0; --grpc-port 70000 failed inside the scheduler with a traceback.
    from seawall.cli import build_parser
    from seawall.commands import bench, up

    parser = build_parser()
    for flags, message in ((["--mode", "colocated", "--workers", "0"], "--workers must be >= 1"),
                           (["--prefill", "0", "--decode", "0"], "add up to at least one worker"),
                           (["--prefill", "-1"], "--prefill and --decode must be >= 0"),
                           (["--grpc-port", "70000"], r"--grpc-port must be in \[0, 65535\]"),
                           (["--http-port", "-5"], r"--http-port must be in \[0, 65535\]")):
        with pytest.raises(InvalidArgument, match=message):
            up.options_from(parser.parse_args(["up", *flags]))
    with pytest.raises(InvalidArgument, match="--workers must be >= 1"):
        bench.mesh_options(parser.parse_args(["bench", "--spawn", "--workers", "0"]), "sarathi")
    # a disaggregated mesh of one role still serves (the decode worker runs prompts too)
    assert up.options_from(parser.parse_args(["up", "--prefill", "0"])).worker_roles == ["decode"]


def test_a_worker_runs_with_the_torch_threads_it_was_given(tiny_model_dir, tmp_path):
    options = MeshOptions(model=str(tiny_model_dir), mode="colocated", grpc_port=0, http_port=None,
                          log_dir=tmp_path / "logs", startup_timeout_s=60, torch_threads=1)
    with LocalMesh(options) as mesh:
        from seawall import Client

        with Client(mesh.grpc_address) as client:
            assert len(client.generate([1, 2, 3], max_tokens=3, temperature=0).token_ids) == 3
    log = (tmp_path / "logs" / "decode-0.log").read_text()
    assert "decode worker serving on" in log and "1 torch thread(s)" in log


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_that_exits_during_start_up_fails_the_start_with_its_log_tail(tiny_model_dir, tmp_path):
    options = MeshOptions(model=str(tiny_model_dir), mode="colocated", grpc_port=0, http_port=None,
                          worker_args=["--no-such-flag"], log_dir=tmp_path / "logs", startup_timeout_s=60)
    mesh = LocalMesh(options)
    with pytest.raises(Unavailable) as err:
        mesh.start()
    message = str(err.value)
    assert "decode-0 exited with code 2 during start-up" in message
    # The cause travels in the error itself, not only in a log file that may be gone when someone reads it.
    assert "unrecognized arguments: --no-such-flag" in message
    assert mesh.children == []  # the scheduler that did start was stopped


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("pick_index", "refusal"), [(1, "cannot listen on"), (2, "cannot serve metrics on")],
                         ids=["worker", "metrics"])
def test_a_picked_port_taken_before_the_child_binds_it_is_picked_again(pick_index, refusal, tiny_model_dir, tmp_path,
                                                                       monkeypatch):
    import seawall.launcher as launcher

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        picks = []

        def pick(host="127.0.0.1"):
            # After the scheduler's, the picks are the worker's gRPC port, then its metrics port: hand out the one
            # another process holds as one of them.
            picks.append(held if len(picks) == pick_index else free_port(host))
            return picks[-1]

        monkeypatch.setattr(launcher, "free_port", pick)
        options = MeshOptions(model=str(tiny_model_dir), mode="colocated", grpc_port=0, http_port=None,
                              log_dir=tmp_path / "logs", startup_timeout_s=120)
        with LocalMesh(options) as mesh:
            assert held in picks and f":{held}" not in mesh.metrics_urls["decode-0"] + mesh.worker_addresses["decode-0"]
            log = (tmp_path / "logs" / "decode-0.log").read_text()
            assert f"{refusal} 127.0.0.1:{held}: in use" in log  # the first try, then a new port
            from seawall import Client

            with Client(mesh.grpc_address) as client:
                assert len(client.generate([1, 2, 3], max_tokens=3, temperature=0).token_ids) == 3


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_port_the_caller_fixed_that_is_taken_fails_once_with_a_clear_message(which, tiny_model_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        options = MeshOptions(model=str(tiny_model_dir), mode="colocated", grpc_port=held if which == "grpc" else 0,
                              http_port=held if which == "http" else None, log_dir=tmp_path / "logs",
                              startup_timeout_s=60)
        with pytest.raises(Unavailable) as err:
            LocalMesh(options).start()
    what = {"grpc": "cannot listen on", "http": "cannot serve the OpenAI HTTP API on"}[which]
    assert "scheduler exited with code 3 during start-up" in str(err.value)
    assert f"{what} 127.0.0.1:{held}: in use" in str(err.value)
    log = (tmp_path / "logs" / "scheduler.log").read_text()
    # One line, no traceback, and not retried: the caller chose that port, so a second try would fail alike.
    assert log.count(what) == 1 and "Traceback" not in log
