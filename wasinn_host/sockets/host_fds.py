"""The process's descriptors: its ``RLIMIT_NOFILE``, how many are open, and wasmtime's WASI runtime.

wasmtime's WASI builds a Rust (tokio) runtime the first time a guest's WASI call needs it, and
panics, aborting the whole process, if no descriptor is left for that runtime at that moment.  A
guest holding sockets could make that moment arrive with every descriptor taken, so
:func:`prepare_process` starts that runtime before any guest runs with sockets (and raises the soft
``RLIMIT_NOFILE`` to the hard limit), once per process.
"""

from __future__ import annotations

import logging
import os
import resource
import threading

import wasmtime

log = logging.getLogger("wasinn_host")

RAISE_CEILING = 1 << 20
"""The soft limit asked for when the hard limit is unlimited (Linux refuses more than ``nr_open``)."""

_WARM_WAT = """(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "warm") (result i32)
    ;; one relative clock subscription of 0 ns at 0 (type 0 = clock, clock id 1 = monotonic)
    (i32.store (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128))))
"""

_prepared = False
_lock = threading.Lock()


def nofile_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` (None when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else soft


def open_descriptors() -> int | None:
    """How many descriptors the process has open (None where ``/proc/self/fd`` cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opened
    except OSError:
        return None


def raise_nofile_limit() -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (a server holds a descriptor per client)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = RAISE_CEILING if hard == resource.RLIM_INFINITY or hard < 0 else hard
    if soft != resource.RLIM_INFINITY and 0 <= soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.debug("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)


def start_wasi_runtime(engine: wasmtime.Engine) -> None:
    """Make wasmtime's WASI build its runtime now, while descriptors are free (one ``poll_oneoff``)."""
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    store = wasmtime.Store(engine)
    store.set_epoch_deadline(1 << 40)  # an engine with epoch interruption traps at once without one
    store.set_wasi(wasmtime.WasiConfig())
    warm = linker.instantiate(store, wasmtime.Module(engine, _WARM_WAT)).exports(store)["warm"]
    assert isinstance(warm, wasmtime.Func)
    warm(store)


def prepare_process(engine: wasmtime.Engine) -> None:
    """Once per process, before a guest holds sockets: raise the soft descriptor limit and start
    wasmtime's WASI runtime."""
    global _prepared
    with _lock:
        if _prepared:
            return
        raise_nofile_limit()
        start_wasi_runtime(engine)
        _prepared = True
