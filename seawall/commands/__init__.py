"""Subcommands of the ``seawall`` CLI; each module exposes ``register(subparsers)`` and sets ``func``."""

from seawall.commands import model, run_batch, sim, up

# In the order ``seawall --help`` lists them.
COMMANDS = [up, run_batch, model, sim]
