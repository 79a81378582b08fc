"""Stopping running guests: a time limit and an interrupt that trap a Store's wasm at once.

wasmtime checks a Store's epoch deadline as its wasm runs.  Instead of one far deadline (which
an interrupt could never reach), each Store gets a short one and an epoch-deadline callback
(wasmtime's C API, through wasmtime-py's bindings): every :data:`CHECK_TICKS` ticks of the
engine's epoch the callback looks at the run's :class:`GuestStop`; when the run was interrupted
(Ctrl-C) or its time limit passed, it returns an error and the guest traps with that message;
otherwise the guest goes on for another :data:`CHECK_TICKS`.  Something must advance the
engine's epoch (:class:`~wasinn_host.launch.runner.EpochTicker`); a guest blocked in a host call is
stopped by cancelling its inference (``WasiNN.cancel_all``), after which its wasm traps at the next check.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable

import wasmtime
from wasmtime import _ffi as ffi

from ..guest.callbacks import no_finalizer

CHECK_TICKS = 5
"""Epoch ticks between two checks of a Store (with the runner's 10 ms tick: 50 ms)."""
INTERRUPTED = "interrupted (Ctrl-C)"
"""The trap message of an interrupted run; a timed-out one names its limit (:meth:`GuestStop.reason`)."""

_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.POINTER(ffi.wasmtime_context_t),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ctypes.c_uint8),
)
_CONTINUE = 0  # WASMTIME_UPDATE_DEADLINE_CONTINUE


class GuestStop:
    """When the guests of one run must stop: an optional time limit from now, and an interrupt."""

    def __init__(self, timeout: float | None = None, timeout_name: str = "timeout") -> None:
        self.timeout = timeout
        self.timeout_name = timeout_name
        """What the caller called the limit: ``--timeout`` (an option) or ``timeout`` (a Python parameter)."""
        self.deadline = time.monotonic() + timeout if timeout else None
        self._interrupted = threading.Event()
        self._cancellers: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def interrupt(self) -> None:
        """Stop every Store of this run at its next check (Ctrl-C), and cancel the inference its guest
        waits in (see :meth:`watch`)."""
        self._interrupted.set()
        with self._lock:
            cancellers = list(self._cancellers.values())
        for cancel in cancellers:
            cancel()

    def watch(self, key: int, cancel: Callable[[], None]) -> None:
        """Call ``cancel()`` on :meth:`interrupt` (the Store ``key``'s inference in flight) until :meth:`unwatch`."""
        with self._lock:
            self._cancellers[key] = cancel
        if self._interrupted.is_set():
            cancel()

    def unwatch(self, key: int) -> None:
        """Forget the canceller of Store ``key`` (it has closed)."""
        with self._lock:
            self._cancellers.pop(key, None)

    @property
    def expired(self) -> bool:
        """The time limit has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def reason(self) -> str | None:
        """Why the run must stop now (the trap message), or None to go on."""
        if self._interrupted.is_set():
            return INTERRUPTED
        if self.expired:
            if self.timeout_name.startswith("-"):
                return f"stopped by {self.timeout_name} {self.timeout:g}s"
            return f"stopped by {self.timeout_name}={self.timeout:g} (seconds)"
        return None

    def install(self, store: wasmtime.Store) -> tuple[Any, ...]:
        """Make ``store`` check this stop every :data:`CHECK_TICKS` epoch ticks (its engine needs epoch
        interruption); returns the callback objects, which the caller keeps alive until the Store is closed."""

        def check(_context: Any, _env: Any, delta: Any, kind: Any) -> int:
            why = self.reason()
            if why is not None:
                return ctypes.cast(ffi.wasmtime_error_new(why.encode()), ctypes.c_void_p).value or 0
            delta[0] = CHECK_TICKS
            kind[0] = _CONTINUE
            return 0

        callback, finalizer = _CALLBACK(check), no_finalizer
        ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), callback, None, finalizer)
        store.set_epoch_deadline(CHECK_TICKS)
        return callback, finalizer
