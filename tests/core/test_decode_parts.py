"""The parts of a step's batch (``decode-logits-rows``) and giving freed memory back to the system."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest

from wasinn_host.core import heap_trim
from wasinn_host.core.scheduling.decode_parts import parts

pytestmark = pytest.mark.fast


def test_parts_keep_jobs_whole_within_the_cap() -> None:
    assert parts([1, 1, 1, 1, 1], 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert parts([1, 0, 1, 0, 1], 2) == [range(0, 4), range(4, 5)]  # a prompt chunk joins the part before
    assert parts([1, 5, 1], 2) == [range(0, 1), range(1, 2), range(2, 3)]  # a draft's rows stay together
    assert parts([0, 0, 3], 2) == [range(0, 3)]
    assert parts([1, 1, 1], 0) == [range(0, 3)]  # no cap: one decode
    assert parts([], 4) == []


def test_a_split_step_starts_a_part_where_its_prompt_chunks_begin() -> None:
    assert parts([1, 1, 1, 0, 1], 0, split_at=3) == [range(0, 3), range(3, 5)]  # streams, then prompts
    assert parts([1, 1, 1, 0, 1], 2, split_at=3) == [range(0, 2), range(2, 3), range(3, 5)]  # and the cap
    assert parts([1, 1], 0, split_at=0) == [range(0, 2)]  # 0: not split
    assert parts([1, 1], 0, split_at=2) == [range(0, 2)]  # past the jobs: nothing to split


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and mincore as Linux has them")
def test_released_pages_leave_the_resident_set_and_read_as_zeros() -> None:
    page, pages = mmap.PAGESIZE, 64
    area = mmap.mmap(-1, pages * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as malloc's
    area.write(b"\x07" * (pages * page))
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    try:
        assert resident(address, pages) == pages
        # from the middle of the first page to the middle of the last: the whole pages between go
        assert heap_trim.release_pages(address + page // 2, (pages - 1) * page) == (pages - 2) * page
        assert resident(address, pages) == 2
        assert area[page : 2 * page] == bytes(page) and area[:1] == b"\x07" and area[-1:] == b"\x07"
        assert heap_trim.release_pages(address + 1, page - 2) == 0  # no whole page
    finally:
        del address
        area.close()


def resident(address: int, pages: int) -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    vector = (ctypes.c_ubyte * pages)()
    assert libc.mincore(address, pages * mmap.PAGESIZE, vector) == 0
    return sum(v & 1 for v in vector)


def test_trim_heap_runs_where_glibc_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = heap_trim._c_library()
    has_trim = libc is not None and hasattr(libc, "malloc_trim")
    blocks = [ctypes.create_string_buffer(64 * 1024) for _ in range(256)]  # 16 MiB in the arena, then freed
    del blocks
    trimmed = heap_trim.trim_heap()
    assert isinstance(trimmed, bool) and (has_trim or not trimmed)
    monkeypatch.setattr(heap_trim, "_c_library", lambda: None)
    assert heap_trim.trim_heap() is False  # no C library: nothing to do, no error
