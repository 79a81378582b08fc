"""Giving memory the host no longer uses back to the operating system (glibc, Linux; a no-op elsewhere).

* :func:`trim_heap`: glibc keeps freed blocks in its arenas, resident, for the next ``malloc``.  When
  the worker grows its inference context, llama.cpp frees the old context's buffers (an output buffer
  of 16 MiB at 16 sequences of Gemma 3, written whole) and the sequences' saved states; below glibc's
  (dynamic) mmap threshold those were arena blocks, and they would stay resident beside the new, larger
  buffers.  ``malloc_trim(0)`` returns every free page of every arena (about a millisecond).
* :func:`release_pages`: ``madvise(MADV_DONTNEED)`` over the whole pages of a range: anonymous memory
  reads as zeros when next touched, a file mapping is read again from the file (the page cache).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import sys

log = logging.getLogger("wasinn_host")

_MADV_DONTNEED = 4
"""Linux's ``MADV_DONTNEED``."""

_libc: ctypes.CDLL | None = None
_looked = False


def _c_library() -> ctypes.CDLL | None:
    """The C library (once), or None where it cannot be loaded."""
    global _libc, _looked
    if not _looked:
        _looked = True
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _libc = None
    return _libc


def trim_heap() -> bool:
    """Return the free pages of malloc's arenas to the system (glibc's ``malloc_trim(0)``); False where
    the C library has no such function (musl, macOS, Windows) or it released nothing."""
    libc = _c_library()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def release_pages(address: int, size: int) -> int:
    """Drop the whole pages inside ``[address, address + size)`` from this process's resident memory
    (``madvise(MADV_DONTNEED)``, Linux only); the bytes released (0 where nothing could be)."""
    libc = _c_library()
    if libc is None or not sys.platform.startswith("linux"):
        return 0
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + size) // page * page
    if end <= start:
        return 0
    madvise = libc.madvise
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    if madvise(start, end - start, _MADV_DONTNEED) != 0:
        log.debug("madvise(MADV_DONTNEED) of %d bytes failed: errno %d", end - start, ctypes.get_errno())
        return 0
    return end - start
