"""Subcommands of the ``seawall`` CLI; each module exposes ``register(subparsers)`` and sets ``func``."""

from seawall.commands import model

COMMANDS = [model]
