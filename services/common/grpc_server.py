"""What every Seawall gRPC server shares: health and reflection, error mapping, shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.errors import EXIT_PORT_IN_USE, PortInUse, SeawallError
from services.common.rpc import rpc

log = logging.getLogger(__name__)
Config = TypeVar("Config")

# KV blocks and whole prompts travel in single messages; gRPC's 4 MiB default is too small for either.
MAX_MESSAGE_BYTES = 256 * 2**20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# grpcio sets SO_REUSEPORT on Linux by default, so a second server on a taken port binds without error and the
# kernel splits connections between two processes: a client then reaches the wrong service (UNIMPLEMENTED).
# Off, a taken port is an error at start (PortInUse), as it is for every other server.
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]


class Server:
    """A ``grpc.aio`` server with the standard health and reflection services.

    ``add`` registers a servicer; ``start`` binds (port 0 picks a free one) and marks every service SERVING.
    """

    def __init__(self, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        self.grpc = grpc.aio.server(options=SERVER_OPTIONS, interceptors=list(interceptors) or None)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        self._names: list[str] = [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
        self.port = 0

    def add(self, add_fn: Callable, servicer: object, full_name: str) -> None:
        add_fn(servicer, self.grpc)
        self._names.append(full_name)

    async def start(self, host: str, port: int) -> int:
        reflection.enable_server_reflection([*self._names, reflection.SERVICE_NAME], self.grpc)
        try:
            self.port = self.grpc.add_insecure_port(f"{host}:{port}")
        except RuntimeError:  # grpcio >= 1.60 raises where older versions returned port 0
            self.port = 0
        if self.port == 0:
            raise PortInUse(f"cannot listen on {host}:{port}: in use by another process (pick another port)")
        await self.grpc.start()
        await self.set_serving(True)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """What the health service says of every service: NOT_SERVING tells a load balancer to send elsewhere."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self._names]:
            await self.health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.set_serving(False)
        await self.grpc.stop(grace_s)


async def abort_with(context: grpc.aio.ServicerContext, exc: SeawallError) -> None:
    """Ends the call with the status code the error names and its fix-it message."""
    await context.abort(getattr(grpc.StatusCode, exc.grpc_code), str(exc))


async def wait_for_shutdown_signal() -> int:
    """Returns the signal number once SIGTERM or SIGINT arrives."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s: shutting down", signal.Signals(signum).name)
            return signum
    return 0


async def wait_healthy(address: str, timeout_s: float, service: str = "") -> bool:
    """Polls the gRPC health service at ``address`` until SERVING or the timeout passes."""
    with anyio.move_on_after(timeout_s):
        async with grpc.aio.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    reply = await rpc(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0))
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return True
                except grpc.aio.AioRpcError:
                    pass
                await anyio.sleep(0.1)
    return False


class QuietCancelledCalls(logging.Filter):
    """grpc.aio logs a call that is cancelled as its handler starts (a peer hanging up while this service
    shuts down) as an error with a ``CancelledError`` traceback from its own internals. A cancelled call is
    routine: keep it at debug level."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        if exc is not None and issubclass(exc, asyncio.CancelledError):
            log.debug("a call was cancelled as it started: %s", record.getMessage())
            return False
        return True


def run_service(parse: Callable[[], Config], serve: Callable[[Config], Awaitable[None]]) -> int:
    """A service process's ``main``: parse its flags, serve until SIGTERM/SIGINT. A ``SeawallError`` (a bad flag,
    a missing model) is one logged line and exit code 2, never a traceback, as is a ``ValueError`` of its config
    (a flag's value its config dataclass refuses); a port in use is exit code ``EXIT_PORT_IN_USE``; Ctrl-C before
    serving is 130."""
    logging.getLogger("grpc._cython.cygrpc").addFilter(QuietCancelledCalls())
    try:
        config = parse()
    except (SeawallError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    try:
        anyio.run(serve, config, backend_options={"use_uvloop": uvloop_available()})
    except BaseException as raised:
        exc = _sole_cause(raised)  # a task group wraps even a single error in a group
        if isinstance(exc, KeyboardInterrupt):
            return 130
        if not isinstance(exc, SeawallError):
            raise
        log.error("%s", exc)
        return EXIT_PORT_IN_USE if isinstance(exc, PortInUse) else 2
    return 0


def uvloop_available() -> bool:
    """Services (and the load generator) run on uvloop where it is installed: each grpc.aio call hops
    between gRPC's poller thread and the loop, and uvloop makes those hops cheaper (the mesh's prompt phase:
    0.65x -> 0.72x of the in-process engine on 2 cores, bench/README.md)."""
    return importlib.util.find_spec("uvloop") is not None


def _sole_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
