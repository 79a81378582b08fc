"""The socket layer on a Linker: which functions, which variant, and the errno for every outcome.

:class:`SocketLayer` redefines, on a Linker that already has wasmtime's WASI, WasmEdge's
``sock_*`` functions and the descriptor functions sockets must share (``fd_read``,
``fd_write``, ``fd_close``, ``fd_fdstat_get``, ``fd_fdstat_set_flags``, ``poll_oneoff``).
For each function with a V1 and a V2 form the variant is chosen by the arity of the module's
import, as WasmEdge does.  Every call:

1. finds the Store's :class:`~wasinn_host.sockets.table.SocketState` and the guest memory;
2. hands a call on a descriptor that is not a socket to wasmtime's own function;
3. runs the socket function, which checks every pointer, length and descriptor;
4. returns 0 or the WASI errno, with one log line for refusals and bad pointers
   (:mod:`.call_errors`; an exception no socket function meant to raise is an errno and one
   ERROR line too).

No exception crosses into wasmtime except a trap (the host stopping the guest, or a trap
raised by wasmtime's own function for a pass-through call).
"""

from __future__ import annotations

import logging
from typing import Callable

import wasmtime

from ..core.config.limits import Limits
from ..guest.native_func import GuestTrap, caller_memory, define_i32_func
from ..guest.store_tables import StoreTable
from . import fd_calls, sock_calls, sock_options
from .call import Call
from .call_errors import errno_for
from .guest_view import GuestView
from .host_fds import prepare_process
from .passthrough import WASI, trampoline_wat
from .policy import SocketPolicy
from .poll import poll_oneoff
from .resolve import sock_getaddrinfo
from .shared import ListenerGroup, SharedBinds
from .table import SocketState
from .wasi_logging import add_logging_to_linker, imports_logging

log = logging.getLogger("wasinn_host")

Impl = Callable[..., int]

VARIANTS: dict[str, dict[int, Impl]] = {
    "sock_open": {3: sock_calls.sock_open},
    "sock_bind": {3: sock_calls.sock_bind},
    "sock_listen": {2: sock_calls.sock_listen},
    "sock_accept": {2: sock_calls.sock_accept_v1, 3: sock_calls.sock_accept_v2},
    "sock_connect": {3: sock_calls.sock_connect},
    "sock_recv": {6: sock_calls.sock_recv},
    "sock_send": {5: sock_calls.sock_send},
    "sock_recv_from": {7: sock_calls.sock_recv_from_v1, 8: sock_calls.sock_recv_from_v2},
    "sock_send_to": {7: sock_calls.sock_send_to},
    "sock_shutdown": {2: sock_calls.sock_shutdown},
    "sock_getlocaladdr": {4: sock_calls.sock_getlocaladdr_v1, 3: sock_calls.sock_getlocaladdr_v2},
    "sock_getpeeraddr": {4: sock_calls.sock_getpeeraddr_v1, 3: sock_calls.sock_getpeeraddr_v2},
    "sock_setsockopt": {5: sock_options.sock_setsockopt},
    "sock_getsockopt": {5: sock_options.sock_getsockopt},
    "sock_getaddrinfo": {8: sock_getaddrinfo},
    "fd_read": {4: fd_calls.fd_read},
    "fd_write": {4: fd_calls.fd_write},
    "fd_close": {1: fd_calls.fd_close},
    "fd_fdstat_get": {2: fd_calls.fd_fdstat_get},
    "fd_fdstat_set_flags": {2: fd_calls.fd_fdstat_set_flags},
    "poll_oneoff": {4: poll_oneoff},
}
"""Function name -> {import arity: implementation}; the first arity is the default."""

PASS_THROUGH = frozenset(
    {"fd_read", "fd_write", "fd_close", "fd_fdstat_get", "fd_fdstat_set_flags", "sock_recv", "sock_send"}
    | {"sock_shutdown", "sock_accept"}
)
"""Functions wasmtime also has: a call on a descriptor that is not a socket goes to wasmtime's."""

COVERED = tuple(name for name in VARIANTS if name.startswith("sock_"))


def needs_sockets(module: wasmtime.Module) -> bool:
    """Whether ``module`` imports any ``sock_*`` function of ``wasi_snapshot_preview1`` (WasmEdge's
    socket extension): only such modules get the socket layer."""
    return any(imp.module == WASI and (imp.name or "").startswith("sock_") for imp in module.imports)


