"""The server's handle scopes: one per client session, plus the shared one WasmEdge clients use.

A call names its session in the ``wasinn-session`` metadata; a call without one (every
WasmEdge client) uses the anonymous scope, where handles are shared as in WasmEdge's server.
A scope is a :class:`~wasinn_host.ephemeral.handles.HandleTables` (the same handle tables
and limits a guest's Store has), so one session can never name another's graph or context.
A session's scope is freed when its last ``Attach`` stream ends (the client closed, died or
stopped answering keep-alive pings) or, for any scope, by the idle timeout.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterable

from ..core.config.limits import Limits
from ..ephemeral.handles import HandleTables
from ..guest.store_tables import ContextCounter

log = logging.getLogger("wasinn_host")

ANONYMOUS = ""


class SessionScopes:
    """Every client session's handle tables, under one set of limits and one allow-list."""

    def __init__(self, limits: Limits, allowed: Iterable[str] | None = None) -> None:
        self.limits = limits
        self.allowed = list(allowed) if allowed is not None else None
        self.counter = ContextCounter()
        self._lock = threading.Lock()
        self._scopes: dict[str, HandleTables] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._attached: dict[str, int] = {}
        self.freed_sessions = 0

    def scope(self, session: str) -> tuple[HandleTables, threading.Lock]:
        """The scope of ``session`` (created on first use) and the lock guarding its handle tables."""
        with self._lock:
            state = self._scopes.get(session)
            if state is None:
                state = self._scopes[session] = HandleTables(self.limits, self.counter, self.allowed)
                self._locks[session] = threading.Lock()
            return state, self._locks[session]

    def attach(self, session: str) -> None:
        """A keep-alive stream of ``session`` opened."""
        with self._lock:
            self._attached[session] = self._attached.get(session, 0) + 1

    def detach(self, session: str) -> None:
        """A keep-alive stream of ``session`` ended; the last one frees the session's scope."""
        with self._lock:
            left = self._attached.get(session, 0) - 1
            if left > 0:
                self._attached[session] = left
                return
            self._attached.pop(session, None)
            state = self._scopes.pop(session, None)
            self._locks.pop(session, None)
        if state is not None:
            contexts, graphs = len(state.contexts), len(state.graphs)
            state.close()
            self.freed_sessions += 1
            log.info("session %s ended: freed %d contexts and %d graphs", session, contexts, graphs)

    def reap_idle(self, idle_seconds: float) -> int:
        """Finalise contexts of any scope unused for ``idle_seconds``; return how many."""
        with self._lock:
            scopes = list(self._scopes.values())
        return sum(state.reap_idle(idle_seconds) for state in scopes)

    def status(self) -> dict[str, int]:
        """Sessions open, sessions with a keep-alive stream, contexts open, sessions freed."""
        with self._lock:
            return {
                "sessions": len(self._scopes),
                "attached": len(self._attached),
                "contexts": self.counter.value,
                "freed_sessions": self.freed_sessions,
            }

    def close(self) -> None:
        """Free every scope."""
        with self._lock:
            scopes = list(self._scopes.values())
            self._scopes.clear()
            self._locks.clear()
            self._attached.clear()
        for state in scopes:
            state.close()
