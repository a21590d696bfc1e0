"""glibc malloc tuning shared by every process that allocates large short-lived buffers each step."""

from __future__ import annotations

import ctypes

# glibc hands freed heap memory back to the kernel once more than twice the current mmap threshold (4 MiB
# after its dynamic adjustment) is free at the top, and serves larger requests by mmap, so buffers allocated
# and freed every step fault in and zero fresh pages each time. Two users here:
# * KV chunks over gRPC (the encoded message, gRPC's copy, the received bytes: a few MiB each): push and
#   pull went from 1.0-1.3 to 1.5-1.7 GB/s between two processes;
# * the engine's per-step activations (a 512-token step of the built-in model allocates tens of MiB):
#   the forward passes of the 64 x (128 + 64) workload took 0.65-0.92 s without and 0.51-0.62 s with it.
# Larger values than 32 MiB measured no better here.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 32 << 20


def keep_freed_heap(nbytes: int = KEEP_FREED_BYTES) -> bool:
    """Tells glibc's malloc to keep up to ``nbytes`` of freed heap per arena instead of returning it to the
    kernel at once. Process-wide and idempotent. False where the C library has no ``mallopt`` (not glibc),
    which only costs speed."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes)) and bool(mallopt(_M_TRIM_THRESHOLD, nbytes))