class SocketLayer:
    """WasmEdge's socket extension for the guests of one engine, under one :class:`SocketPolicy`."""

    def __init__(self, engine: wasmtime.Engine, policy: SocketPolicy | None = None) -> None:
        self.engine = engine
        self.policy = policy or SocketPolicy()
        self._trampoline: wasmtime.Module | None = None
        self._wasi_linker: wasmtime.Linker | None = None
        self.stores: StoreTable[SocketState] = StoreTable(
            Limits(idle_timeout_ms=0),
            "sockets",
            "a Store not attached with WasiNN.attach() used sockets; they are closed with the Store",
        )

    # -- Stores -------------------------------------------------------------------

    def attach(self, store: wasmtime.Store, listeners: ListenerGroup | None = None) -> None:
        """Give ``store`` its own socket table (closed with the Store or at :meth:`detach`); with
        ``listeners``, the addresses its guest binds are shared with the other Stores of that group
        (the instances of one run, :mod:`.shared`)."""
        self.stores.put(store, SocketState(SharedBinds(listeners) if listeners is not None else None))

    def detach(self, store: wasmtime.Store) -> None:
        """Close ``store``'s sockets now."""
        self.stores.detach(store)

    def cancel_all(self) -> None:
        """Stop every guest using sockets: waits end at once, socket calls answer INTR (the run's stop then
        traps the guest with its own message) and trap after ``table.CANCEL_GRACE`` seconds."""
        for state in self.stores.states():
            state.cancel()

    # -- linking ------------------------------------------------------------------

    def link(self, linker: wasmtime.Linker, module: wasmtime.Module) -> None:
        """What ``module`` needs of this layer on ``linker``: the sockets if it imports any ``sock_*``
        function, ``wasi:logging`` if it imports that; nothing otherwise."""
        if needs_sockets(module):
            self.add_to_linker(linker, module)
        elif imports_logging(module):
            add_logging_to_linker(linker)

    def add_to_linker(self, linker: wasmtime.Linker, module: wasmtime.Module) -> None:
        """Redefine the socket and shared descriptor functions on ``linker`` (which must already have
        wasmtime's WASI) in the variants ``module`` imports; add ``wasi:logging`` if it imports it."""
        arities = {
            imp.name: len(imp.type.params)
            for imp in module.imports
            if imp.module == WASI and isinstance(imp.type, wasmtime.FuncType)
        }
        self._prepare()
        linker.allow_shadowing = True
        try:
            for name, variants in VARIANTS.items():
                arity = arities.get(name, next(iter(variants)))
                impl = variants.get(arity)
                if impl is not None:
                    define_i32_func(linker, WASI, name, arity, self._handler(name, arity, impl))
        finally:
            linker.allow_shadowing = False
        if imports_logging(module):
            add_logging_to_linker(linker)

    def _prepare(self) -> None:
        prepare_process(self.engine)  # before any guest holds sockets: see host_fds
        if self._trampoline is None:
            self._trampoline = wasmtime.Module(self.engine, trampoline_wat())
            self._wasi_linker = wasmtime.Linker(self.engine)
            self._wasi_linker.define_wasi()

    def _state(self, context: int) -> SocketState:
        return self.stores.get(context, SocketState)

    def _handler(self, name: str, arity: int, impl: Impl) -> Callable[..., int]:
        trampoline, wasi_linker = self._trampoline, self._wasi_linker
        assert trampoline is not None and wasi_linker is not None
        pass_through = name in PASS_THROUGH
        v1_accept = name == "sock_accept" and arity == 2

        def handler(caller: int, context: int, *args: int) -> int:
            state = self._state(context)
            memory = state.memory
            if memory is None:
                memory = state.memory = caller_memory(caller)
                if memory is None:
                    raise GuestTrap(f"{WASI}.{name}: the calling module exports no memory")
            call = Call(
                state, GuestView(*memory.base_and_size(context), name), self.policy, caller, trampoline, wasi_linker
            )
            try:
                if pass_through and args[0] not in state.entries:
                    return call.passthrough(name, *((args[0], 0, args[1]) if v1_accept else args))
                state.check_cancelled()
                return impl(call, *args)
            except GuestTrap:
                raise
            except Exception as exc:  # an errno and at most one log line, never a trap: see call_errors
                return errno_for(name, args, exc)

        return handler
