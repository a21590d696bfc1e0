"""An embedded OTLP/gRPC trace receiver, for users without Jaeger (``seawall up --trace``) and for tests.

It speaks the same protocol as Jaeger's or the OpenTelemetry Collector's port 4317 (the
``opentelemetry.proto.collector.trace.v1.TraceService/Export`` RPC), keeps the spans it receives in memory
and, when given a file, appends each span there as one JSON line, which ``seawall trace`` reads.
"""

from __future__ import annotations

import json
import threading
from concurrent import futures
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.common.errors import InvalidArgument


@dataclass
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)
    events: list[str] = field(default_factory=list)


def _value(v) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: TraceReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        spans = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(ReceivedSpan(
                        s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                        str(resource.get("service.name", "?")), s.start_time_unix_nano, s.end_time_unix_nano,
                        {a.key: _value(a.value) for a in s.attributes}, [e.name for e in s.events]))
        self.receiver.add(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class TraceReceiver:
    """``start()`` listens on ``host:port`` (0 = a free port); ``endpoint`` is what exporters are given."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, path: Path | None = None) -> None:
        self.host, self.port, self.path = host, port, path
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TraceReceiver:
        # Without SO_REUSEPORT a taken port fails here instead of splitting spans with another process.
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        self.port = self._server.add_insecure_port(f"{self.host}:{self.port}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait()

    def __enter__(self) -> TraceReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self.spans.extend(spans)
            if self.path is not None:
                with self.path.open("a") as f:
                    for s in spans:
                        f.write(json.dumps(asdict(s)) + "\n")

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def load_spans(path: Path) -> list[ReceivedSpan]:
    """The spans of a file ``TraceReceiver`` wrote; one that is not such a file (a line cut short by a crash,
    another file given to ``seawall trace --file``) is refused naming the line, not with a traceback."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read spans from {path}: {exc}") from exc
    spans = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            spans.append(ReceivedSpan(**json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"{path}, line {n} is not a span that `seawall up --trace` wrote ({exc}); "
                                  "remove it or start a new file") from exc
    return spans
