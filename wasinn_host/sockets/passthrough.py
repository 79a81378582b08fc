"""Calls on descriptors that are not sockets go on to wasmtime's own WASI.

The socket layer redefines ``fd_read``, ``fd_write``, ``fd_close``, ``fd_fdstat_get``,
``fd_fdstat_set_flags``, ``poll_oneoff`` and the preview 1 ``sock_*`` functions, and must
hand calls on wasmtime's descriptors (stdio, files) back to the original functions.  A
WASI ``Func`` cannot be called from a Python host function directly (wasmtime's WASI reads
the *caller's* ``memory`` export, and a host caller has none), so each Store gets a tiny
trampoline instance: it imports the guest's memory and the original functions, exports the
memory as ``memory`` and one wrapper per function.  It is made on the first pass-through
call, from inside that call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import wasmtime
from wasmtime import _ffi as ffi

from ..guest.native_func import GuestTrap
from ..guest.wasm_errors import first_line

WASI = "wasi_snapshot_preview1"
I32_FUNCS: dict[str, int] = {
    "fd_read": 4,
    "fd_write": 4,
    "fd_close": 1,
    "fd_fdstat_get": 2,
    "fd_fdstat_set_flags": 2,
    "poll_oneoff": 4,
    "sock_accept": 3,
    "sock_recv": 6,
    "sock_send": 5,
    "sock_shutdown": 2,
}
"""The original WASI functions (``name -> i32 parameter count``) the trampoline wraps."""


def reexport_wat(imports_from: str, funcs: Mapping[str, int], memory_pages: int | None) -> str:
    """A module that imports each of ``funcs`` (``name -> i32 parameter count``, all returning i32) and
    ``clock_time_get`` from ``imports_from`` and exports a wrapper of the same name calling it with its own
    arguments.  Its memory, exported as ``memory``, is its own of ``memory_pages`` pages, or with None the
    first import, ``env.memory`` (imports are given to wasmtime in order)."""
    lines = ["(module"]
    if memory_pages is None:
        lines += ['  (import "env" "memory" (memory 0))', '  (export "memory" (memory 0))']
    for name, arity in funcs.items():
        lines.append(f'  (import "{imports_from}" "{name}" (func ${name} (param{" i32" * arity}) (result i32)))')
    lines.append(
        f'  (import "{imports_from}" "clock_time_get" (func $clock_time_get (param i32 i64 i32) (result i32)))'
    )
    if memory_pages is not None:
        lines.append(f'  (memory (export "memory") {memory_pages})')
    for name, arity in funcs.items():
        gets = " ".join(f"local.get {i}" for i in range(arity))
        lines.append(f'  (func (export "{name}") (param{" i32" * arity}) (result i32) {gets} call ${name})')
    lines.append(
        '  (func (export "clock_time_get") (param i32 i64 i32) (result i32)'
        " local.get 0 local.get 1 local.get 2 call $clock_time_get)"
    )
    lines.append(")")
    return "\n".join(lines)


def trampoline_wat() -> str:
    """The trampoline module's text: the guest's memory and the wrapped functions, plus ``clock_time_get``."""
    return reexport_wat("wasi", I32_FUNCS, None)


class PassThrough:
    """One Store's trampoline instance: ``call(caller, name, *args)`` runs wasmtime's own function."""

    def __init__(self, caller: wasmtime.Caller, module: wasmtime.Module, wasi_linker: wasmtime.Linker) -> None:
        memory = caller.get("memory")
        if not isinstance(memory, wasmtime.Memory):
            raise GuestTrap(f"{WASI}: the calling module exports no memory")
        imports: list[wasmtime.Memory | wasmtime.Func] = [memory]
        for name in [*I32_FUNCS, "clock_time_get"]:
            original = wasi_linker.get(caller, WASI, name)
            if not isinstance(original, wasmtime.Func):
                raise GuestTrap(f"{WASI}.{name}: wasmtime's WASI does not define it")
            imports.append(original)
        instance = wasmtime.Instance(caller, module, imports)
        exports = instance.exports(caller)
        self._funcs: dict[str, wasmtime.Func] = {}
        for name in [*I32_FUNCS, "clock_time_get"]:
            func = exports[name]
            assert isinstance(func, wasmtime.Func)
            self._funcs[name] = func

    def call(self, caller: wasmtime.Caller, name: str, *args: int) -> int:
        """Run wasmtime's ``name`` as if the guest had called it; a trap in it traps the guest."""
        try:
            result = self._funcs[name](caller, *args)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise GuestTrap(first_line(exc)) from None
        assert isinstance(result, int)
        return result


def caller_object(caller: int) -> wasmtime.Caller:
    """A wasmtime-py ``Caller`` for a raw ``wasmtime_caller_t`` pointer (valid during the host call)."""
    return wasmtime.Caller(ctypes.cast(caller, ctypes.POINTER(ffi.wasmtime_caller_t)))
