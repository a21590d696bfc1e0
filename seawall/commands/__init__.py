"""Subcommands of the ``seawall`` CLI; each module exposes ``register(subparsers)`` and sets ``func``."""

from seawall.commands import bench, model, run_batch, sim, trace, up

# In the order ``seawall --help`` lists them.
COMMANDS = [up, run_batch, model, sim, trace, bench]
