"""The socket fuzzer's side of the network, on loopback only, and the watch that bounds every call.

:class:`Peers` holds the host's own sockets a fuzzed guest talks to: a TCP listener and a UDP socket
on 127.0.0.1 (the only ports besides the guest's own that the guest is pointed at), the
connections it accepted, and clients it connected to the guest's listeners.

:class:`CallWatch` bounds a guest call that blocks (a blocking ``recv`` with nothing sent, an
``accept`` with nobody connecting, a ``poll_oneoff`` on sockets only): after ``nudge_after`` seconds
the peers act (connect to every guest listener, send a byte on every connection, read what the
guest sent) every ``nudge_after`` seconds; after ``cancel_after`` seconds the guest's Store is
cancelled, as Ctrl-C or ``--timeout`` would (its calls answer INTR, and the example ends there); and
after ``hard_after`` seconds faulthandler dumps every thread's stack and exits the process, which is
the fuzzer's hang report.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import sys
import threading
import time
from typing import Any, Iterator

from wasinn_host.sockets.table import SocketState

_REAL_STDERR = sys.__stderr__ or sys.stderr


class Peers:
    """The host-side sockets of one fuzz run, all on 127.0.0.1."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.setblocking(False)
        self.connections: list[socket.socket] = []
        self.closed_port = _closed_port()
        self.nudges = 0

    @property
    def ports(self) -> tuple[int, int, int]:
        """The TCP listener's, the UDP socket's and a closed port (connections there are refused)."""
        return self.listener.getsockname()[1], self.udp.getsockname()[1], self.closed_port

    def accept_all(self) -> None:
        """Take every connection the guest made to the listener."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.setblocking(False)
            self.connections.append(conn)

    def connect_to(self, address: Any, family: int) -> None:
        """Connect a new client to a guest listener (without waiting for the guest to accept)."""
        client = socket.socket(family, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            client.connect(address)
        except BlockingIOError:
            pass
        except OSError:
            client.close()
            return
        self.connections.append(client)

    def send_all(self, data: bytes) -> None:
        """Send ``data`` on every connection (what fits) and a datagram from the UDP socket to each peer."""
        for conn in self.connections:
            try:
                conn.send(data)
            except OSError:
                pass

    def drain(self) -> None:
        """Read and drop what the guest sent, so its blocking sends go on."""
        for conn in self.connections:
            try:
                while conn.recv(1 << 16):
                    pass
            except OSError:
                pass
        try:
            while True:
                self.udp.recv(1 << 16)
        except OSError:
            pass

    def close_some(self, count: int, reset: bool) -> None:
        """Close the oldest ``count`` connections, with a reset (``SO_LINGER`` 0) if ``reset``."""
        for conn in self.connections[:count]:
            if reset:
                try:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            conn.close()
        del self.connections[:count]

    def nudge(self, state: SocketState | None) -> None:
        """Everything a blocked guest call might wait for: connections to its listeners, bytes on
        every connection, room in every connection's buffer."""
        self.nudges += 1
        self.accept_all()
        if state is not None:
            for entry in list(state.entries.values()):
                sock = entry.sock
                try:
                    if sock.type == socket.SOCK_STREAM and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        self.connect_to(sock.getsockname(), sock.family)
                    elif sock.type == socket.SOCK_DGRAM and sock.family == socket.AF_INET and sock.getsockname()[1]:
                        self.udp.sendto(b"n", sock.getsockname())
                except OSError:
                    pass
        self.send_all(b"n")
        self.drain()

    def close(self) -> None:
        """Close every host-side socket."""
        self.close_some(len(self.connections), reset=False)
        self.listener.close()
        self.udp.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class CallWatch:
    """One watcher thread for a run; ``with watch.call(state):`` around each guest call.  The thread
    looks every ``nudge_after`` seconds (a call costs it nothing: no thread or timer per call) and
    nudges the peers, cancels ``state`` or reports a hang, by how long the current call has taken."""

    def __init__(self, peers: Peers, *, nudge_after: float, cancel_after: float, hard_after: float) -> None:
        self.peers = peers
        self.nudge_after = nudge_after
        self.cancel_after = cancel_after
        self.hard_after = hard_after
        self.cancelled = False
        """Whether the current (or last) call was cancelled."""
        self.nudged = False
        """Whether the peers acted during the current (or last) call."""
        self._current: tuple[float, SocketState | None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="socket-fuzz-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """End the watcher thread."""
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def call(self, state: SocketState | None) -> Iterator[CallWatch]:
        """Watch one call on ``state``'s guest."""
        self.cancelled = self.nudged = False
        self._current = (time.monotonic(), state)
        try:
            yield self
        finally:
            self._current = None

    def _watch(self) -> None:
        cancelled: tuple[float, SocketState | None] | None = None
        while not self._stop.wait(self.nudge_after):
            current = self._current
            if current is None:
                continue
            started, state = current
            elapsed = time.monotonic() - started
            if elapsed >= self.hard_after:
                print(f"socket fuzz: a call has not returned in {elapsed:.0f} s; stacks:", file=_REAL_STDERR)
                faulthandler.dump_traceback(file=_REAL_STDERR, all_threads=True)
                os._exit(70)
            if elapsed >= self.cancel_after:
                if cancelled is not current and self._current is current and state is not None:
                    state.cancel()
                    self.cancelled = True
                    cancelled = current
            elif elapsed >= self.nudge_after and self._current is current:
                self.nudged = True
                self.peers.nudge(state)
