"""The spill store: idle execution contexts' state on disk, a few bytes each left in memory.

Guests built for WasmEdge (LlamaEdge's API server) open an execution context per request and never
finalize it.  A front end keeps its most recently used contexts in memory and hands the others here:
each becomes one row (its tokens, output and usage, serialized by the context itself) in a private
SQLite database, and the front end keeps only the handle's entry.  The next use takes the row back and
rebuilds the context, which then answers exactly as it would have.

- **One database per process**, opened on the first spill as SQLite's private temporary file (an empty
  file name: created in ``SQLITE_TMPDIR``, ``TMPDIR`` or ``/var/tmp``, unlinked at once, so nothing is
  left behind even when the process is killed), with a small page cache (:data:`CACHE_KIB`).
- **Bounded**: at most :data:`MAX_BYTES` on disk; a spill beyond it (or on a full disk) fails and the
  context simply stays in memory (logged once).  :meth:`ColdStore.status` reports rows and bytes.
- **Shared references stay in memory once**: what many contexts have in common (graph, registry,
  limits, parameters) is a :class:`Frozen`'s ``shared`` tuple, kept once per distinct ``shared_key``
  for as long as a row needs it; ``kept`` is what one context must keep in memory (a stream's sampler).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any, Hashable, NamedTuple, Protocol

log = logging.getLogger("wasinn_host")

MAX_BYTES = 1 << 30
"""The spill store's bound on disk (1 GiB); beyond it contexts stay in memory."""
CACHE_KIB = 256
"""SQLite's page cache for the spill store (KiB of memory)."""


class Thawable(Protocol):
    """A kind of object the store can rebuild: its class offers these two."""

    @classmethod
    def thaw(cls, shared: tuple[Any, ...], blob: bytes, kept: Any) -> Any:
        """The object again, from what :meth:`freeze` gave."""

    @classmethod
    def drop_frozen(cls, shared: tuple[Any, ...], kept: Any) -> None:
        """Free what a frozen object held (it is finalised without being rebuilt)."""


class Frozen(NamedTuple):
    """An object as the store keeps it."""

    kind: type[Thawable]
    shared: tuple[Any, ...]
    """References many frozen objects have in common, kept in memory once per ``shared_key``."""
    shared_key: Hashable
    blob: bytes
    """The object's own state (goes to disk)."""
    kept: Any = None
    """What this object alone keeps in memory while frozen (None: nothing)."""


class _Group:
    """References shared by some rows, and how many rows use them."""

    __slots__ = ("gid", "kind", "shared", "rows")

    def __init__(self, gid: int, kind: type[Thawable], shared: tuple[Any, ...]) -> None:
        self.gid = gid
        self.kind = kind
        self.shared = shared
        self.rows = 0


class ColdStore:
    """Rows of frozen objects by key, in one private SQLite database (thread-safe)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.lock = threading.RLock()
        """Held around every change; front ends hold it too while they swap an object for its row."""
        self._db: sqlite3.Connection | None = None
        self._groups: dict[Hashable, _Group] = {}
        self._by_gid: dict[int, Hashable] = {}
        self._next_gid = 0
        self._kept: dict[int, Any] = {}
        self.rows = 0
        self.spilled = 0
        """Objects frozen since the process started."""
        self._warned = False

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect("", check_same_thread=False, isolation_level=None)
            db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            db.execute("PRAGMA journal_mode = OFF")
            db.execute("PRAGMA synchronous = OFF")
            page = int(db.execute("PRAGMA page_size").fetchone()[0])
            db.execute(f"PRAGMA max_page_count = {max(16, self.max_bytes // page)}")
            db.execute("CREATE TABLE cold (key INTEGER PRIMARY KEY, gid INTEGER, blob BLOB)")
            self._db = db
        return self._db

    def put(self, key: int, frozen: Frozen) -> bool:
        """Keep ``frozen`` under ``key`` (an id unique among live keys); False if the store is full."""
        with self.lock:
            group = self._groups.get(frozen.shared_key)
            if group is None:
                group = _Group(self._next_gid, frozen.kind, frozen.shared)
            try:
                self._open().execute("INSERT INTO cold VALUES (?, ?, ?)", (key, group.gid, frozen.blob))
            except sqlite3.Error as exc:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "idle execution contexts stay in memory: the spill store takes no more (%s; %.1f MiB "
                        "on disk, bound %.1f MiB)",
                        exc,
                        self.size_bytes() / 2**20,
                        self.max_bytes / 2**20,
                    )
                return False
            if group.rows == 0:
                self._groups[frozen.shared_key] = group
                self._by_gid[group.gid] = frozen.shared_key
                self._next_gid += 1
            group.rows += 1
            if frozen.kept is not None:
                self._kept[key] = frozen.kept
            self.rows += 1
            self.spilled += 1
            return True

    def take(self, key: int) -> Any:
        """The object under ``key``, rebuilt; the row is gone afterwards."""
        with self.lock:
            group, blob, kept = self._remove(key, with_blob=True)
            return group.kind.thaw(group.shared, blob, kept)

    def drop(self, key: int) -> None:
        """Forget the object under ``key`` without rebuilding it (its kind frees what it held)."""
        with self.lock:
            group, _, kept = self._remove(key, with_blob=False)
        group.kind.drop_frozen(group.shared, kept)

    def _remove(self, key: int, with_blob: bool) -> tuple[_Group, bytes, Any]:
        db = self._open()
        row = db.execute(f"SELECT gid{', blob' if with_blob else ''} FROM cold WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        db.execute("DELETE FROM cold WHERE key = ?", (key,))
        self.rows -= 1
        shared_key = self._by_gid[row[0]]
        group = self._groups[shared_key]
        group.rows -= 1
        if group.rows == 0:
            del self._groups[shared_key], self._by_gid[group.gid]
        return group, row[1] if with_blob else b"", self._kept.pop(key, None)

    def size_bytes(self) -> int:
        """Bytes of the database on disk (0 before the first spill)."""
        with self.lock:
            if self._db is None:
                return 0
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            return int(pages) * int(self._db.execute("PRAGMA page_size").fetchone()[0])

    def status(self) -> dict[str, int]:
        """``spilled_contexts`` (rows now) and ``spill_store_bytes`` (the file's size)."""
        return {"spilled_contexts": self.rows, "spill_store_bytes": self.size_bytes()}


COLD_STORE = ColdStore()
"""The process's spill store."""
