"""Closes the gRPC channels of the links that mesh tests made (``links.add_link``) in the test's own event loop:
a channel left open fires its poller into a later test's loop once this one is closed ("Event loop is closed"
there)."""

from __future__ import annotations

import pytest

from tests.scheduler import links


@pytest.fixture
async def _close_links_in_loop():
    yield
    while links.OPEN:
        await links.OPEN.pop().channel.close()


@pytest.fixture(autouse=True)
def _close_links(request):
    # Only async tests make links (their channels need a running loop); the async fixture runs in theirs.
    if request.node.get_closest_marker("anyio") is not None:
        request.getfixturevalue("_close_links_in_loop")
