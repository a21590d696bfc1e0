"""``python -m seawall.healthcheck``: the containers' gRPC health probe, against a real gRPC server."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seawall.healthcheck import check, main
from seawall.launcher import free_port


@pytest.fixture
def server():
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}", servicer
    srv.stop(0)


def test_serving_is_exit_0_and_anything_else_is_exit_1(server, capsys):
    address, servicer = server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main([address]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main([address]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err
    assert check(address, service="seawall.v1.Worker") == "NOT_FOUND"


def test_nothing_listening_fails_fast():
    assert check(f"127.0.0.1:{free_port()}", timeout_s=5.0) == "UNAVAILABLE"


def test_the_address_comes_from_the_environment_when_not_given(server):
    address, servicer = server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    proc = subprocess.run([sys.executable, "-m", "seawall.healthcheck"], capture_output=True, text=True,
                          timeout=30, env={"SEAWALL_HEALTH_ADDRESS": address, "PATH": ""})
    assert proc.returncode == 0, proc.stderr
