"""``seawall stats``: what a running mesh holds now, from its scheduler's ``GetStats``: requests running, waiting
and swapped, and per worker its role, state (serving or draining), sequences, KV pool use and prefix-cache hits.

    seawall stats                          # the mesh at 127.0.0.1:50051
    seawall stats --address HOST:PORT      # another one (a key: --api-key or $SEAWALL_API_KEY)
    seawall stats --watch 1                # redrawn every second until Ctrl-C: a burst as it arrives
    seawall stats --json                   # the whole GetStatsResponse, for scripts
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from google.protobuf import json_format

from seawall.client import DEFAULT_ADDRESS, Client
from seawall.v1 import scheduler_pb2, worker_pb2
from services.common.errors import InvalidArgument, Unavailable

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: each --watch frame replaces the last
_HEADER = ("worker", "role", "address", "state", "running", "KV used", "cached", "host used", "prefix hits",
           "budget")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="show what a running mesh holds: requests, workers, KV use",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default=DEFAULT_ADDRESS, help=f"the scheduler's gRPC address (default {DEFAULT_ADDRESS})")
    p.add_argument("--api-key", default=None, help="the mesh's API key (default: $SEAWALL_API_KEY)")
    p.add_argument("--watch", type=float, default=None, metavar="S", help="redraw every S seconds until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print the GetStatsResponse as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.watch is not None and not args.watch > 0:
        raise InvalidArgument(f"--watch must be a number of seconds > 0, got {args.watch}")
    with Client(args.address, api_key=args.api_key) as client:
        if args.watch is None:
            print(fetch_text(client, args.address, args.json))
            return 0
        # Ctrl-C ends a watch even where it was started with SIGINT ignored (from a non-interactive shell's
        # background job), where Python installs no handler of its own.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            while True:
                text = fetch_text(client, args.address, args.json)
                sys.stdout.write(f"{_CLEAR}{text}\n{time.strftime('%H:%M:%S')}  every {args.watch:g} s, "
                                 "Ctrl-C to stop\n")
                sys.stdout.flush()
                time.sleep(args.watch)
        except KeyboardInterrupt:  # how a watch ends
            return 0


def fetch_text(client: Client, address: str, as_json: bool) -> str:
    try:
        stats = client.stats()
    except Unavailable as exc:
        raise Unavailable(f"no scheduler answered at {address} ({exc}); is the mesh up (`seawall up`)?") from None
    if as_json:
        return json_format.MessageToJson(stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return "\n".join(render(stats, address))


def render(stats: scheduler_pb2.GetStatsResponse, address: str) -> list[str]:
    """The stats as lines of text: a summary of the requests, then a table of the workers."""
    queues = f" (by level: {', '.join(map(str, stats.queue_lengths))})" if len(stats.queue_lengths) > 1 else ""
    lines = [
        f"mesh at {address}, policy {stats.policy}",
        f"requests: {stats.num_running} running, {stats.num_waiting} waiting{queues}, {stats.num_swapped} swapped; "
        f"{stats.num_finished:,} finished, {stats.num_preemptions:,} preemptions, {stats.num_migrations:,} "
        f"migrations, {stats.num_steps:,} steps",
    ]
    if not stats.workers:
        return [*lines, "no worker registered"]
    rows = [_HEADER] + [_worker_row(w) for w in stats.workers]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines.append("")
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return lines


def _worker_row(w: scheduler_pb2.WorkerStats) -> tuple[str, ...]:
    role = worker_pb2.WorkerRole.Name(w.role).removeprefix("WORKER_ROLE_").lower()
    hits = f"{w.num_prefix_hit_blocks / w.num_prefix_queried_blocks:.0%}" if w.num_prefix_queried_blocks else "-"
    return (w.worker_id, role, w.address, "draining" if w.draining else "serving", str(w.num_running),
            _used(w.num_device_blocks_used, w.num_device_blocks), str(w.num_device_blocks_cached),
            _used(w.num_host_blocks_used, w.num_host_blocks), hits,
            str(w.prompt_token_budget) if w.prompt_token_budget else "-")


def _used(used: int, total: int) -> str:
    """Blocks used of a pool, with the share: ``120/8192 (1%)``."""
    return f"{used}/{total} ({used / total:.0%})" if total else f"{used}/0"
