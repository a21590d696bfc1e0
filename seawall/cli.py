"""The ``seawall`` command line. Each subcommand lives in ``seawall/commands/<name>.py`` and registers itself."""

from __future__ import annotations

import argparse
import logging
import sys

from seawall.commands import COMMANDS
from services.common.errors import SeawallError

DESCRIPTION = "Seawall: an LLM serving mesh that stays fast when traffic arrives in bursts."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seawall", description=DESCRIPTION)
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (default: WARNING)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except SeawallError as exc:
        # User mistakes get one clear line, never a traceback.
        print(f"seawall: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
