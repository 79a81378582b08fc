"""WasmEdge's socket extension of ``wasi_snapshot_preview1`` for wasmtime guests.

LlamaEdge's ``llama-api-server`` and other servers built for WasmEdge (Rust ``wasmedge_wasi_socket``,
``tokio_wasi``/``mio_wasi``) import ``sock_open``, ``sock_bind``, ``sock_listen``, a two-argument
``sock_accept`` and friends, and use sockets as ordinary descriptors (``fd_read``, ``fd_write``,
``fd_close``, ``fd_fdstat_*``, ``poll_oneoff``).  wasmtime has none of that, so the host owns the
sockets (:mod:`.table`), implements the calls (:mod:`.sock_calls`, :mod:`.sock_options`,
:mod:`.fd_calls`, :mod:`.poll`) and hands everything else back to wasmtime's WASI
(:mod:`.passthrough`).  :mod:`.linking` puts it on a Linker, only for modules that import it;
:mod:`.policy` says where a guest may listen and connect; :mod:`.shared` lets the instances of one run
listen on one address.
"""

from .linking import COVERED as SOCKET_FUNCTIONS
from .linking import SocketLayer, needs_sockets
from .policy import BIND_OPTION, CONNECT_OPTION, Refused, SocketPolicy
from .shared import ListenerGroup

__all__ = [
    "BIND_OPTION",
    "SOCKET_FUNCTIONS",
    "CONNECT_OPTION",
    "ListenerGroup",
    "Refused",
    "SocketLayer",
    "SocketPolicy",
    "needs_sockets",
]
