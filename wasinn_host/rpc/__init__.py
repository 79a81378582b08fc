"""WASI-NN over gRPC: WasmEdge's protocol served by ``wasinn serve`` and spoken by a remote backend.

``server.py`` serves the registry and engine of this process to many clients (WasmEdge's
services plus this host's own ``wasinn_host.rpc.v1.Host``); ``client.py`` is a backend that
forwards every call to one or more servers, so a guest cannot tell a remote model from a
local one.

Importing this package turns gRPC's fork handlers off (``GRPC_ENABLE_FORK_SUPPORT=0``) unless
the environment sets that variable: see :data:`FORK_SUPPORT_VARIABLE`.
"""

from __future__ import annotations

import os

FORK_SUPPORT_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"
"""gRPC's switch for its ``pthread_atfork`` handlers: ``0`` from here on, unless the environment set it.

grpcio's C core has them on unless the variable says otherwise (its Python layer calls fork support
off, but only for its own objects), and reads the variable once, when grpc is first imported: every
module of this package that imports grpc comes after this.  On, every ``fork()`` of a process that
has used gRPC (``subprocess`` with a ``preexec_fn``, ``os.fork``, multiprocessing's fork) restarts
gRPC's poller threads in the child, between the fork and the ``exec``; the child then closes every
descriptor it does not pass on (``close_fds``), the poller's epoll descriptor among them, and a
poller thread that reaches ``epoll_wait`` before the ``exec`` gets ``EBADF``, which gRPC treats as
fatal: the child aborts (SIGABRT, after the line ``Epoll1Poller ... encountered epoll_wait error: Bad
file descriptor``) before it runs its program (18 of 500 such children of a process serving and
calling over gRPC, on 2 cores).  Off, a forked child has no gRPC thread at all.  The host never uses
gRPC in a forked child (its child processes ``exec`` at once); a program that does needs the
variable at ``1`` (unset, such a child's calls fail with UNAVAILABLE; at ``0`` they hang) and sets it
before it imports this package or grpc.
"""

os.environ.setdefault(FORK_SUPPORT_VARIABLE, "0")
