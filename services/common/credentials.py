"""The API key a client sends when the mesh asks for one (services/scheduler/api_key.py checks it): how the SDK,
the launcher and the load generator find it and put it on a call."""

from __future__ import annotations

import os

API_KEY_ENV = "SEAWALL_API_KEY"


def api_key_or_env(api_key: str | None) -> str | None:
    """``api_key``, else ``$SEAWALL_API_KEY``; None when neither says one (an empty variable neither)."""
    return (api_key if api_key is not None else os.environ.get(API_KEY_ENV)) or None


def bearer_metadata(api_key: str | None) -> tuple[tuple[str, str], ...] | None:
    """gRPC call metadata carrying the key; None without one."""
    return (("authorization", f"Bearer {api_key}"),) if api_key else None
