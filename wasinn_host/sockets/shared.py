"""One address for the instances of one run: ``wasinn run --instances N`` of a server guest.

A server built for WasmEdge (LlamaEdge's API server, the project's ``chat_server``) binds its address
once and serves one request at a time.  Run N instances of it and each binds the same address: on
its own, every instance after the first would get ``ADDRINUSE``.  The instances of one run share a
:class:`ListenerGroup` instead: the first instance's ``sock_bind`` of a stream socket binds the host
socket as usual (through the socket policy, as every bind); the same bind by a sibling instance
(same family, address and port, the same how-many-th bind of that address in that instance) is
given a duplicate of that bound socket rather than a socket of its own.  Every instance then listens
and accepts on the one kernel socket, whose single queue of connections the kernel hands to
whichever instance accepts next: no connection waits in the queue of an instance that is busy or
has ended, as it could with ``SO_REUSEPORT``'s one queue per socket.  Nothing else may share the
address: the host socket is bound without ``SO_REUSEPORT``, so another process (a second ``wasinn
run``) still gets ``ADDRINUSE``.  Datagram sockets are never shared.

So that one instance does not take every waiting connection at once (a server's accept loop accepts
until ``AGAIN``) and then serve them one after another while its siblings idle, a non-blocking
``sock_accept`` on a shared listener gives an instance one connection per ``poll_oneoff``: the next
accept before the instance polls again answers ``AGAIN`` (which a non-blocking server takes as "none
waiting" and polls), and that next ``poll_oneoff`` leaves the listener out while another of the
instance's subscriptions is ready (the request on the connection it just took: :mod:`.poll`), so the
connections of a burst go to every instance that is waiting for one.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Callable, Hashable

Key = tuple[Hashable, ...]


@dataclass
class _Listener:
    sock: socket.socket
    """The group's own duplicate of the bound socket (closed when the last instance lets go)."""
    users: int


class ListenerGroup:
    """The addresses that the instances of one run share (one group per ``run_instances`` call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[Key, _Listener] = {}

    def bind(self, key: Key, sock: socket.socket, do_bind: Callable[[], None]) -> socket.socket | None:
        """Bind for one instance: a duplicate of the socket a sibling bound at ``key``, or ``None`` after
        ``do_bind()`` bound ``sock`` itself (which the siblings then share).  Each instance that got a
        socket here calls :meth:`release` once when it closes it."""
        with self._lock:
            held = self._listeners.get(key)
            if held is not None:
                held.users += 1
                return held.sock.dup()
            do_bind()  # OSError (ADDRINUSE, ...) propagates: nothing is recorded
            self._listeners[key] = _Listener(sock.dup(), 1)
            return None

    def release(self, key: Key) -> None:
        """One instance closed its socket at ``key``; the address is free once every one has."""
        with self._lock:
            held = self._listeners.get(key)
            if held is None:
                return
            held.users -= 1
            if held.users > 0:
                return
            del self._listeners[key]
        held.sock.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._listeners)


class SharedBinds:
    """One Store's side of a :class:`ListenerGroup`: how often it has bound each address."""

    def __init__(self, group: ListenerGroup) -> None:
        self.group = group
        self._binds: Counter[Key] = Counter()

    def bind(
        self, sockaddr: tuple[Hashable, ...], sock: socket.socket, do_bind: Callable[[], None]
    ) -> tuple[socket.socket | None, Callable[[], None]]:
        """:meth:`ListenerGroup.bind` for this Store's next bind of ``sockaddr`` (the n-th bind of an
        address in one instance meets the n-th in its siblings); also the call that releases it."""
        base: Key = (sock.family, *sockaddr[:2])
        key = (*base, self._binds[base])
        sibling = self.group.bind(key, sock, do_bind)
        self._binds[base] += 1
        return sibling, partial(self.group.release, key)
