"""Accelerators the cost model knows: peak dense fp16/bf16 tensor FLOP/s, memory size and bandwidths.

Datasheet numbers (dense, no sparsity). ``pcie_bandwidth`` is what a host<->device copy of KV blocks
sustains in one direction (about 80% of the link's nominal rate); ``link_bandwidth`` is one direction of
the GPU-to-GPU link that tensor-parallel all-reduces use. How far real kernels get from these peaks is the
cost model's calibration (``cost_model.Efficiency``), not this table's.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidArgument

GiB = 1 << 30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    hbm_bandwidth: float  # device memory bytes/s
    pcie_bandwidth: float  # host <-> device bytes/s, one direction, sustained
    link_bandwidth: float  # GPU <-> GPU bytes/s, one direction (NVLink; PCIe where there is none)
    # Fixed cost of one tensor-parallel all-reduce of a step's activations (NCCL, small messages). Calibrated
    # for the A100-80GB PCIe pairs (Yi-34B TP2 decode, docs/sim.md); the others are estimates.
    allreduce_latency_s: float = 20e-6


GPUS: dict[str, GPU] = {
    g.name.lower(): g
    for g in (
        # A100 SXM4 40GB: 312 TFLOP/s, 1555 GB/s HBM2, PCIe 4.0 x16, NVLink 3 (600 GB/s both ways).
        GPU("A100-40GB", 40 * GiB, 312e12, 1555e9, 25e9, 300e9, 20e-6),
        # A100 80GB PCIe as in Sarathi-Serve's testbed (Azure NC96ads v4: NVLink bridges in pairs);
        # the SXM4 part has 2039 GB/s, within the calibration's error.
        GPU("A100-80GB", 80 * GiB, 312e12, 1935e9, 25e9, 300e9, 50e-6),
        # H100 SXM5 80GB: 989 TFLOP/s dense, 3.35 TB/s HBM3, PCIe 5.0 x16, NVLink 4 (900 GB/s both ways).
        GPU("H100", 80 * GiB, 989e12, 3350e9, 50e9, 450e9, 15e-6),
        # H200 SXM: the H100's compute with 141 GB of HBM3e at 4.8 TB/s.
        GPU("H200", 141 * 10**9, 989e12, 4800e9, 50e9, 450e9, 15e-6),
        # A40: 149.7 TFLOP/s fp16 tensor, 48 GB GDDR6 at 696 GB/s, PCIe 4.0, NVLink bridge in pairs (112.5 GB/s).
        GPU("A40", 48 * GiB, 149.7e12, 696e9, 25e9, 56e9, 50e-6),
        # A10: 125 TFLOP/s fp16 tensor, 24 GB GDDR6 at 600 GB/s, PCIe 4.0, no NVLink (Llumnix's testbed).
        GPU("A10", 24 * GiB, 125e12, 600e9, 25e9, 25e9, 50e-6),
    )
}


def get_gpu(name: str) -> GPU:
    gpu = GPUS.get(name.lower())
    if gpu is None:
        raise InvalidArgument(f"unknown GPU {name!r}; known: {', '.join(g.name for g in GPUS.values())}")
    return gpu
