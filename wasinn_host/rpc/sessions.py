"""The server's handle scopes: one per client session, plus the shared one WasmEdge clients use.

A call names its session in the ``wasinn-session`` metadata; a call without one (every
WasmEdge client) uses the anonymous scope, where handles are shared as in WasmEdge's server.
A scope is a :class:`~wasinn_host.ephemeral.handles.HandleTables` (the same handle tables
and limits a guest's Store has), so one session can never name another's graph or context.
A session's scope is freed at once when its client says it is done (``Detach``, sent by a closing
client), and ``grace_s`` seconds after its last ``Attach`` stream ended otherwise (the client died or
stopped answering keep-alive pings, or something on the way ended the stream: a proxy's idle or
stream-age limit, a reset connection), unless the client attaches again meanwhile, as a live client
does at once: so a stream cut in transit loses no handle.  Each scope has an id, new whenever the scope
is made anew, which the keep-alive stream and ``Status`` give the client: a client that sees another id
than before knows that its handles there are gone (the server restarted, or the client was away longer
than the grace).  Any scope's idle contexts are finalised by the idle timeout.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Iterable

from ..core.config.limits import Limits
from ..ephemeral.handles import HandleTables
from ..guest.store_tables import ContextCounter

log = logging.getLogger("wasinn_host")

ANONYMOUS = ""


class SessionScopes:
    """Every client session's handle tables, under one set of limits and one allow-list."""

    def __init__(self, limits: Limits, allowed: Iterable[str] | None = None, grace_s: float = 30.0) -> None:
        self.limits = limits
        self.grace_s = grace_s
        """How long a session whose keep-alive streams all ended is kept for its client to attach again."""
        self.allowed = list(allowed) if allowed is not None else None
        self.counter = ContextCounter()
        self._lock = threading.Lock()
        self._grace_due = threading.Condition(self._lock)
        """Wakes the thread that frees sessions whose grace ran out (:meth:`_free_expired`)."""
        self._expirer: threading.Thread | None = None
        self._closed = False
        self._scopes: dict[str, HandleTables] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._attached: dict[str, int] = {}
        self._ids: dict[str, str] = {}
        """Each scope's id (:meth:`scope_id`)."""
        self._orphaned: dict[str, float] = {}
        """Sessions whose keep-alive streams all ended, each with when its grace runs out (monotonic)."""
        self.freed_sessions = 0

    def scope(self, session: str) -> tuple[HandleTables, threading.Lock]:
        """The scope of ``session`` (created on first use) and the lock guarding its handle tables."""
        with self._lock:
            return self._scope_locked(session)

    def _scope_locked(self, session: str) -> tuple[HandleTables, threading.Lock]:
        state = self._scopes.get(session)
        if state is None:
            state = self._scopes[session] = HandleTables(self.limits, self.counter, self.allowed)
            self._locks[session] = threading.Lock()
            self._ids[session] = uuid.uuid4().hex
        return state, self._locks[session]

    def scope_id(self, session: str) -> str:
        """The id of ``session``'s scope (created if need be): a new one whenever the scope is made anew,
        so a client that sees another id knows its handles there are gone."""
        with self._lock:
            self._scope_locked(session)
            return self._ids[session]

    def attach(self, session: str) -> str:
        """A keep-alive stream of ``session`` opened (a session waiting out its grace is kept); the id of
        its scope."""
        with self._lock:
            self._attached[session] = self._attached.get(session, 0) + 1
            kept = self._orphaned.pop(session, None) is not None
            self._scope_locked(session)
            scope_id = self._ids[session]
        if kept:
            log.info("session %s attached again", session)
        return scope_id

    def detach(self, session: str) -> None:
        """A keep-alive stream of ``session`` ended; after the last one the session's scope is freed once
        :attr:`grace_s` passes without the client attaching again (at once with no grace)."""
        with self._lock:
            left = self._attached.get(session, 0) - 1
            if left > 0:
                self._attached[session] = left
                return
            self._attached.pop(session, None)
            if self.grace_s > 0 and session in self._scopes and not self._closed:
                self._orphaned[session] = time.monotonic() + self.grace_s
                if self._expirer is None:
                    self._expirer = threading.Thread(target=self._free_expired, daemon=True, name="wasinn-grace")
                    self._expirer.start()
                self._grace_due.notify()
                return
            state = self._pop_locked(session)
        self._free(session, state, "ended")

    def _free_expired(self) -> None:
        """The thread that frees each session whose grace ran out (one for all of them)."""
        why = f"had no keep-alive stream for {self.grace_s:g} s"
        while True:
            with self._lock:
                while not self._closed:
                    now = time.monotonic()
                    expired = [session for session, due in self._orphaned.items() if due <= now]
                    if expired:
                        break
                    self._grace_due.wait(min(self._orphaned.values(), default=now + 3600.0) - now)
                if self._closed:
                    return
                freed = [(session, self._pop_locked(session)) for session in expired]
            for session, state in freed:
                self._free(session, state, why)

    def end(self, session: str, why: str = "ended") -> None:
        """Free ``session``'s scope now (its client closed, or its grace passed)."""
        with self._lock:
            state = self._pop_locked(session)
        self._free(session, state, why)

    def _pop_locked(self, session: str) -> HandleTables | None:
        """Take ``session``'s scope out of the tables (holding ``_lock``): a later call makes a new one."""
        self._orphaned.pop(session, None)
        self._locks.pop(session, None)
        self._ids.pop(session, None)
        state = self._scopes.pop(session, None)
        if state is not None:
            self.freed_sessions += 1
        return state

    @staticmethod
    def _free(session: str, state: HandleTables | None, why: str) -> None:
        if state is not None:
            contexts, graphs = len(state.contexts), len(state.graphs)
            state.close()
            log.info("session %s %s: freed %d contexts and %d graphs", session, why, contexts, graphs)

    def reap_idle(self, idle_seconds: float) -> int:
        """Finalise contexts of any scope unused for ``idle_seconds``; return how many."""
        with self._lock:
            scopes = list(self._scopes.values())
        return sum(state.reap_idle(idle_seconds) for state in scopes)

    def status(self) -> dict[str, int]:
        """Sessions open, sessions with a keep-alive stream, sessions waiting out their grace for their
        client to attach again, contexts open, sessions freed."""
        with self._lock:
            return {
                "sessions": len(self._scopes),
                "attached": len(self._attached),
                "orphaned": len(self._orphaned),
                "contexts": self.counter.value,
                "freed_sessions": self.freed_sessions,
            }

    def close(self) -> None:
        """Free every scope."""
        with self._lock:
            scopes = list(self._scopes.values())
            self._closed = True
            self._grace_due.notify()
            self._scopes.clear()
            self._locks.clear()
            self._attached.clear()
            self._ids.clear()
            self._orphaned.clear()
        for state in scopes:
            state.close()
