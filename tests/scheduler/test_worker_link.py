"""A worker joins a scheduler only when it serves the scheduler's context (--max-model-len): requests move
between workers, and a LongRoPE model rotates positions by the context served."""

from __future__ import annotations

import pytest

from services.scheduler.core.config import SchedulerConfig
from services.scheduler.worker_link import WorkerLink
from tests.scheduler.links import worker_info

pytestmark = [pytest.mark.anyio]


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_a_worker_serving_another_context_is_refused_saying_what_to_align():
    info = worker_info()
    info.max_model_len = 1024
    with pytest.raises(ValueError, match="max_model_len 1024 is the worker's context and the scheduler's is 4096"):
        WorkerLink.connect("w", "127.0.0.1:1", info, SchedulerConfig(max_model_len=4096))
    link = WorkerLink.connect("w", "127.0.0.1:1", info, SchedulerConfig(max_model_len=1024))
    try:
        assert link.core.config.max_model_len == 1024
    finally:
        await link.channel.close()
