"""Worker links with real scheduler cores for mesh tests that run no worker processes."""

from __future__ import annotations

from seawall.v1 import worker_pb2
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import WorkerLink

ROLES = {"prefill": worker_pb2.WORKER_ROLE_PREFILL, "decode": worker_pb2.WORKER_ROLE_DECODE,
         "hybrid": worker_pb2.WORKER_ROLE_HYBRID}


def add_link(mesh: Mesh, worker_id: str, role: str, blocks: int = 64, address: str = "127.0.0.1:1") -> WorkerLink:
    """A link to a worker of ``role`` with ``blocks`` 16-token blocks, registered in ``mesh``. Nothing listens
    at ``address``: only tests that want a call to fail fast make one."""
    info = worker_pb2.WorkerInfo(role=ROLES[role], model="tiny", num_device_blocks=blocks, max_model_len=4096)
    info.kv_layout.block_size = 16
    link = WorkerLink.connect(worker_id, address, info, mesh.config.core)
    mesh.links[worker_id] = link
    return link
