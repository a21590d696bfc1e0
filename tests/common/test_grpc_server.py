"""What every service process shares: exit codes of ``run_service`` and the quieted grpc.aio log line."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

import anyio
import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc

from services.common.errors import EXIT_PORT_IN_USE, InvalidArgument, PortInUse
from services.common.grpc_server import QuietCancelledCalls, Server, run_service, wait_healthy
from services.worker.config import WorkerConfig


def _record(exc_info) -> logging.LogRecord:
    return logging.LogRecord("grpc._cython.cygrpc", logging.ERROR, __file__, 1, "Exception not handled by "
                             "_handle_exceptions in servicer method [%s]", ("/x/StepStream",), exc_info)


def test_a_call_cancelled_as_it_starts_is_not_logged_as_an_error_but_other_errors_are():
    quiet = QuietCancelledCalls()
    try:
        raise asyncio.CancelledError
    except asyncio.CancelledError:
        cancelled = sys.exc_info()
    try:
        raise RuntimeError("real trouble")
    except RuntimeError:
        crashed = sys.exc_info()
    assert quiet.filter(_record(cancelled)) is False
    assert quiet.filter(_record(crashed)) is True
    assert quiet.filter(_record(None)) is True


def test_a_port_in_use_exits_with_its_own_code_even_from_inside_a_task_group():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def serve(config):
            async with anyio.create_task_group():
                await Server().start("127.0.0.1", port)

        assert run_service(lambda: None, serve) == EXIT_PORT_IN_USE


def test_a_second_server_on_a_port_another_server_holds_raises_port_in_use():
    # grpcio's default SO_REUSEPORT would let both bind and split the first one's clients between them.
    async def main():
        first = Server()
        port = await first.start("127.0.0.1", 0)
        try:
            with pytest.raises(PortInUse, match=f"127.0.0.1:{port}"):
                await Server().start("127.0.0.1", port)
        finally:
            await first.stop(0)

    anyio.run(main)


def test_a_user_error_exits_2_and_a_bug_still_raises():
    async def bad_flag(config):
        raise InvalidArgument("--chunk-size must be >= 1")

    async def bug(config):
        raise KeyError("oops")

    assert run_service(lambda: None, bad_flag) == 2
    with pytest.raises(KeyError):
        run_service(lambda: None, bug)


def test_a_flag_its_config_refuses_exits_2_without_a_traceback(caplog):
    """Config dataclasses refuse values with ValueError (``--compute-gbps -3``, a port past 65535): one logged line
    and exit code 2, before anything is served."""
    def parse():
        return WorkerConfig(compute_gbps=-3.0)

    async def serve(config):
        raise AssertionError("never reached")

    assert run_service(parse, serve) == 2
    assert "compute_gbps must be >= 0" in caplog.text


def test_services_run_on_uvloop_where_it_is_installed():
    pytest.importorskip("uvloop")
    seen = []

    async def serve(config):
        seen.append(type(asyncio.get_running_loop()).__module__)

    assert run_service(lambda: None, serve) == 0
    assert seen[0].startswith("uvloop")


class _HungHealth(health_pb2_grpc.HealthServicer):
    async def Check(self, request, context):
        await anyio.sleep_forever()


def test_waiting_for_a_service_whose_health_check_never_answers_ends_at_the_timeout():
    # The timeout falls inside a pending Check call: without services/common/rpc.py gRPC's blank
    # CancelledError escaped the timeout's scope instead of the wait returning False.
    async def main() -> bool:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(_HungHealth(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            return await wait_healthy(f"127.0.0.1:{port}", 0.5)
        finally:
            await server.stop(None)

    assert anyio.run(main) is False
