import platform

import pytest

from services.common.heap import KEEP_FREED_BYTES, keep_freed_heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_keep_freed_heap_sets_both_thresholds_on_glibc():
    assert keep_freed_heap()
    assert keep_freed_heap(64 << 20)  # callable again, with another size
    assert keep_freed_heap(KEEP_FREED_BYTES)
