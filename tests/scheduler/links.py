"""Worker links with real scheduler cores for mesh tests that run no worker processes, and what mesh tests with
stand-in gRPC workers share: the workers' description, the built-in model's tokenizer, a live request."""

from __future__ import annotations

from tokenizers import Tokenizer

from seawall.v1 import worker_pb2
from services.common.sampling_params import SamplingParams
from services.engine.builtin_model import ensure_default_model
from services.scheduler.core.request import Request
from services.scheduler.mesh import Mesh
from services.scheduler.tracked import TrackedRequest
from services.scheduler.worker_link import WorkerLink

ROLES = {"prefill": worker_pb2.WORKER_ROLE_PREFILL, "decode": worker_pb2.WORKER_ROLE_DECODE,
         "hybrid": worker_pb2.WORKER_ROLE_HYBRID}

# Links whose gRPC channels are still open: conftest.py closes them after each test, in its loop.
OPEN: list[WorkerLink] = []


def add_link(mesh: Mesh, worker_id: str, role: str, blocks: int = 64, address: str = "127.0.0.1:1") -> WorkerLink:
    """A link to a worker of ``role`` with ``blocks`` 16-token blocks, registered in ``mesh``. Nothing listens
    at ``address``: only tests that want a call to fail fast make one."""
    link = WorkerLink.connect(worker_id, address, worker_info(role, blocks), mesh.config.core)
    mesh.links[worker_id] = link
    OPEN.append(link)
    return link


def worker_info(role: str = "decode", blocks: int = 64) -> worker_pb2.WorkerInfo:
    """What a worker of ``role`` with ``blocks`` 16-token blocks of the tiny model registers with."""
    info = worker_pb2.WorkerInfo(role=ROLES[role], model="tiny", num_device_blocks=blocks, max_model_len=4096)
    info.kv_layout.block_size = 16
    return info


def tokenizer() -> Tokenizer:
    """The built-in model's tokenizer."""
    return Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))


def tracked_request(request_id: str, max_tokens: int = 4) -> TrackedRequest:
    """A live request of a 37-token prompt, as the frontend hands it to the mesh."""
    return TrackedRequest(Request(request_id, list(range(3, 40)), SamplingParams(max_tokens=max_tokens), 0.0),
                          tokenizer(), 0.0)
