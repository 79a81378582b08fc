"""Per-Store state for the front ends: one table per front end, freed with the Store, reaped when idle.

The ``wasi_ephemeral_nn`` imports and the ``wasi:nn`` WIT imports each keep one state object per
wasmtime Store (handle or resource tables).  A :class:`StoreTable` maps a Store to its state, closes
the state when the Store is dropped or detached, and finalises execution contexts left idle for
``idle_timeout_ms``; one process-wide thread (:class:`IdleReaper`) does that for every table.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from typing import Any, Callable, Generic, Protocol, TypeVar

from ..core.config.limits import Limits

log = logging.getLogger("wasinn_host")


class ContextCounter:
    """Execution contexts alive in the whole process (for ``max_contexts_total``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n: int) -> None:
        """Add ``n`` (negative to remove)."""
        with self._lock:
            self.value += n


class PerStoreState(Protocol):
    """What a front end's per-Store state offers the table."""

    def close(self) -> None:
        """Free everything the Store holds."""

    def reap_idle(self, idle_seconds: float) -> int:
        """Finalise contexts unused for ``idle_seconds``; return how many."""


S = TypeVar("S", bound=PerStoreState)


def store_key(store: Any) -> int:
    """The address of a Store's context: the same for the Store, its callbacks' StoreContext
    and the raw context pointer a native host call receives."""
    return ctypes.addressof(store._context().contents)


class StoreTable(Generic[S]):
    """Store -> state, for one front end; ``what`` names its contexts in the reaper's log line."""

    def __init__(self, limits: Limits, what: str, unattached_warning: str) -> None:
        self.limits = limits
        self._what = what
        self._unattached_warning = unattached_warning
        self._states: dict[int, S] = {}
        self._lock = threading.Lock()
        self._warned_unattached = False

    def put(self, store: Any, state: S) -> S:
        """Make ``state`` the Store's (closing a previous one); it is closed when the Store is dropped."""
        key = store_key(store)
        self._watch()
        with self._lock:
            old = self._states.pop(key, None)
            self._states[key] = state
        if old is not None:
            old.close()
        weakref.finalize(store, self._drop, key, state)
        return state

    def get(self, key: int, new_state: Callable[[], S]) -> S:
        """The state of the Store at ``key``; a Store never attached gets one (and a warning, once)."""
        state = self._states.get(key)
        if state is None:
            self._watch()
            with self._lock:
                state = self._states.setdefault(key, new_state())
            if not self._warned_unattached:
                self._warned_unattached = True
                log.warning(self._unattached_warning)
        return state

    def lookup(self, key: int) -> S | None:
        """The state at ``key`` if there is one."""
        return self._states.get(key)

    def detach(self, store: Any) -> None:
        """Free the Store's state now."""
        self._drop(store_key(store), None)

    def _drop(self, key: int, expected: S | None) -> None:
        with self._lock:
            state = self._states.get(key)
            if state is None or (expected is not None and state is not expected):
                return
            del self._states[key]
        state.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

    def states(self) -> list[S]:
        """The states of the Stores known now."""
        with self._lock:
            return list(self._states.values())

    def _watch(self) -> None:
        if self.limits.idle_timeout_ms > 0:
            IdleReaper.watch(self)

    def reap_idle(self) -> None:
        """Finalise the execution contexts unused for ``idle_timeout_ms`` in every Store."""
        idle = self.limits.idle_timeout_ms / 1000.0
        for state in self.states():
            try:
                reaped = state.reap_idle(idle)
            except Exception:  # one Store's failure must not stop the reaping of the others
                log.exception("reaping a Store's idle %s failed", self._what)
                continue
            if reaped:
                log.info(
                    "finalised %d %s idle for more than idle_timeout_ms=%d",
                    reaped,
                    self._what,
                    self.limits.idle_timeout_ms,
                )


class IdleReaper:
    """One process-wide thread that reaps idle contexts for every live :class:`StoreTable`."""

    _targets: weakref.WeakSet[StoreTable[Any]] = weakref.WeakSet()
    _thread: threading.Thread | None = None
    _lock = threading.Lock()
    _wake = threading.Event()

    @classmethod
    def watch(cls, table: StoreTable[Any]) -> None:
        """Reap ``table`` from now on (as long as it lives)."""
        with cls._lock:
            if table not in cls._targets:
                cls._targets.add(table)
                cls._wake.set()  # a new, maybe shorter, period
            if cls._thread is None:
                cls._thread = threading.Thread(target=cls._run, name="wasinn-idle-reaper", daemon=True)
                cls._thread.start()

    @classmethod
    def _run(cls) -> None:
        while True:
            targets = list(cls._targets)
            period = min((t.limits.idle_timeout_ms / 4000.0 for t in targets), default=1.0)
            cls._wake.wait(min(max(period, 0.01), 5.0))
            cls._wake.clear()
            for target in targets:
                try:
                    target.reap_idle()
                except Exception:  # a bug in one table must not stop the reaping of every Store's contexts
                    log.exception("reaping idle contexts failed")
            del targets
