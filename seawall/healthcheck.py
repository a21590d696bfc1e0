"""A gRPC health probe (``grpc.health.v1``) for container healthchecks: exit 0 when SERVING, 1 otherwise.

    python -m seawall.healthcheck                      # $SEAWALL_HEALTH_ADDRESS, else 127.0.0.1:50051
    python -m seawall.healthcheck 127.0.0.1:50061 --service seawall.v1.Worker --timeout 2

Every Seawall service serves the standard health service (``services/common/grpc_server.py``), so one probe
fits all; the Dockerfile's HEALTHCHECK and docker-compose.yml's healthchecks run it. It imports only grpc.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"


def check(address: str, service: str = "", timeout_s: float = 3.0) -> str:
    """The health status name at ``address`` (``SERVING``, ``NOT_SERVING``...), or the gRPC error's code."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=timeout_s)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seawall.healthcheck", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("address", nargs="?", default=os.environ.get("SEAWALL_HEALTH_ADDRESS", DEFAULT_ADDRESS),
                   help=f"HOST:PORT (default: $SEAWALL_HEALTH_ADDRESS, else {DEFAULT_ADDRESS})")
    p.add_argument("--service", default="", help="service name to check (default: the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer (default 3)")
    args = p.parse_args(argv)
    status = check(args.address, args.service, args.timeout)
    if status != "SERVING":
        sys.stderr.write(f"{args.address}: {status}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
