"""How many sockets guests may hold: the per-guest and per-process caps, and descriptors kept for the host.

Every socket a guest gets (``sock_open``, ``sock_accept``) is checked here.  Beyond
``max_sockets_per_store`` the guest gets errno 33 ``MFILE`` (what WasmEdge gives for the host's
``EMFILE``), beyond ``max_sockets_total`` (all guests of the process) errno 41 ``NFILE``.  The
descriptor reserve: Linux gives a new socket the lowest free descriptor number, so a socket numbered
at or above ``RLIMIT_NOFILE - reserve_fds`` is closed at once and refused (``MFILE``); guests'
sockets therefore only ever hold numbers below that line, and the host keeps the top
``reserve_fds`` for its own files (models, logs, the prompt cache, wasmtime's WASI).  A host that
is out of descriptors anyway (``EMFILE``/``ENFILE`` from the kernel) is answered the same way.
Each cap is logged once per Store, at WARNING, naming the cap and how to raise it.
"""

from __future__ import annotations

import errno as os_errno
import socket
from typing import Callable, NoReturn

from .constants import WasiErrno
from .host_fds import nofile_limit, open_descriptors
from .policy import PER_STORE_OPTION, TOTAL_OPTION, SocketPolicy
from .table import SockError, SocketState, sockets_in_process


def refuse(state: SocketState, cap: str, errno: WasiErrno, message: str) -> NoReturn:
    """Raise ``errno`` for the guest; ``message`` is logged the first time this Store meets ``cap``."""
    first = cap not in state.warned
    state.warned.add(cap)
    raise SockError(errno, message if first else None)


def is_full(state: SocketState, policy: SocketPolicy) -> bool:
    """Whether this Store may not hold another socket (its cap or the process's is reached)."""
    return len(state.entries) >= policy.max_sockets_per_store or sockets_in_process() >= policy.max_sockets_total


def check_room(state: SocketState, policy: SocketPolicy, call: str) -> None:
    """Refuse one more socket for this Store beyond ``max_sockets_per_store`` or, for the process,
    beyond ``max_sockets_total``."""
    held = len(state.entries)
    if held >= policy.max_sockets_per_store:
        refuse(
            state,
            "per_store",
            WasiErrno.MFILE,
            f"refused the guest's {call}: it holds {held} sockets, limit max_sockets_per_store="
            f"{policy.max_sockets_per_store} reached (raise it with SocketPolicy(max_sockets_per_store=...) "
            f"or `wasinn run {PER_STORE_OPTION} N`)",
        )
    total = sockets_in_process()
    if total >= policy.max_sockets_total:
        refuse(
            state,
            "total",
            WasiErrno.NFILE,
            f"refused the guest's {call}: guests hold {total} sockets in this process, limit "
            f"max_sockets_total={policy.max_sockets_total} reached (raise it with "
            f"SocketPolicy(max_sockets_total=...) or `wasinn run {TOTAL_OPTION} N`)",
        )


def check_descriptor(state: SocketState, policy: SocketPolicy, sock: socket.socket, call: str) -> None:
    """Close ``sock`` and refuse it if its descriptor is among the last ``reserve_fds`` below
    ``RLIMIT_NOFILE`` (kept for the host)."""
    limit = nofile_limit()
    fd = sock.fileno()
    if limit is None or fd < limit - policy.reserve_fds:
        return
    sock.close()
    opened = open_descriptors()
    refuse(
        state,
        "reserve",
        WasiErrno.MFILE,
        f"refused the guest's {call}: the process is near its descriptor limit (RLIMIT_NOFILE {limit}, "
        f"{'?' if opened is None else opened} open, {sockets_in_process()} of them guests' sockets) and "
        f"keeps the last {policy.reserve_fds} for the host (raise the limit with `ulimit -n`, or lower "
        f"SocketPolicy(reserve_fds=...))",
    )


def out_of_descriptors(state: SocketState, exc: OSError, call: str) -> None:
    """Refuse (``MFILE``/``NFILE``) when the kernel says the host is out of descriptors; return otherwise."""
    if exc.errno not in (os_errno.EMFILE, os_errno.ENFILE):
        return
    limit = nofile_limit()
    refuse(
        state,
        "host",
        WasiErrno.MFILE if exc.errno == os_errno.EMFILE else WasiErrno.NFILE,
        f"refused the guest's {call}: the host is out of descriptors ({exc.strerror}; RLIMIT_NOFILE "
        f"{'unlimited' if limit is None else limit}, {sockets_in_process()} guests' sockets open)",
    )


def new_socket(state: SocketState, policy: SocketPolicy, make: Callable[[], socket.socket], call: str) -> socket.socket:
    """A new host socket from ``make()`` for this Store, within the caps (SockError otherwise)."""
    check_room(state, policy, call)
    try:
        sock = make()
    except OSError as exc:
        out_of_descriptors(state, exc, call)
        raise
    check_descriptor(state, policy, sock, call)
    return sock
