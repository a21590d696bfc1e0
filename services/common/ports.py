"""Listening sockets bound up front, so that a port already in use is a ``PortInUse`` naming what wanted it
(the process then exits with ``EXIT_PORT_IN_USE``), not a server library's traceback from inside its task."""

from __future__ import annotations

import errno
import socket

from services.common.errors import PortInUse


def listen_tcp(host: str, port: int, what: str) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 = a free port), for a server to listen on; ``what`` names the
    server in the error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"cannot serve {what} on {host}:{port}: in use by another process (pick another "
                            "port)") from exc
        raise
    return sock
