"""C functions called without letting go of the interpreter, for calls that return at once.

ctypes releases the GIL around every call of a library function (``CDLL``, ``CFUNCTYPE``) and takes it
back after.  For a call of a microsecond that is only a chance for another runnable thread to take the
interpreter, and the caller then waits until that thread lets go: with many guests, each of whose
host calls makes a few such calls (the caller's Store, its memory's address and size, a copy into
guest memory), and a model worker that makes some for each row it samples (a token's piece, whether
it ends generation), the threads hand the interpreter to each other many times a token, a futex
wake-up and a context switch each.  :func:`holding_gil` gives the same C function through a
``PYFUNCTYPE`` prototype (``FUNCFLAG_PYTHONAPI``): the GIL stays held during the call.

Only for calls that neither block nor wait (no I/O, no device, no lock another thread may hold while
it needs the GIL).
"""

from __future__ import annotations

import ctypes
from typing import Any


def holding_gil(function: Any, restype: Any = None) -> Any:
    """``function`` (a ctypes C function with ``argtypes`` and ``restype`` set) as one that keeps the GIL;
    ``restype`` instead of the function's own (``ctypes.c_void_p``: a pointer as an int, or None)."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    if address is None:
        raise ValueError(f"{function!r} has no address")
    return ctypes.PYFUNCTYPE(restype or function.restype, *function.argtypes)(address)


memmove = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value or 0
)
"""``ctypes.memmove`` (libc's ``memmove``) keeping the GIL: copies into and out of guest memory."""
