"""Per-Store socket state: the descriptor table, waiting, and cancellation.

Socket descriptors are numbered from :data:`SOCKET_FD_BASE` up, far above the descriptors
wasmtime's WASI hands out (3, 4, ... for preopens and opened files), so one number never
means two things; a number is not reused while the Store lives.  Every host socket is
non-blocking; a guest's *blocking* call waits in :meth:`SocketState.wait`, which also wakes
when :meth:`SocketState.cancel` is called (Ctrl-C, ``--timeout``), so no guest can hold the
host in a socket call.  After a cancel, socket calls answer ``INTR`` for :data:`CANCEL_GRACE`
seconds, so the guest returns to its wasm, where the run's stop traps it with its own message
(``interrupted (Ctrl-C)``, ``stopped by --timeout``); a guest still calling after that (no stop
armed, a guest retrying forever) is trapped by the socket layer itself.  The table also counts the
sockets every Store of the process holds (:func:`sockets_in_process`, for the caps of :mod:`.budget`).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..guest.native_func import GuestTrap, MemoryRef
from .constants import SOCK_DGRAM, SOCK_STREAM, WasiErrno

if TYPE_CHECKING:
    from .shared import SharedBinds

SOCKET_FD_BASE = 1 << 16
"""The first socket descriptor number (wasmtime's own descriptors stay far below it)."""
CANCEL_GRACE = 1.0
"""Seconds after a cancel during which socket calls answer INTR before they trap the guest."""

_held = 0
_held_lock = threading.Lock()


def sockets_in_process() -> int:
    """How many sockets the guests of every Store in this process hold now."""
    return _held


def _count(change: int) -> None:
    global _held
    with _held_lock:
        _held += change


class SockError(Exception):
    """A call's WASI errno, with an optional log line (``None``: the guest is told, nothing is logged)."""

    def __init__(self, errno: WasiErrno, message: str | None = None) -> None:
        super().__init__(message or errno.name)
        self.errno = errno
        self.message = message


@dataclass
class SocketEntry:
    """One guest socket: the host socket and what the guest set on it."""

    sock: socket.socket
    kind: int = SOCK_STREAM
    """WasmEdge's socket type (``SOCK_STREAM`` or ``SOCK_DGRAM``)."""
    nonblocking: bool = False
    """The guest's view (``FDFLAGS_NONBLOCK``); the host socket itself never blocks."""
    options: dict[tuple[int, int], Any] = field(default_factory=dict)
    """Host ``setsockopt`` calls to repeat if the socket is re-created for another family."""
    recv_timeout: float | None = None
    send_timeout: float | None = None
    release: Callable[[], None] | None = None
    """Set on a socket bound through a :class:`~wasinn_host.sockets.shared.ListenerGroup` (the address the
    instances of one run share): lets go of the address when this socket closes."""

    def close(self) -> None:
        """Close the host socket (and let go of a shared address)."""
        self.sock.close()
        release, self.release = self.release, None
        if release is not None:
            release()

    @property
    def filetype_is_stream(self) -> bool:
        """Whether this is a stream (TCP) socket."""
        return self.kind != SOCK_DGRAM


class SocketState:
    """One Store's sockets, its cached memory export and its pass-through instance."""

    def __init__(self, shared: SharedBinds | None = None) -> None:
        self.entries: dict[int, SocketEntry] = {}
        self.shared = shared
        """The addresses this Store shares with its sibling instances (``wasinn run --instances N``)."""
        self.accepted: set[int] = set()
        """Shared listeners this Store accepted on since its last ``poll_oneoff`` (see :mod:`.shared`)."""
        self.memory: MemoryRef | None = None
        self.passthrough: Any = None
        """The Store's :class:`~wasinn_host.sockets.passthrough.PassThrough`, made on first use."""
        self._next_fd = SOCKET_FD_BASE
        self._lock = threading.Lock()
        self._cancelled_at: float | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self.warned: set[str] = set()
        """The socket caps this Store's guest has been refused by (each is logged once per Store)."""

    # -- descriptors --------------------------------------------------------------

    def add(self, entry: SocketEntry) -> int:
        """Give ``entry`` a new descriptor number."""
        with self._lock:
            fd = self._next_fd
            self._next_fd += 1
            if self._next_fd > 0x7FFF_FFFF:
                self._next_fd = SOCKET_FD_BASE  # after 2 billion sockets: reuse numbers not in use
            while self._next_fd in self.entries:
                self._next_fd += 1
            self.entries[fd] = entry
        _count(1)
        return fd

    def entry(self, fd: int) -> SocketEntry:
        """The socket at ``fd`` (BADF if there is none)."""
        entry = self.entries.get(fd)
        if entry is None:
            raise SockError(WasiErrno.BADF)
        return entry

    def remove(self, fd: int) -> None:
        """Close and forget the socket at ``fd`` (BADF if there is none)."""
        with self._lock:
            entry = self.entries.pop(fd, None)
        if entry is None:
            raise SockError(WasiErrno.BADF)
        _count(-1)
        self.accepted.discard(fd)
        entry.close()

    def close(self) -> None:
        """Close every socket (the Store is gone or its guest ended)."""
        self.cancel()
        with self._lock:
            entries, self.entries = list(self.entries.values()), {}
            wake, self._wake = self._wake, None
        _count(-len(entries))
        for entry in entries:
            entry.close()
        if wake is not None:
            for end in wake:
                end.close()
        self.passthrough = None

    def reap_idle(self, idle_seconds: float) -> int:
        """Sockets are not reaped (the guest owns them); always 0."""
        return 0

    # -- waiting ------------------------------------------------------------------

    def cancel(self) -> None:
        """Make every wait, now and later, trap the guest (Ctrl-C, ``--timeout``, Store closed)."""
        with self._lock:
            if self._cancelled_at is None:
                self._cancelled_at = time.monotonic()
            wake = self._wake
        if wake is not None:
            try:
                wake[1].send(b"x")
            except OSError:
                pass

    def check_cancelled(self) -> None:
        """INTR if the host is stopping the guest; a trap once :data:`CANCEL_GRACE` has passed."""
        if self._cancelled_at is None:
            return
        if time.monotonic() - self._cancelled_at < CANCEL_GRACE:
            raise SockError(WasiErrno.INTR)
        raise GuestTrap("interrupted: the host stopped the guest while it used a socket")

    MAX_POLL_MS = 2**31 - 1
    """The longest one host ``poll`` waits: its timeout is a C ``int`` of milliseconds (24.8 days)."""

    def wait(self, interests: list[tuple[int, int]], timeout: float | None) -> dict[int, int]:
        """Wait until one of ``(host fd, poll events)`` is ready or ``timeout`` seconds pass
        (``None``: no limit); return ``{host fd: revents}`` of the ready ones.  A timeout longer than
        one ``poll`` can take (a guest's 30-day ``SO_RCVTIMEO``, a clock subscription of u64::MAX ns)
        is waited in pieces of :attr:`MAX_POLL_MS`: WASI and the socket options allow any length, so
        it is honoured, never an error (Python's ``poll`` raises OverflowError past the C int)."""
        self.check_cancelled()
        poller = select.poll()
        wake_fd = self._wake_fd()
        poller.register(wake_fd, select.POLLIN)
        for host_fd, events in interests:
            poller.register(host_fd, events)
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000 + 0.999))
            ready = poller.poll(None if left is None else min(left, self.MAX_POLL_MS))
            self.check_cancelled()
            if ready or left is None or left <= self.MAX_POLL_MS:
                return {host_fd: revents for host_fd, revents in ready if host_fd != wake_fd}

    def _wake_fd(self) -> int:
        with self._lock:
            if self._wake is None:
                self._wake = socket.socketpair()
                self._wake[0].setblocking(False)
            return self._wake[0].fileno()
