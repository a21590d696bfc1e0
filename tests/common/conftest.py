"""Fixtures for the shared-services tests: async tests run on asyncio (grpc.aio needs it)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"
