"""Ready ``wasi:io/poll`` pollables for host functions that must return one.

A pollable is a resource of wasmtime's own WASI implementation (``add_wasip2``); a host function
defined through wasmtime's C API can only create resources of its own types.  So a tiny
component (below) is instantiated in the guest's Store next to the guest: its ``ready`` asks
``wasi:clocks/monotonic-clock`` for a zero-duration subscription and returns the pollable to the
host, which passes it on to the guest as its own.  ``block`` on it returns at once.
"""

from __future__ import annotations

import threading
from typing import Any

import wasmtime
from wasmtime import component as cm

FACTORY_WAT = """
(component
  (import "wasi:io/poll@0.2.0" (instance $poll (export "pollable" (type (sub resource)))))
  (alias export $poll "pollable" (type $pollable))
  (import "wasi:clocks/monotonic-clock@0.2.0" (instance $clock
    (alias outer 1 $pollable (type $p))
    (export "subscribe-duration" (func (param "when" u64) (result (own $p))))))
  (core func $subscribe (canon lower (func $clock "subscribe-duration")))
  (core module $m
    (import "clock" "subscribe" (func $subscribe (param i64) (result i32)))
    (func (export "ready") (result i32) (call $subscribe (i64.const 0))))
  (core instance $i (instantiate $m (with "clock" (instance (export "subscribe" (func $subscribe))))))
  (func (export "ready") (result (own $pollable)) (canon lift (core func $i "ready"))))
"""


class ReadyPollables:
    """Makes ready pollables in any Store of one engine (the factory is compiled on first use)."""

    def __init__(self, engine: wasmtime.Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._factory: tuple[cm.Linker, cm.Component] | None = None

    def _compiled(self) -> tuple[cm.Linker, cm.Component]:
        with self._lock:
            if self._factory is None:
                linker = cm.Linker(self.engine)
                linker.add_wasip2()
                self._factory = (linker, cm.Component(self.engine, FACTORY_WAT))
            return self._factory

    def new(self, store: Any, cache: dict[str, Any]) -> Any:
        """A ready pollable for the guest to own; ``cache`` (one per Store) keeps the factory instance."""
        ready = cache.get("ready")
        if ready is None:
            linker, component = self._compiled()
            ready = linker.instantiate(store, component).get_func(store, "ready")
            if ready is None:
                raise RuntimeError("the pollable factory exports no ready function")
            cache["ready"] = ready
        return ready(store)
