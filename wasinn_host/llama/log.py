"""llama.cpp's own log: routed to the ``wasinn_host.llama`` logger, and captured to explain a failure.

Kept apart from :mod:`.llama` so that :mod:`.model_check` (which loads untrusted files in a child
process) can initialise llama.cpp without importing the runtime, and the runtime can call the check
without an import cycle.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from typing import Iterator

from . import openmp
from .bindings import llama_cpp

llama_log = logging.getLogger("wasinn_host.llama")

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR, 5: logging.DEBUG}
_init_lock = threading.Lock()
_initialised = False
CAPTURE_LOCK = threading.Lock()
"""Held while llama.cpp's log or stderr is being captured (one capture at a time)."""
_captured: list[str] | None = None
_captured_info: list[str] | None = None


@llama_cpp.llama_log_callback
def route_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """llama.cpp's own log lines go to the ``wasinn_host.llama`` logger (silent by default)."""
    try:
        message = text.decode("utf-8", "replace").rstrip("\n")
        if _captured is not None and level >= 3:
            _captured.append(message.strip())
        elif _captured_info is not None and level == 2:
            _captured_info.append(message.strip())
        if message:
            llama_log.log(_LEVELS.get(level, logging.DEBUG), "%s", message)
    except Exception:  # never raise into C
        pass


@contextlib.contextmanager
def capture_llama_log(info: list[str] | None = None) -> Iterator[list[str]]:
    """Collect llama.cpp's warnings and errors during a call (to explain a failure in one line), and its
    information lines into ``info`` if given (the buffer sizes it reports when it creates a context)."""
    global _captured, _captured_info
    with CAPTURE_LOCK:
        lines: list[str] = []
        _captured, _captured_info = lines, info
        try:
            yield lines
        finally:
            _captured = _captured_info = None


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its logging."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        llama_cpp.llama_log_set(route_llama_log, ctypes.c_void_p(0))
        with openmp.configure():  # a build that loads its CPU backend (and libgomp) only now
            llama_cpp.llama_backend_init()
        _initialised = True
