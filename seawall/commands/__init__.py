"""Subcommands of the ``seawall`` CLI; each module exposes ``register(subparsers)`` and sets ``func``."""

from seawall.commands import bench, model, run_batch, sim, stats, trace, up

# In the order ``seawall --help`` lists them.
COMMANDS = [up, stats, run_batch, model, sim, trace, bench]
