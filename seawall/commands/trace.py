"""``seawall trace``: print a request's trace as a waterfall in the terminal (no Jaeger needed).

Reads the spans that ``seawall up --trace`` collected with its embedded OTLP receiver (a JSON line per span,
default ``$SEAWALL_CACHE_DIR/traces.jsonl``):

    seawall trace                 # the most recent request
    seawall trace REQUEST_ID      # the trace of that request (the id Generate or the HTTP API returned)
    seawall trace --list          # recent requests, newest last
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seawall.trace_receiver import ReceivedSpan, load_spans
from services.common.errors import NotFound
from services.common.tracing import REQUEST_ID, SPAN_REQUEST

BAR_WIDTH = 40


def default_trace_file() -> Path:
    from services.engine.builtin_model import default_cache_dir

    return default_cache_dir() / "traces.jsonl"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="print a request's trace as a terminal waterfall", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("request_id", nargs="?", default=None, help="request id (default: the most recent request)")
    p.add_argument("--file", type=Path, default=None, help="spans file (default: the cache dir's traces.jsonl)")
    p.add_argument("--list", action="store_true", help="list the traced requests")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = args.file or default_trace_file()
    if not path.exists():
        raise NotFound(f"no spans at {path}: start the mesh with `seawall up --trace` and send a request")
    spans = load_spans(path)
    roots = sorted((s for s in spans if s.name == SPAN_REQUEST), key=lambda s: s.start_ns)
    if args.list:
        for r in roots:
            print(f"{r.attributes.get(REQUEST_ID, '?'):<28} trace {r.trace_id}  {(r.end_ns - r.start_ns) / 1e6:9.1f} ms")
        return 0
    root = _pick(roots, args.request_id)
    print("\n".join(waterfall([s for s in spans if s.trace_id == root.trace_id])))
    return 0


def _pick(roots: list[ReceivedSpan], request_id: str | None) -> ReceivedSpan:
    if not roots:
        raise NotFound("no request spans recorded yet")
    if request_id is None:
        return roots[-1]
    for r in reversed(roots):
        if r.attributes.get(REQUEST_ID) == request_id:
            return r
    raise NotFound(f"no trace for request {request_id!r}; `seawall trace --list` shows the traced ones")


def waterfall(spans: list[ReceivedSpan]) -> list[str]:
    """One line per span, children under their parent, with a bar on a shared time axis."""
    if not spans:
        return []
    t0 = min(s.start_ns for s in spans)
    total = max(max(s.end_ns for s in spans) - t0, 1)
    children: dict[str, list[ReceivedSpan]] = {}
    ids = {s.span_id for s in spans}
    for s in spans:
        parent = s.parent_span_id if s.parent_span_id in ids else ""
        children.setdefault(parent, []).append(s)
    lines = [f"trace {spans[0].trace_id}: {len(spans)} spans over {total / 1e6:.1f} ms"]

    def walk(parent: str, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: x.start_ns):
            a = int((s.start_ns - t0) / total * BAR_WIDTH)
            b = max(a + 1, int((s.end_ns - t0) / total * BAR_WIDTH))
            bar = " " * a + "█" * (b - a) + " " * (BAR_WIDTH - b)
            label = f"{'  ' * depth}{s.name}"
            lines.append(f"{label:<44} {s.service:<18} |{bar}| {(s.end_ns - s.start_ns) / 1e6:8.2f} ms"
                         f"{_brief(s)}")
            walk(s.span_id, depth + 1)

    walk("", 0)
    return lines


def _brief(s: ReceivedSpan) -> str:
    keep = {k.rsplit(".", 1)[-1]: v for k, v in s.attributes.items()
            if k.startswith(("seawall.kv.", "seawall.chunk.", "seawall.decode.", "gen_ai.usage."))}
    events = f" events={','.join(s.events)}" if s.events else ""
    return ("  " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in keep.items())
            if keep else "") + events
